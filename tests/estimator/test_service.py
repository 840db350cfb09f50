"""The estimator calculator service over real gRPC (in-process server on port 0).

Online: SolveOnline equals fedent.meanfield's direct solve; bad input -> INVALID_ARGUMENT and the server
keeps answering. Offline: Algorithm 1 with gradients from fake workers on Oracle streams equals the
in-process solve_fixed_point; a lost answer is retried after its deadline; a failing worker fails the
job with a clear message. Health says SERVING and reflection lists the service.
"""

from __future__ import annotations

import json
import math
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from conftest import tiny_inputs
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from estimator.service import SERVICE_NAME, EstimatorHandle, create_estimator_server, create_estimator_service
from estimator.settings import EstimatorSettings, SettingsError
from fedent.meanfield.estimator import OnlinePhi2Estimator
from fedent.meanfield.fixed_point import solve_fixed_point
from fedent.meanfield.oracle import TrainerOracle
from fedent.strategies.options import FedEntOptions
from fedent.trainer import LocalTrainer
from fedentrpc import codec, mappers
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc
from fedentrpc.v1 import tensor_pb2 as tpb
from server.estimator_adapter import RemotePhi2Estimator

DONE, FAILED = est_pb.OFFLINE_JOB_STATE_DONE, est_pb.OFFLINE_JOB_STATE_FAILED

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def service() -> Iterator[EstimatorHandle]:
    h = create_estimator_service(EstimatorSettings(port=0, oracle_timeout_s=5.0, oracle_retries=1,
                                                   wait_workers_s=5.0))
    yield h
    h.stop(0.5)


