"""fedentrpc.stream_limit on a real server (the estimator service, worker tokens over TLS): one identity
holding its limit of idle streams is refused the next with RESOURCE_EXHAUSTED, while another identity's calls
and streams still succeed, unauthenticated health watchers share one bucket of their own size, and a closed
stream's slot comes back. Hundreds of streams against a real aggregator process: tests/system/test_starvation.py."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from estimator.service import create_estimator_service
from estimator.settings import EstimatorSettings
from fedent.strategies.options import FedEntOptions
from fedentrpc import mappers
from fedentrpc.security.flags import ClientSecurity, ServerSecurity
from fedentrpc.security.tls import open_channel
from fedentrpc.security.tokens import read_worker_token
from fedentrpc.stream_limit import StreamLimitInterceptor
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc
from server.certs import make_dev_pki

pytestmark = pytest.mark.timeout(60)
LIMIT = 3
T = TypeVar("T")


class IdleOracle:
    """An Oracle stream that says hello and then sits idle until closed."""

    def __init__(self, stub: est_grpc.EstimatorServiceStub, cid: int) -> None:
        self.q: queue.Queue[est_pb.OracleRequest | None] = queue.Queue()
        self.q.put(est_pb.OracleRequest(hello=est_pb.OracleHello(worker_id="w", run_id="r", client_ids=[cid])))
        self.call = stub.Oracle(self._out())
        self.error: grpc.RpcError | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _out(self) -> Iterator[est_pb.OracleRequest]:
        while (m := self.q.get()) is not None:
            yield m

    def _read(self) -> None:
        try:
            for _ in self.call:
                pass
        except grpc.RpcError as e:
            self.error = e

    def close(self) -> None:
        self.q.put(None)
        self.call.cancel()


def interceptor(server: grpc.Server, kind: type[T]) -> T:
    """The server's interceptor of type ``kind`` (grpc-python keeps them in its private state)."""
    found = [i for i in server._state.interceptor_pipeline.interceptors  # type: ignore[attr-defined]
             if isinstance(i, kind)]
    assert len(found) == 1, found
    return found[0]


