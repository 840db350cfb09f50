"""fedentrpc.serving.create_server: health answers, and bad credentials are refused, while every work thread
is held; open-method streams are capped apart from the work pool; streams never take the work pool's last
threads, so unary calls still run."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedentrpc.health import add_health_and_reflection
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.security.interceptors import MetadataClientInterceptor, bearer_metadata
from fedentrpc.serving import OPEN_SPARE, create_server
from fedentrpc.stream_limit import RESERVED_THREADS, StreamLimits

pytestmark = pytest.mark.timeout(60)
SERVICE = "fedent.test.Pool"
WORKERS = 8
SERVING = health_pb2.HealthCheckResponse.SERVING
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def _ident(x: bytes) -> bytes:
    return x


class Served:
    """A server of WORKERS work threads: Block (unary) waits for ``release``; Upload reads until the end."""

    def __init__(self, sec: ServerSecurity, anonymous: int = 3) -> None:
        self.release = threading.Event()
        self.blocked = threading.Semaphore(0)
        self.server = create_server(sec, WORKERS, StreamLimits(anonymous=anonymous, per_identity=0))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Block": grpc.unary_unary_rpc_method_handler(self._block, _ident, _ident),
            "Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r, _ident, _ident),
            "Upload": grpc.stream_unary_rpc_method_handler(lambda it, c: b"%d" % sum(1 for _ in it), _ident,
                                                           _ident),
        }),))
        add_health_and_reflection(self.server, [SERVICE])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _block(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.blocked.release()
        self.release.wait(30)
        return b"released"

    def channel(self, token: str | None = None) -> grpc.Channel:
        ch = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        return grpc.intercept_channel(ch, MetadataClientInterceptor(bearer_metadata(token))) if token else ch

    def stop(self) -> None:
        self.release.set()
        self.server.stop(0)


def _hold_every_work_thread(s: Served, ch: grpc.Channel) -> list[grpc.Future]:
    block = ch.unary_unary(f"/{SERVICE}/Block")
    held = [block.future(b"", timeout=30) for _ in range(WORKERS)]
    for _ in range(WORKERS):
        assert s.blocked.acquire(timeout=10)
    echo = ch.unary_unary(f"/{SERVICE}/Echo")
    with pytest.raises(grpc.RpcError) as ei:  # the pool is full: a unary call of the service waits
        echo(b"x", timeout=1.0)
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return held


def test_health_answers_while_every_work_thread_is_held_and_watchers_are_capped() -> None:
    s = Served(ServerSecurity(insecure=True), anonymous=3)
    try:
        with s.channel() as ch:
            held = _hold_every_work_thread(s, ch)
            hs = health_pb2_grpc.HealthStub(ch)
            assert hs.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
            watches = [hs.Watch(health_pb2.HealthCheckRequest(), timeout=30) for _ in range(3)]
            assert [next(w).status for w in watches] == [SERVING] * 3
            extra = hs.Watch(health_pb2.HealthCheckRequest(), timeout=30)
            with pytest.raises(grpc.RpcError) as ei:
                next(extra)
            assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ei.value.details() == ("3 streams on open methods (health, reflection) are open, the limit for "
                                          "callers without credentials")
            # the open pool keeps OPEN_SPARE threads beyond the watchers: checks still answer, several at once
            checks = [hs.Check.future(health_pb2.HealthCheckRequest(), timeout=5) for _ in range(OPEN_SPARE)]
            assert [c.result().status for c in checks] == [SERVING] * OPEN_SPARE
            s.release.set()
            assert [f.result() for f in held] == [b"released"] * WORKERS
            for w in watches:
                w.cancel()
    finally:
        s.stop()


def test_streams_leave_the_reserved_threads_to_unary_calls() -> None:
    s = Served(ServerSecurity(insecure=True))
    gate = threading.Event()

    def stalled() -> Iterator[bytes]:
        yield b"chunk"
        gate.wait(30)

    try:
        with s.channel() as ch:
            upload = ch.stream_unary(f"/{SERVICE}/Upload")
            budget = WORKERS - RESERVED_THREADS
            calls = [upload.future(stalled(), timeout=30) for _ in range(budget + 3)]
            deadline = time.monotonic() + 10
            while sum(c.done() for c in calls) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            admitted = [c for c in calls if not c.done()]  # which 3 lose the race is the server's choice
            refused = [c.exception() for c in calls if c not in admitted]
            assert [e.code() for e in refused if isinstance(e, grpc.RpcError)] == [RESOURCE_EXHAUSTED] * 3
            assert {e.details() for e in refused if isinstance(e, grpc.RpcError)} == {
                "the server's 4 stream threads are taken; retry later"}
            assert ch.unary_unary(f"/{SERVICE}/Echo")(b"still here", timeout=5) == b"still here"
            gate.set()
            assert [c.result(timeout=10) for c in admitted] == [b"1"] * budget
    finally:
        gate.set()
        s.stop()


def test_bad_credentials_are_refused_while_every_work_thread_is_held(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"workers": {"w0": "good-token", "w1": "old-token"}, "revoked": ["w1"]}))
    s = Served(ServerSecurity(insecure=True, token_file=tokens).validate())
    try:
        with s.channel("good-token") as good:
            held = _hold_every_work_thread(s, good)
            for token in (None, "guessed", "old-token"):  # no credentials, unknown, revoked
                with s.channel(token) as ch:
                    with pytest.raises(grpc.RpcError) as ei:
                        ch.stream_unary(f"/{SERVICE}/Upload")(iter([b"x"]), timeout=5)
                    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED, token
                    assert ei.value.details() == "unknown or revoked worker credentials"
            s.release.set()
            assert [f.result() for f in held] == [b"released"] * WORKERS
    finally:
        s.stop()
