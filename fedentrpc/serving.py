"""One way to build a fedent gRPC server, so every service gets the same protections against being starved.

Why: grpc-python's synchronous server runs every call on one thread pool, and a stream holds its thread
while open. Issue 25 measured what follows: 200 idle health watchers or 200 stalled uploads took all 128
threads of the aggregator and honest workers' Register timed out; the read-only ``--keep-serving`` server
(4 threads) stopped answering health checks with 8 streams. A server built here has three pools:

* the **work pool** (``max_workers`` threads) for the service's own calls; streams may take all of it but
  :data:`fedentrpc.stream_limit.RESERVED_THREADS`, so unary calls (Register, Heartbeat) always run;
* the **open pool** for health and reflection (no credentials needed): at most ``limits.anonymous``
  streams, plus :data:`OPEN_SPARE` threads that only health ``Check`` and other unary calls can use, so
  probes answer however busy the work pool is;
* the **refusal pool** (two threads, :class:`~fedentrpc.security.interceptors.AuthInterceptor`): calls
  whose metadata already fails authentication are answered there, never queued on the work pool.

Interceptors, outermost first: the open-pool router, authentication (when configured), the stream limits
(:mod:`fedentrpc.stream_limit`), the stream deadlines (:mod:`fedentrpc.stream_deadline`) and the
malformed-request guard.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from concurrent import futures
from typing import Any

import grpc

from fedentrpc.handlers import Behaviour, rewrap
from fedentrpc.malformed import MalformedRequestInterceptor
from fedentrpc.options import grpc_options
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.security.interceptors import OPEN_METHOD_PREFIXES, auth_interceptors
from fedentrpc.stream_deadline import StreamDeadlineInterceptor
from fedentrpc.stream_limit import StreamLimitInterceptor, StreamLimits, stream_budget

OPEN_SPARE = 4  # open-pool threads beyond the open-stream cap: health Check always finds one


def pinned(behaviour: Behaviour, pool: futures.ThreadPoolExecutor) -> Behaviour:
    """``behaviour`` run on ``pool`` instead of the server's pool (grpc-python's per-method pool hook)."""

    def run(request: Any, context: grpc.ServicerContext) -> Any:
        return behaviour(request, context)

    run.experimental_thread_pool = pool  # type: ignore[attr-defined]
    return run


class OpenPoolInterceptor(grpc.ServerInterceptor):
    """Health and reflection handlers run on their own pool, out of reach of the work pool's streams."""

    def __init__(self, pool: futures.ThreadPoolExecutor,
                 open_prefixes: Sequence[str] = OPEN_METHOD_PREFIXES) -> None:
        self.pool = pool
        self.open_prefixes = tuple(open_prefixes)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self.open_prefixes):
            return handler
        return rewrap(handler, lambda inner, _rs, _ps: pinned(inner, self.pool))


def create_server(sec: ServerSecurity, max_workers: int, limits: StreamLimits, *, sessions: Collection[str] = (),
                  held: Collection[str] = (), name: str = "rpc") -> grpc.Server:
    """An unstarted ``grpc.Server`` with the three pools and the interceptors above.

    ``sessions``: full method names of long-lived streams (Work, Oracle; see :mod:`fedentrpc.stream_deadline`);
    ``held``: unary long polls counted like streams (:mod:`fedentrpc.stream_limit`).
    """
    work = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
    open_pool = futures.ThreadPoolExecutor(max_workers=limits.anonymous + OPEN_SPARE,
                                           thread_name_prefix=f"{name}-open")
    auth = auth_interceptors(sec)
    limiter = StreamLimitInterceptor(limits.per_identity if auth else 0, anonymous=limits.anonymous,
                                     total=stream_budget(max_workers), held=held)
    interceptors: list[grpc.ServerInterceptor] = [
        OpenPoolInterceptor(open_pool), *auth, limiter,
        StreamDeadlineInterceptor(limits.idle_s, limits.open_max_s, sessions), MalformedRequestInterceptor()]
    return grpc.server(work, options=grpc_options(), interceptors=interceptors)


def method_name(service_full_name: str, method: str) -> str:
    """The wire name of ``method`` of a service (``/pkg.Service/Method``), as interceptors see it."""
    return f"/{service_full_name}/{method}"
