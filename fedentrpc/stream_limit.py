"""At most N concurrent streaming calls per caller identity: one peer cannot hold the whole thread pool.

Every streaming RPC (Work, SubmitUpdate, Oracle, PutBlob, FetchBlob, health Watch, ...) holds one of the
server's pool threads for as long as it is open. Without a bound, a credentialed worker (or, on open methods,
anyone) opening a few hundred idle streams exhausts the pool and honest workers' ``Register`` times out
(issue 25, "Stalling"). This interceptor counts a call's open streams per authenticated identity (callers
that authenticate as nobody share one bucket) and refuses the call beyond the limit with RESOURCE_EXHAUSTED
and a one-line reason. Unary calls are not counted: they return at once.

It sits inside :class:`fedentrpc.security.interceptors.AuthInterceptor`, so it sees the identity the
credentials name. Without authentication every caller would share one bucket, so ``server_interceptors``
installs it only where the server authenticates. A slot is given back when gRPC ends the call
(``add_callback``: whether it finished, failed or the peer went away).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from fedentrpc.handlers import rewrap
from fedentrpc.security.interceptors import caller_identity

UNAUTHENTICATED_BUCKET = ""  # callers without credentials (open methods: health, reflection)


class StreamLimitInterceptor(grpc.ServerInterceptor):
    """RESOURCE_EXHAUSTED for a streaming call beyond ``limit`` open ones of the same identity."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"stream limit must be >= 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def open_streams(self, identity: str | None) -> int:
        with self._lock:
            return self._open.get(identity or UNAUTHENTICATED_BUCKET, 0)

    def _acquire(self, context: grpc.ServicerContext) -> None:
        who = caller_identity(context) or UNAUTHENTICATED_BUCKET
        with self._lock:
            n = self._open.get(who, 0)
            if n >= self.limit:
                refused = True
            else:
                refused = False
                self._open[who] = n + 1
        if refused:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{who or 'unauthenticated callers'} already hold{'s' if who else ''} {self.limit} open "
                          f"streams (the per-identity limit); close one first")
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                left = self._open.get(who, 1) - 1
                if left > 0:
                    self._open[who] = left
                else:
                    self._open.pop(who, None)

        if not context.add_callback(release):  # the call already ended
            release()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler

        def wrap(inner: Callable[[Any, grpc.ServicerContext], Any], request_streaming: bool,
                 response_streaming: bool) -> Callable[[Any, grpc.ServicerContext], Any]:
            if response_streaming:
                def streaming(request: Any, context: grpc.ServicerContext) -> Any:
                    self._acquire(context)
                    yield from inner(request, context)

                return streaming

            def single(request: Any, context: grpc.ServicerContext) -> Any:
                self._acquire(context)
                return inner(request, context)

            return single

        return rewrap(handler, wrap)
