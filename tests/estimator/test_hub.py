"""The oracle hub's identity rule (issue 25): a stream may claim only its own clients.

Unit level: a claim for a client bound to another identity is refused, a stream that attached before the
binding arrived is never routed that client's tasks, unbound clients keep "the latest stream wins". Wire
level: the aggregator's owners travel in StartOffline, and a second identity's Oracle stream claiming
another's client gets PERMISSION_DENIED.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from estimator.hub import ClaimRefused, OracleHub
from estimator.service import create_estimator_service
from estimator.settings import EstimatorSettings
from fedent.strategies.options import FedEntOptions
from fedentrpc import codec, mappers
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc

pytestmark = pytest.mark.timeout(60)


def _hello(cids: list[int], run_id: str = "run") -> est_pb.OracleHello:
    return est_pb.OracleHello(worker_id=f"w{cids}", run_id=run_id, client_ids=cids)


def test_a_claim_for_another_identitys_client_is_refused() -> None:
    hub = OracleHub()
    hub.bind_owners("run", {0: "worker-0", 1: "worker-0"})
    with pytest.raises(ClaimRefused, match=r"client\(s\) \[0\] are bound to another worker identity, not worker-1"):
        hub.attach(_hello([0, 2]), "worker-1")
    with pytest.raises(ClaimRefused, match="unauthenticated"):
        hub.attach(_hello([1]), None)
    with pytest.raises(ClaimRefused):  # a hello without a run id matches every run's binding
        hub.attach(_hello([1], run_id=""), "worker-1")
    own = hub.attach(_hello([0, 1]), "worker-0")
    other = hub.attach(_hello([2]), "worker-1")  # unbound clients: anyone, as before
    assert hub.connections == [own, other] and own.identity == "worker-0"


def test_a_stream_attached_before_the_binding_never_gets_anothers_tasks() -> None:
    hub = OracleHub()
    honest = hub.attach(_hello([0, 1]), "worker-0")
    thief = hub.attach(_hello([0, 1, 2]), "worker-1")  # later, so it used to win every client
    assert hub.host_of(0, "run") is thief  # today's rule while nothing is bound
    hub.bind_owners("run", {0: "worker-0", 1: "worker-0"})
    assert hub.host_of(0, "run") is honest and hub.host_of(1, "run") is honest
    assert hub.host_of(2, "run") is thief  # an unbound client keeps the latest stream
    hub.submit(hub.host_of(0, "run"), [0, 1], "blob", 0, 0, 1, 4)  # type: ignore[arg-type]
    task = honest.outbox.get_nowait()
    assert task is not None and task.client_ids == [0, 1]
    with pytest.raises(queue.Empty):
        thief.outbox.get_nowait()
    hub.detach(honest)
    assert hub.host_of(0, "run") is None and hub.wait_hosts([0], "run", 0.05) == [0]  # no fallback to the thief


def test_the_owners_travel_with_the_job_and_a_foreign_stream_is_denied(tmp_path: Path) -> None:
    from fedentrpc.security.flags import ClientSecurity, ServerSecurity
    from fedentrpc.security.tls import open_channel
    from fedentrpc.security.tokens import read_worker_token
    from server.certs import make_dev_pki

    pki = make_dev_pki(tmp_path, hosts=["localhost"], workers=["worker-0", "worker-1"])
    sec = ServerSecurity(cert=pki.server_cert, key=pki.server_key, ca=pki.ca_cert,
                         token_file=pki.tokens_file).validate()
    h = create_estimator_service(EstimatorSettings(port=0, security=sec, wait_workers_s=0.1))

    def creds(worker: str) -> ClientSecurity:
        return ClientSecurity(ca=pki.ca_cert, token=read_worker_token(pki.token_files[worker]))

    try:
        with open_channel(f"localhost:{h.port}", creds("worker-0")) as ch:
            stub = est_grpc.EstimatorServiceStub(ch)
            ref = stub.PutBlob(codec.stream_tensors({"params": [torch.zeros(3)]}, est_pb.PutBlobRequest), timeout=10)
            req = mappers.start_offline_request("run", FedEntOptions(max_sweeps=1), init_blob=ref.blob_id,
                                                sizes=[5, 5], rounds=1, seed=0, batch_size=2, base_lr=0.1,
                                                owners={0: "worker-0"})
            assert [c.owner for c in req.clients] == ["worker-0", ""]
            stub.StartOffline(req, timeout=10)
        with open_channel(f"localhost:{h.port}", creds("worker-1")) as ch:
            hello = est_pb.OracleRequest(hello=_hello([0, 1]))

            def once() -> Iterator[est_pb.OracleRequest]:
                yield hello

            with pytest.raises(grpc.RpcError) as ei:
                list(est_grpc.EstimatorServiceStub(ch).Oracle(once(), timeout=10))
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert ei.value.details() == ("Oracle: client(s) [0] are bound to another worker identity, not worker-1")
        assert h.hub.connections == []  # the refused stream never joined the hub
    finally:
        h.stop(0.5)
