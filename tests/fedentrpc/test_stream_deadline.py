"""fedentrpc.stream_deadline on a real server (fedentrpc.serving.create_server with a small test service):
an upload that stops sending, a download nobody reads and a session that never says hello are cut after the
idle limit; a slow but steady upload, a session past its hello and the server's own time are not; a health
Watch ends at the open-stream limit."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedentrpc.health import add_health_and_reflection
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.serving import create_server
from fedentrpc.stream_deadline import StreamDeadlineInterceptor
from fedentrpc.stream_limit import StreamLimits

pytestmark = pytest.mark.timeout(60)
IDLE_S = 1.0
SERVICE = "fedent.test.Streams"


def _ident(x: bytes) -> bytes:
    return x


class Service:
    """Upload counts messages (RpcError: the stream was cut); Download sends 64 x 1 MiB; Session echoes."""

    def __init__(self) -> None:
        self.upload_ended: queue.Queue[str] = queue.Queue()

    def upload(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        n = 0
        try:
            for _ in requests:
                n += 1
                time.sleep(IDLE_S * 0.1)
        except grpc.RpcError:
            self.upload_ended.put(f"cut after {n}")
            return b""
        time.sleep(IDLE_S * 2)  # the server's own work after the last message never counts
        self.upload_ended.put(f"done {n}")
        return str(n).encode()

    def download(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for _ in range(64):
            yield b"x" * (1 << 20)

    def session(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests


@pytest.fixture
def served() -> Iterator[tuple[grpc.Channel, Service, StreamDeadlineInterceptor]]:
    svc = Service()
    limits = StreamLimits(idle_s=IDLE_S, open_max_s=1.5, anonymous=4)
    server = create_server(ServerSecurity(insecure=True), 16, limits, sessions=[f"/{SERVICE}/Session"])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Upload": grpc.stream_unary_rpc_method_handler(svc.upload, _ident, _ident),
        "Download": grpc.unary_stream_rpc_method_handler(svc.download, _ident, _ident),
        "Session": grpc.stream_stream_rpc_method_handler(svc.session, _ident, _ident),
    }),))
    add_health_and_reflection(server, [SERVICE])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    deadlines = next(i for i in server._state.interceptor_pipeline.interceptors  # type: ignore[attr-defined]
                     if isinstance(i, StreamDeadlineInterceptor))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch, svc, deadlines
    server.stop(0)


def _messages(n: int, pause_s: float, then_wait: threading.Event | None = None) -> Iterator[bytes]:
    for _ in range(n):
        yield b"chunk"
        time.sleep(pause_s)
    if then_wait is not None:
        then_wait.wait()


def test_an_upload_that_stops_sending_is_cut_and_a_steady_one_is_not(served: Any) -> None:
    ch, svc, deadlines = served
    upload = ch.stream_unary(f"/{SERVICE}/Upload")
    # steady: a message every IDLE_S / 4 for 2 x IDLE_S in all, then 2 x IDLE_S of server work
    assert upload(_messages(8, IDLE_S / 4), timeout=30) == b"8"
    assert svc.upload_ended.get(timeout=5) == "done 8"
    stuck = threading.Event()
    with pytest.raises(grpc.RpcError) as ei:
        upload(_messages(2, 0.0, then_wait=stuck), timeout=30)
    stuck.set()
    assert ei.value.code() == grpc.StatusCode.CANCELLED
    assert svc.upload_ended.get(timeout=5) == "cut after 2"
    assert deadlines.cut_count == 1 and deadlines.open_streams() == 0


def test_a_download_nobody_reads_is_cut(served: Any) -> None:
    ch, _, deadlines = served
    call = ch.unary_stream(f"/{SERVICE}/Download")(b"", timeout=30)
    assert len(next(call)) == 1 << 20  # one message taken, then the reader stops
    t0 = time.monotonic()
    while deadlines.cut_count == 0 and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert deadlines.cut_count == 1
    with pytest.raises(grpc.RpcError) as ei:
        for _ in call:
            pass
    assert ei.value.code() == grpc.StatusCode.CANCELLED


def test_a_session_must_say_hello_in_time_and_may_then_stay_silent(served: Any) -> None:
    ch, _, deadlines = served
    session = ch.stream_stream(f"/{SERVICE}/Session")
    silent = threading.Event()
    mute = session(_messages(0, 0.0, then_wait=silent), timeout=30)
    with pytest.raises(grpc.RpcError) as ei:
        next(mute)
    assert ei.value.code() == grpc.StatusCode.CANCELLED and deadlines.cut_count == 1
    quiet = threading.Event()
    talker = session(_messages(1, 0.0, then_wait=quiet), timeout=30)
    assert next(talker) == b"chunk"
    time.sleep(IDLE_S * 2.5)  # silent 2.5 idle limits after its hello: still open
    assert talker.is_active() and deadlines.cut_count == 1
    quiet.set()
    assert list(talker) == []
    silent.set()


def test_a_health_watch_ends_at_the_open_stream_limit(served: Any) -> None:
    ch, _, deadlines = served
    watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as ei:
        next(watch)
    # CANCELLED by the server at its 1.5 s limit (the client's own 30 s timeout would be DEADLINE_EXCEEDED)
    assert ei.value.code() == grpc.StatusCode.CANCELLED and deadlines.cut_count == 1
