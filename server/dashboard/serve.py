"""Run the dashboard under uvicorn in a background thread (used by the aggregator and the tests).

The socket is bound here, before the thread starts, so port 0 yields the real port at once and a taken
port fails in the caller's thread with a clear OSError.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI


@dataclass
class DashboardServer:
    """Handle of a running dashboard; ``stop()`` ends open event streams and shuts uvicorn down."""

    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        stopping = getattr(self.app.state, "stopping", None)
        if isinstance(stopping, threading.Event):
            stopping.set()
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> DashboardServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); IPv6 when the host is an IPv6 literal."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when the proto says TCP; without it
    # keep-alive responses stall ~40 ms on delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def uvicorn_config(app: FastAPI) -> uvicorn.Config:
    # access_log off: the SSE URL may carry ?token=, which must never reach a log.
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2)


def serve_dashboard(app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                    startup_timeout_s: float = 10.0) -> tuple[DashboardServer, int]:
    """Start ``app`` in a daemon thread; return the handle and the bound port once it accepts connections."""
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"dashboard:{bound}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            sock.close()
            raise RuntimeError("dashboard server exited during startup")
        if time.monotonic() > deadline:
            server.should_exit = True
            thread.join(2)
            sock.close()
            raise RuntimeError(f"dashboard server did not start within {startup_timeout_s:.0f} s")
        time.sleep(0.01)
    return DashboardServer(app=app, server=server, thread=thread, host=host, port=bound), bound