@pytest.fixture
def stub(service: EstimatorHandle) -> Iterator[est_grpc.EstimatorServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
        yield est_grpc.EstimatorServiceStub(ch)


def _first_reading(beta: float = 0.9, variant: str = "exact", **more: Any) -> FedEntOptions:
    """FedEntOptions for OnlinePhi2Estimator(beta, variant)'s defaults: η* uncapped, the mean field at η*."""
    return FedEntOptions(**{"beta": beta, "variant": variant, "eta_max": None, "phi2_rate": "star", **more})


def _online(rnd: int, opts: FedEntOptions, c: float, thetas: list[float], a: list[float], b: list[float],
            **more: Any) -> est_pb.SolveOnlineRequest:
    return mappers.solve_online_request("run", rnd, opts, c=c, thetas=thetas, a=a, b=b, **more)


def _round_scalars(seed: int, n: int = 6) -> tuple[float, list[float], list[float], list[float]]:
    """(c, θ, a, b) from real vectors, so the inputs are consistent (Cauchy-Schwarz holds)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(50, generator=g, dtype=torch.float64)
    grads = [torch.randn(50, generator=g, dtype=torch.float64) * 0.3 + 0.05 * w for _ in range(n)]
    sizes = torch.randint(5, 50, (n,), generator=g).double()
    thetas = (sizes / sizes.sum()).tolist()
    return float(w @ w), thetas, [float(w @ gi) for gi in grads], [float(gi @ gi) for gi in grads]


# ---- online ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["exact", "paper"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_online_solve_matches_the_core(stub: est_grpc.EstimatorServiceStub, variant: str, seed: int) -> None:
    c, thetas, a, b = _round_scalars(seed)
    req = _online(3, _first_reading(0.9, variant), c, thetas, a, b)
    reply = stub.SolveOnline(req, timeout=10)
    direct = OnlinePhi2Estimator(0.9, variant).estimate(3, c, thetas, a, b)
    assert reply.phi2_next == direct.phi2_next
    assert reply.iterations == direct.report["iterations"]
    report = mappers.struct_to_dict(reply.report)
    assert report == json.loads(json.dumps(direct.report))
    from fedent.meanfield.scalar_fixed_point import solve_online

    sol = solve_online(c, thetas, a, b, 0.9, variant)
    assert reply.phi2_next == sol.phi2_next and reply.converged


@pytest.mark.parametrize("eta_max", [1.0, None])
def test_online_used_rate_matches_the_core(stub: est_grpc.EstimatorServiceStub, eta_max: float | None) -> None:
    """Spec §5 on the wire: γ, eta_max, phi2_rate and each client's η_i(t−1) reach the solver; the service's φ2'
    is the in-process estimator's, bit for bit."""
    c, thetas, a, b = _round_scalars(5)
    prev = [0.01 * (i + 1) for i in range(len(a))]
    cids = [10 + 3 * i for i in range(len(a))]
    opts = FedEntOptions(beta=0.9, gamma=0.9, variant="exact", eta_max=eta_max, phi2_rate="used")
    req = _online(2, opts, c, thetas, a, b, eta_prev=prev, cids=cids)
    reply = stub.SolveOnline(req, timeout=10)
    direct = OnlinePhi2Estimator(0.9, "exact", eta_max=eta_max, phi2_rate="used", gamma=0.9).estimate(
        2, c, thetas, a, b, eta_prev=prev)
    assert reply.phi2_next == direct.phi2_next
    star = OnlinePhi2Estimator(0.9, "exact", eta_max=eta_max, phi2_rate="star").estimate(2, c, thetas, a, b)
    assert reply.phi2_next != star.phi2_next  # the rate matters, so the test can fail
    assert sorted(x.cid for x in req.clients) == cids
    missing = est_pb.SolveOnlineRequest()
    missing.CopyFrom(req)
    missing.clients[1].ClearField("eta_prev")
    with pytest.raises(grpc.RpcError) as e:
        stub.SolveOnline(missing, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "eta_prev" in (e.value.details() or "")


def test_remote_adapter_carries_the_options(service: EstimatorHandle) -> None:
    from fedent.strategies.options import FedEntOptions

    c, thetas, a, b = _round_scalars(8)
    opts = FedEntOptions(beta=0.95, gamma=0.8)
    remote = RemotePhi2Estimator(f"127.0.0.1:{service.port}", opts, timeout_s=10)
    prev = [0.02] * len(a)
    try:
        got = remote.estimate(0, c, thetas, a, b, cids=list(range(len(a))), eta_prev=prev)
    finally:
        remote.close()
    want = OnlinePhi2Estimator(0.95, eta_max=1.0, phi2_rate="used", gamma=0.8).estimate(0, c, thetas, a, b,
                                                                                       eta_prev=prev)
    assert got.phi2_next == want.phi2_next


def test_remote_adapter_equals_in_process_estimator(service: EstimatorHandle) -> None:
    c, thetas, a, b = _round_scalars(7)
    remote = RemotePhi2Estimator(f"127.0.0.1:{service.port}", _first_reading(0.95), timeout_s=10)
    try:
        got = remote.estimate(0, c, thetas, a, b)
    finally:
        remote.close()
    want = OnlinePhi2Estimator(0.95).estimate(0, c, thetas, a, b)
    assert got.phi2_next == want.phi2_next and got.report["mode"] == "online"


def test_online_theta_from_sample_counts(stub: est_grpc.EstimatorServiceStub) -> None:
    c, _, a, b = _round_scalars(3, n=3)
    sizes = [10, 30, 60]
    req = est_pb.SolveOnlineRequest(c=c, params=mappers.fedent_options_to_msg(_first_reading()),
                                    clients=[
        est_pb.ClientScalars(cid=i, a=a[i], b=b[i], num_samples=sizes[i]) for i in range(3)])
    want = OnlinePhi2Estimator(0.9).estimate(0, c, [0.1, 0.3, 0.6], a, b)
    assert stub.SolveOnline(req, timeout=10).phi2_next == pytest.approx(want.phi2_next, rel=1e-12)


def _bad(req: est_pb.SolveOnlineRequest, **changes: float) -> est_pb.SolveOnlineRequest:
    out = est_pb.SolveOnlineRequest()
    out.CopyFrom(req)
    for k, v in changes.items():
        setattr(out.clients[0], k, v)
    return out


def test_bad_online_input_is_invalid_argument_and_the_server_keeps_serving(stub: est_grpc.EstimatorServiceStub) -> None:
    c, thetas, a, b = _round_scalars(4)
    good = _online(0, _first_reading(), c, thetas, a, b)
    dup = est_pb.SolveOnlineRequest()
    dup.CopyFrom(good)
    dup.clients[1].cid = dup.clients[0].cid
    no_clients = est_pb.SolveOnlineRequest(c=1.0, params=mappers.fedent_options_to_msg(_first_reading()))
    bad_beta = est_pb.SolveOnlineRequest()
    bad_beta.CopyFrom(good)
    bad_beta.params.beta = 1.5
    bad_variant = est_pb.SolveOnlineRequest()
    bad_variant.CopyFrom(good)
    bad_variant.params.variant = 99  # type: ignore[assignment]  # a value these protos do not know
    no_variant = est_pb.SolveOnlineRequest()
    no_variant.CopyFrom(good)
    no_variant.params.ClearField("variant")
    nan_c = est_pb.SolveOnlineRequest()
    nan_c.CopyFrom(good)
    nan_c.c = math.nan
    cases = {
        "a of client 0 is not finite": _bad(good, a=math.nan),
        "b of client 0 is not finite": _bad(good, b=math.inf),
        "b = ‖g‖² must be >= 0": _bad(good, b=-1.0),
        "thetas must sum to 1": _bad(good, theta=0.9),
        "theta must be >= 0": _bad(good, theta=-0.01),
        "duplicate client ids": dup,
        "no clients": no_clients,
        "params.beta: must be in (0, 1), got 1.5": bad_beta,
        "params.variant: value 99 is not allowed; send one of FEDENT_VARIANT_EXACT, FEDENT_VARIANT_PAPER": bad_variant,
        "params.variant: FEDENT_VARIANT_UNSPECIFIED is not allowed": no_variant,
        "c is not finite": nan_c,
    }
    for needle, req in cases.items():
        with pytest.raises(grpc.RpcError) as ei:
            stub.SolveOnline(req, timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, needle
        assert needle in ei.value.details() and "\n" not in ei.value.details()
        assert stub.SolveOnline(good, timeout=10).phi2_next > 0  # still serving


def test_mismatched_lengths_are_rejected_before_the_wire() -> None:
    with pytest.raises(codec.WireError, match="one entry per participant"):
        mappers.solve_online_request("r", 0, _first_reading(), c=1.0, thetas=[0.5, 0.5], a=[0.1], b=[0.2, 0.3])


# ---- health, reflection, blobs --------------------------------------------------------------------


def test_health_serving_and_reflection_lists_the_service(service: EstimatorHandle) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{service.port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", SERVICE_NAME):
            r = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=5))
        names = {s.name for s in replies[0].list_services_response.service}
    assert SERVICE_NAME == "fedentrpc.v1.EstimatorService"
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_create_estimator_server_returns_a_started_server_and_its_port() -> None:
    server, port = create_estimator_server(EstimatorSettings(port=0))
    try:
        assert port > 0
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(0)


def test_settings_are_validated() -> None:
    for bad in ({"port": -1}, {"max_workers": 1}, {"oracle_timeout_s": 0}, {"oracle_retries": -1},
                {"oracle_prefetch": 0}, {"host": ""}):
        with pytest.raises(SettingsError):
            EstimatorSettings(**bad)  # type: ignore[arg-type]


def test_blob_round_trip_and_errors(stub: est_grpc.EstimatorServiceStub) -> None:
    tensors = [torch.randn(3, 4), torch.arange(5)]
    ref = stub.PutBlob(codec.stream_tensors({"params": tensors}, est_pb.PutBlobRequest,
                                            codec.TransferSpec(chunk_bytes=16)), timeout=10)
    for _ in range(2):  # the second fetch streams the messages the first one built
        back = codec.decode_tensors(stub.FetchBlob(est_pb.EstimatorServiceFetchBlobRequest(blob_id=ref.blob_id),
                                                   timeout=10))
        assert all(torch.equal(x, y) for x, y in zip(back["params"], tensors, strict=True))
    chunks = list(codec.stream_tensors({"params": tensors}, est_pb.PutBlobRequest,
                                       codec.TransferSpec(chunk_bytes=16)))
    chunks[1] = est_pb.PutBlobRequest(chunk=tpb.TensorChunk(index=1, data=b"\xff" * len(chunks[1].chunk.data)))
    with pytest.raises(grpc.RpcError) as ei:
        stub.PutBlob(iter(chunks), timeout=10)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "checksum" in ei.value.details()
    with pytest.raises(grpc.RpcError) as ei:
        list(stub.FetchBlob(est_pb.EstimatorServiceFetchBlobRequest(blob_id="nope"), timeout=10))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


# ---- offline: Algorithm 1 over Oracle streams -----------------------------------------------------


class FakeWorker:
    """A dial-out worker answering gradient requests from a LocalTrainer over its clients.

    ``ignore`` requests are silently dropped (a hung worker); ``fail`` answers every request with errors.
    """

    def __init__(self, address: str, cids: list[int], run_id: str = "run", ignore: int = 0, fail: bool = False,
                 seed: int = 1, batch_size: int = 4) -> None:
        inputs = tiny_inputs()
        self.trainer = LocalTrainer(inputs.make_model(), inputs.data.x_train, inputs.data.y_train, batch_size,
                                    torch.device("cpu"))
        self.indices = {c: torch.from_numpy(np.asarray(inputs.client_indices[c])) for c in cids}
        self.cids, self.run_id, self.ignore, self.fail, self.seed = cids, run_id, ignore, fail, seed
        self.channel = grpc.insecure_channel(address)
        self.stub = est_grpc.EstimatorServiceStub(self.channel)
        self.outbox: queue.Queue[est_pb.OracleRequest | bytes | None] = queue.Queue()
        self.requests = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _out(self) -> Iterator[est_pb.OracleRequest | bytes]:
        yield est_pb.OracleRequest(hello=est_pb.OracleHello(worker_id=f"fake-{self.cids}", run_id=self.run_id,
                                                            client_ids=self.cids))
        while (m := self.outbox.get()) is not None:
            yield m

    def _loop(self) -> None:
        try:
            for resp in self.stub.Oracle(self._out()):
                req = resp.task
                self.requests += 1
                if self.requests <= self.ignore:
                    continue
                if self.fail:
                    for cid in req.client_ids:
                        self.outbox.put(est_pb.OracleRequest(error=est_pb.OracleError(
                            request_id=req.request_id, cid=cid, message="out of memory")))
                    continue
                point = codec.decode_tensors(self.stub.FetchBlob(
                    est_pb.EstimatorServiceFetchBlobRequest(blob_id=req.point_blob)))
                oracle = TrainerOracle(self.trainer, self.indices, req.seed, req.batch_size or None)
                for cid in req.client_ids:
                    g = oracle.gradient(req.t, cid, point["params"])
                    for m in mappers.oracle_result_messages(req.request_id, cid, 12, g,
                                                            codec.TransferSpec(chunk_bytes=64)):
                        self.outbox.put(m)
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self.outbox.put(None)
        self.channel.close()


def _start_offline(stub: est_grpc.EstimatorServiceStub, rounds: int = 3, wait_s: float = 5.0,
                   sizes: tuple[int, ...] = (12, 12, 12, 12), **revised: Any,
                   ) -> tuple[est_pb.OfflineJob, list[torch.Tensor]]:
    w0 = [p.detach().clone() for p in tiny_inputs().make_model().parameters()]
    ref = stub.PutBlob(codec.stream_tensors({"params": w0}, est_pb.PutBlobRequest), timeout=10)
    in_options = {k: revised.pop(k) for k in ("eta_max", "phi2_rate") if k in revised}
    opts = _first_reading(0.9, gamma=0.9, eps1=1e-6, eps2=1e-6, max_sweeps=4, **in_options)
    req = mappers.start_offline_request("run", opts, init_blob=ref.blob_id, sizes=list(sizes), rounds=rounds, seed=1,
                                        batch_size=4, base_lr=revised.pop("base_lr", 0.0), **revised)
    req.wait_workers_s = wait_s
    job = stub.StartOffline(req, timeout=10).job
    while not mappers.job_finished(job):
        job = stub.GetOffline(est_pb.GetOfflineRequest(job_id=job.job_id, wait_s=5), timeout=30).job
    return job, w0


def _direct(w0: list[torch.Tensor], rounds: int = 3, **revised: Any) -> np.ndarray:
    inputs = tiny_inputs()
    trainer = LocalTrainer(inputs.make_model(), inputs.data.x_train, inputs.data.y_train, 4, torch.device("cpu"))
    idx = {c: torch.from_numpy(np.asarray(inputs.client_indices[c])) for c in range(4)}
    res = solve_fixed_point(TrainerOracle(trainer, idx, 1, 4), w0, [0, 1, 2, 3], [0.25] * 4, rounds, 0.9,
                            "exact", 1e-6, 1e-6, 4, **revised)
    return res.phi2


def test_offline_with_the_schedule_and_used_rates_equals_in_process(service: EstimatorHandle,
                                                                    stub: est_grpc.EstimatorServiceStub) -> None:
    """Spec §5 on the service: Algorithm 1 simulates each round's sampled clients with the decayed rates."""
    workers = [FakeWorker(f"127.0.0.1:{service.port}", [0, 1]), FakeWorker(f"127.0.0.1:{service.port}", [2, 3])]
    schedule = [[0, 2], [1, 3], [0, 3]]
    revised = {"eta_max": 1.0, "phi2_rate": "used", "schedule": schedule, "base_lr": 0.05}
    try:
        job, w0 = _start_offline(stub, **revised)
    finally:
        for w in workers:
            w.close()
    assert job.state == DONE, job.message
    assert list(job.phi2) == _direct(w0, gamma=0.9, **revised).tolist()  # the request's γ
    assert list(job.phi2) != _direct(w0).tolist()  # the schedule and rates change the trajectory
    report = mappers.struct_to_dict(job.report)
    assert report["gradient_evaluations"] == job.sweep * 6 and report["offline_clients"] == "participants"


def test_offline_over_oracle_streams_equals_in_process_algorithm_1(service: EstimatorHandle,
                                                                   stub: est_grpc.EstimatorServiceStub) -> None:
    workers = [FakeWorker(f"127.0.0.1:{service.port}", [0, 1]), FakeWorker(f"127.0.0.1:{service.port}", [2, 3])]
    try:
        job, w0 = _start_offline(stub)
    finally:
        for w in workers:
            w.close()
    assert job.state == DONE, job.message
    assert list(job.phi2) == _direct(w0).tolist()  # exact: same batches, float32 travels natively
    report = mappers.struct_to_dict(job.report)
    assert report["sweeps"] == job.sweep >= 1 and report["gradient_evaluations"] == job.sweep * 3 * 4
    assert job.stop_reason in (est_pb.OFFLINE_STOP_REASON_CONVERGED, est_pb.OFFLINE_STOP_REASON_MAX_SWEEPS)
    est = mappers.offline_estimator_from_job(job)
    assert est.horizon == 3
    assert len(service.blobs) == 1  # the points were dropped; only the uploaded w(0) is left


def test_a_lost_answer_is_retried_after_its_deadline() -> None:
    h = create_estimator_service(EstimatorSettings(port=0, oracle_timeout_s=0.5, oracle_retries=2))
    worker = FakeWorker(f"127.0.0.1:{h.port}", [0, 1, 2, 3], ignore=1)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{h.port}") as ch:
            job, w0 = _start_offline(est_grpc.EstimatorServiceStub(ch), rounds=2)
    finally:
        worker.close()
        h.stop(0.5)
    assert job.state == DONE, job.message
    assert mappers.struct_to_dict(job.report)["oracle_retries"] >= 1
    assert list(job.phi2) == _direct(w0, rounds=2).tolist()


def test_a_failing_worker_fails_the_job_with_a_clear_message(service: EstimatorHandle,
                                                             stub: est_grpc.EstimatorServiceStub) -> None:
    worker = FakeWorker(f"127.0.0.1:{service.port}", [0, 1, 2, 3], fail=True)
    try:
        job, _ = _start_offline(stub)
    finally:
        worker.close()
    assert job.state == FAILED
    assert "client 0" in job.message and "out of memory" in job.message and "2 attempt(s)" in job.message


def test_missing_workers_fail_the_job_after_the_wait(stub: est_grpc.EstimatorServiceStub) -> None:
    job, _ = _start_offline(stub, wait_s=0.2)
    assert job.state == FAILED and "no worker opened an oracle stream for client(s) 0, 1, 2, 3" in job.message


def test_bad_offline_requests(stub: est_grpc.EstimatorServiceStub) -> None:
    w0 = [torch.zeros(2)]
    ref = stub.PutBlob(codec.stream_tensors({"params": w0}, est_pb.PutBlobRequest), timeout=10)
    opts = _first_reading(0.9, gamma=0.9, max_sweeps=2)

    def start(blob: str, sizes: list[int], rounds: int) -> est_pb.StartOfflineRequest:
        return mappers.start_offline_request("r", opts, init_blob=blob, sizes=sizes, rounds=rounds, seed=0,
                                             batch_size=0, base_lr=0.0)

    bad_beta = start(ref.blob_id, [1], 2)
    bad_beta.params.beta = 1.0
    no_sweeps = start(ref.blob_id, [1], 2)
    no_sweeps.params.max_sweeps = 0
    cases = {
        "unknown blob": (start("missing", [1], 2), grpc.StatusCode.NOT_FOUND),
        "rounds must be >= 1": (start(ref.blob_id, [1], 0), grpc.StatusCode.INVALID_ARGUMENT),
        "the clients hold no samples": (start(ref.blob_id, [0, 0], 2), grpc.StatusCode.INVALID_ARGUMENT),
        "params.beta: must be in (0, 1)": (bad_beta, grpc.StatusCode.INVALID_ARGUMENT),
        "params.max_sweeps: must be >= 1, got 0": (no_sweeps, grpc.StatusCode.INVALID_ARGUMENT),
    }
    for needle, (req, code) in cases.items():
        with pytest.raises(grpc.RpcError) as ei:
            stub.StartOffline(req, timeout=10)
        assert ei.value.code() == code and needle in ei.value.details(), needle
    with pytest.raises(grpc.RpcError) as ei:
        stub.GetOffline(est_pb.GetOfflineRequest(job_id="job-x"), timeout=10)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND


def test_oracle_stream_must_start_with_hello(stub: est_grpc.EstimatorServiceStub) -> None:
    msgs = iter([est_pb.OracleRequest(error=est_pb.OracleError(request_id=1, cid=0, message="x"))])
    with pytest.raises(grpc.RpcError) as ei:
        list(stub.Oracle(msgs, timeout=10))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "OracleHello" in ei.value.details()


def test_tls_and_tokens_protect_the_service_but_not_health(tmp_path: Path) -> None:
    from fedentrpc.security.flags import ClientSecurity, ServerSecurity
    from fedentrpc.security.tls import open_channel
    from fedentrpc.security.tokens import read_worker_token
    from server.certs import make_dev_pki

    pki = make_dev_pki(tmp_path, hosts=["localhost", "127.0.0.1"], workers=["worker-0"])
    sec = ServerSecurity(cert=pki.server_cert, key=pki.server_key, ca=pki.ca_cert,
                         token_file=pki.tokens_file).validate()
    h = create_estimator_service(EstimatorSettings(port=0, security=sec))
    c, thetas, a, b = _round_scalars(5)
    req = _online(0, _first_reading(), c, thetas, a, b)
    try:
        token = read_worker_token(pki.token_files["worker-0"])
        with open_channel(f"localhost:{h.port}", ClientSecurity(ca=pki.ca_cert, token=token)) as ch:
            assert est_grpc.EstimatorServiceStub(ch).SolveOnline(req, timeout=10).phi2_next > 0
        with open_channel(f"localhost:{h.port}", ClientSecurity(ca=pki.ca_cert)) as ch:
            with pytest.raises(grpc.RpcError) as ei:
                est_grpc.EstimatorServiceStub(ch).SolveOnline(req, timeout=10)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        from server import healthcheck  # the containers' probe speaks TLS too

        assert healthcheck.check(f"localhost:{h.port}", tls_ca=pki.ca_cert)[0]
        assert not healthcheck.check(f"localhost:{h.port}", timeout_s=1.0)[0]  # plaintext to a TLS server
    finally:
        h.stop(0.5)


def test_a_worker_that_hangs_up_is_replaced_by_one_that_reconnects() -> None:
    """The first worker drops its stream on its first request; the retry goes to the newcomer."""
    h = create_estimator_service(EstimatorSettings(port=0, oracle_timeout_s=10.0, oracle_retries=1))
    first = FakeWorker(f"127.0.0.1:{h.port}", [0, 1, 2, 3], ignore=10**6)
    second: list[FakeWorker] = []

    def replace_on_first_request() -> None:
        while first.requests == 0:
            threading.Event().wait(0.02)
        first.close()  # hang up with the request unanswered
        second.append(FakeWorker(f"127.0.0.1:{h.port}", [0, 1, 2, 3]))

    swap = threading.Thread(target=replace_on_first_request, daemon=True)
    swap.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{h.port}") as ch:
            job, w0 = _start_offline(est_grpc.EstimatorServiceStub(ch), rounds=2)
    finally:
        swap.join(5)
        for w in [first, *second]:
            w.close()
        h.stop(0.5)
    assert job.state == DONE, job.message
    assert list(job.phi2) == _direct(w0, rounds=2).tolist()
    assert mappers.struct_to_dict(job.report)["oracle_retries"] >= 1


def test_finished_jobs_survive_a_restart_with_run_dir(tmp_path: Path) -> None:
    settings = EstimatorSettings(port=0, run_dir=str(tmp_path))
    h = create_estimator_service(settings)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{h.port}") as ch:
            job, _ = _start_offline(est_grpc.EstimatorServiceStub(ch), wait_s=0.1)
    finally:
        h.stop(0.5)
    assert job.state == FAILED
    h2 = create_estimator_service(settings)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{h2.port}") as ch:
            again = est_grpc.EstimatorServiceStub(ch).GetOffline(est_pb.GetOfflineRequest(job_id=job.job_id),
                                                                 timeout=10).job
    finally:
        h2.stop(0.5)
    assert (again.state, again.message) == (job.state, job.message)