def _wait(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_one_identity_cannot_hold_more_than_its_streams(tmp_path: Path) -> None:
    pki = make_dev_pki(tmp_path, hosts=["localhost"], workers=["worker-0", "worker-1"])
    sec = ServerSecurity(cert=pki.server_cert, key=pki.server_key, ca=pki.ca_cert,
                         token_file=pki.tokens_file).validate()
    h = create_estimator_service(EstimatorSettings(port=0, security=sec, max_streams_per_identity=LIMIT,
                                                   max_anonymous_streams=LIMIT))
    limiter = interceptor(h.server, StreamLimitInterceptor)
    addr = f"localhost:{h.port}"

    def creds(worker: str) -> ClientSecurity:
        return ClientSecurity(ca=pki.ca_cert, token=read_worker_token(pki.token_files[worker]))

    streams: list[IdleOracle] = []
    try:
        with open_channel(addr, creds("worker-1")) as hog, open_channel(addr, creds("worker-0")) as honest, \
                open_channel(addr, ClientSecurity(ca=pki.ca_cert)) as anon:
            hog_stub = est_grpc.EstimatorServiceStub(hog)
            streams = [IdleOracle(hog_stub, c) for c in range(LIMIT)]
            _wait(lambda: limiter.open_streams("worker-1") == LIMIT)
            assert limiter.open_streams("worker-1") == LIMIT
            extra = IdleOracle(hog_stub, 9)  # the N+1-th idle stream
            _wait(lambda: extra.error is not None)
            assert extra.error is not None and extra.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert extra.error.details() == ("worker-1 already holds 3 open streams (the per-identity limit); "
                                             "close one first")
            # another identity is unaffected: a unary call and a stream of its own
            stub = est_grpc.EstimatorServiceStub(honest)
            req = mappers.solve_online_request("r", 0, FedEntOptions(phi2_rate="star"), c=1.0, thetas=[1.0], a=[0.1],
                                               b=[0.2])
            assert stub.SolveOnline(req, timeout=10).phi2_next > 0
            mine = IdleOracle(stub, 5)
            _wait(lambda: limiter.open_streams("worker-0") == 1)
            assert limiter.open_streams("worker-0") == 1 and mine.error is None
            # callers without credentials share one bucket (health Watch is open), of its own size
            hs = health_pb2_grpc.HealthStub(anon)
            watches = [hs.Watch(health_pb2.HealthCheckRequest()) for _ in range(LIMIT)]
            for w in watches:
                next(w)
            with pytest.raises(grpc.RpcError) as ei:
                next(hs.Watch(health_pb2.HealthCheckRequest()))
            assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ei.value.details() == ("3 streams on open methods (health, reflection) are open, the limit for "
                                          "callers without credentials")
            assert limiter.open_streams(None) == LIMIT and limiter.open_streams("worker-1") == LIMIT
            serving = health_pb2.HealthCheckResponse.SERVING
            assert hs.Check(health_pb2.HealthCheckRequest(), timeout=10).status == serving  # unary: not counted
            for w in watches:
                w.cancel()
            # a closed stream gives its slot back
            streams.pop().close()
            _wait(lambda: limiter.open_streams("worker-1") == LIMIT - 1)
            again = IdleOracle(hog_stub, 8)
            streams.append(again)
            _wait(lambda: limiter.open_streams("worker-1") == LIMIT)
            assert limiter.open_streams("worker-1") == LIMIT and again.error is None
            mine.close()
    finally:
        for s in streams:
            s.close()
        h.stop(0.5)


def test_on_the_aggregator_idle_uploads_of_one_identity_do_not_block_anothers_register(
        tmp_path: Path, start: object) -> None:
    from conftest import FakeWorker, tiny_config, tiny_inputs

    from fedentrpc.v1 import aggregator_pb2 as pb
    from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

    pki = make_dev_pki(tmp_path / "pki", hosts=["localhost"], workers=["worker-0", "worker-1"])
    sec = ServerSecurity(cert=pki.server_cert, key=pki.server_key, token_file=pki.tokens_file).validate()
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, security=sec,  # type: ignore[operator]
              max_streams_per_identity=LIMIT)

    def creds(worker: str) -> ClientSecurity:
        return ClientSecurity(ca=pki.ca_cert, token=read_worker_token(pki.token_files[worker]))

    gate: queue.Queue[None] = queue.Queue()

    def idle() -> Iterator[pb.SubmitUpdateRequest]:
        gate.get()  # never sends a message until the test ends
        return
        yield  # a generator

    with open_channel(f"localhost:{h.port}", creds("worker-1")) as hog:
        stub = pb_grpc.AggregatorServiceStub(hog)
        held = [stub.SubmitUpdate.future(idle()) for _ in range(LIMIT)]
        limiter = interceptor(h.server, StreamLimitInterceptor)  # type: ignore[attr-defined]
        # the held calls first (their token is added on a credentials thread, so they may leave in any order)
        _wait(lambda: limiter.open_streams("worker-1") == LIMIT)
        try:
            with pytest.raises(grpc.RpcError) as ei:
                stub.SubmitUpdate(idle(), timeout=10)
            assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "worker-1 already holds 3 open streams" in ei.value.details()
            honest = FakeWorker(h.port, [0, 1, 2, 3], str(inputs.partition_info["md5"]), name="worker-0",
                                security=creds("worker-0"))  # Register, Ready and its Work stream
            assert honest.wid and honest.call.is_active()
            honest.channel.close()
        finally:
            for _ in range(LIMIT + 1):
                gate.put(None)
            for f in held:
                f.cancel()


def test_a_held_long_poll_counts_like_a_stream(tmp_path: Path) -> None:
    """The estimator's GetOffline waits up to a minute on a work thread: declared ``held``, one identity's
    long polls count against its stream limit, and other identities' do not."""
    import json

    from fedentrpc.security.interceptors import MetadataClientInterceptor, bearer_metadata
    from fedentrpc.serving import create_server
    from fedentrpc.stream_limit import StreamLimits

    release = threading.Event()
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"workers": {"a": "tok-a", "b": "tok-b"}}))
    server = create_server(ServerSecurity(insecure=True, token_file=tokens).validate(), 16,
                           StreamLimits(per_identity=LIMIT), held=["/t.S/Poll"])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {
        "Poll": grpc.unary_unary_rpc_method_handler(lambda r, c: b"ok" if release.wait(30) else b"", lambda x: x,
                                                    lambda x: x),
        "Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r, lambda x: x, lambda x: x),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    limiter = interceptor(server, StreamLimitInterceptor)

    def channel(token: str) -> grpc.Channel:
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        return grpc.intercept_channel(ch, MetadataClientInterceptor(bearer_metadata(token)))

    try:
        with channel("tok-a") as a, channel("tok-b") as b:
            polls = [a.unary_unary("/t.S/Poll").future(b"", timeout=30) for _ in range(LIMIT)]
            _wait(lambda: limiter.open_streams("a") == LIMIT)
            with pytest.raises(grpc.RpcError) as ei:
                a.unary_unary("/t.S/Poll")(b"", timeout=10)
            assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert a.unary_unary("/t.S/Echo")(b"e", timeout=10) == b"e"  # other unary calls are not counted
            other = b.unary_unary("/t.S/Poll").future(b"", timeout=30)
            _wait(lambda: limiter.open_streams("b") == 1)
            assert limiter.open_streams("b") == 1 and limiter.total_streams() == LIMIT + 1
            release.set()
            assert [p.result() for p in [*polls, other]] == [b"ok"] * (LIMIT + 1)
    finally:
        release.set()
        server.stop(0)
