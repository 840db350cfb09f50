"""How many calls may hold a server thread at once: per identity, for callers without credentials, in all.

Every streaming RPC (Work, SubmitUpdate, Oracle, PutBlob, FetchBlob, health Watch, ...) holds one server
thread for as long as it is open. Without a bound a credentialed worker (or, on open methods, anyone)
opening a few hundred idle streams exhausts the pool and honest workers' ``Register`` times out (issue 25,
"Stalling"). This interceptor counts the open streams of a call's kind and refuses one beyond its limit
with RESOURCE_EXHAUSTED and a one-line reason, before the servicer runs:

* **per identity**: at most ``per_identity`` open streams of one authenticated worker (with authentication);
* **open methods** (health, reflection: callers need no credentials): at most ``anonymous`` open streams
  of everyone together. They run on their own small pool (:mod:`fedentrpc.serving`), so they cannot
  reach the work pool whatever they do, and that pool keeps threads beyond the cap for health ``Check``;
* **in all**: at most ``total`` streams on the work pool, below its thread count, so that unary calls
  (Register, Heartbeat, uploads' QueryUpload...) always find a thread, whoever holds the streams.

Unary calls are not counted (they return at once), except the long polls a service names in ``held``
(the estimator's GetOffline waits up to a minute). A slot is given back when gRPC ends the call
(``add_callback``: whether it finished, failed or the peer went away).

It sits inside :class:`fedentrpc.security.interceptors.AuthInterceptor`, so it sees the identity the
credentials name; without authentication only the open-method and total limits apply.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from fedent.config import option
from fedentrpc.handlers import rewrap
from fedentrpc.security.interceptors import OPEN_METHOD_PREFIXES, caller_identity

ANONYMOUS = "\0open"  # the bucket of open-method streams (no identity can be named so)
ALL = "\0all"  # the bucket of every stream on the work pool
RESERVED_THREADS = 4  # work-pool threads no stream may take: unary calls always find one


@dataclass(frozen=True)
class StreamLimits:
    """The limits of one server (each service declares and documents them in its settings).

    ``per_identity``: open streams of one authenticated identity (0 = no limit); ``anonymous``: open
    streams on open methods (health Watch, reflection), all callers together; ``idle_s``: a stream that
    keeps the server waiting on its peer this long (no request message, or a response not taken) is cut;
    ``open_max_s``: the longest an open-method stream lives (watchers reconnect).
    """

    per_identity: int = 16
    anonymous: int = 8
    idle_s: float = 120.0
    open_max_s: float = 600.0

    def __post_init__(self) -> None:
        if self.per_identity < 0 or self.anonymous < 1 or not self.idle_s > 0 or not self.open_max_s > 0:
            raise ValueError(f"bad stream limits {self}")


def anonymous_streams_option() -> Any:
    """``max_anonymous_streams``, declared alike by the aggregator's and the estimator's settings."""
    return option(8, ("open streaming calls on health and reflection (no credentials needed), all callers together; "
                      "they run on a pool of their own with 4 more threads for health checks; more get "
                      "RESOURCE_EXHAUSTED"), ge=1)


def stream_idle_option() -> Any:
    """``stream_idle_s``, declared alike by both services' settings."""
    return option(120.0, ("a stream that keeps the server waiting on its peer this long (no upload chunk, a download "
                          "not read, a session's first message) is cancelled"), gt=0)


def open_stream_max_option() -> Any:
    """``open_stream_max_s``, declared alike by both services' settings."""
    return option(600.0, "a health Watch (or reflection) stream is closed after this long", gt=0)


def limits_of(settings: Any) -> StreamLimits:
    """The :class:`StreamLimits` of a service's settings (fields ``max_streams_per_identity``,
    ``max_anonymous_streams``, ``stream_idle_s``, ``open_stream_max_s``)."""
    return StreamLimits(per_identity=settings.max_streams_per_identity, anonymous=settings.max_anonymous_streams,
                        idle_s=settings.stream_idle_s, open_max_s=settings.open_stream_max_s)


def add_stream_limit_args(p: argparse.ArgumentParser, anonymous: int, idle_s: float, open_max_s: float) -> None:
    """The flags of the limits both services share beyond ``--max-streams-per-identity`` (defaults: theirs)."""
    p.add_argument("--max-anonymous-streams", type=int, default=anonymous,
                   help="open health Watch / reflection streams, all callers together; more get RESOURCE_EXHAUSTED")
    p.add_argument("--stream-idle", type=float, default=idle_s,
                   help="seconds a stream may keep the server waiting on its peer (no upload chunk, a download "
                   "not read) before it is cancelled")
    p.add_argument("--open-stream-max", type=float, default=open_max_s,
                   help="seconds a health Watch (or reflection) stream may stay open")


def stream_budget(max_workers: int) -> int:
    """Streams the work pool of ``max_workers`` threads may hold: all but :data:`RESERVED_THREADS`."""
    return max(1, max_workers - RESERVED_THREADS)


class StreamLimitInterceptor(grpc.ServerInterceptor):
    """RESOURCE_EXHAUSTED for a stream beyond its identity's, the open methods' or the pool's limit."""

    def __init__(self, limit: int, *, anonymous: int | None = None, total: int | None = None,
                 held: Collection[str] = (), open_prefixes: Sequence[str] = OPEN_METHOD_PREFIXES) -> None:
        if limit < 0 or (anonymous is not None and anonymous < 1) or (total is not None and total < 1):
            raise ValueError(f"stream limits must be >= 1 (per identity: 0 = none), got {limit}, {anonymous}, "
                             f"{total}")
        self.limit = limit
        self.anonymous = anonymous
        self.total = total
        self.held = frozenset(held)
        self.open_prefixes = tuple(open_prefixes)
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def open_streams(self, identity: str | None) -> int:
        """Open streams of ``identity``; None: those on open methods (health Watch...)."""
        with self._lock:
            return self._open.get(ANONYMOUS if identity is None else identity, 0)

    def total_streams(self) -> int:
        """Open streams on the work pool (every identity, and callers without one)."""
        with self._lock:
            return self._open.get(ALL, 0)

    def _buckets(self, method: str, context: grpc.ServicerContext) -> list[tuple[str, int, str]]:
        """(bucket, limit, reason) that this call counts against."""
        if method.startswith(self.open_prefixes):
            if self.anonymous is None:
                return []
            return [(ANONYMOUS, self.anonymous, f"{self.anonymous} streams on open methods (health, reflection) "
                                                f"are open, the limit for callers without credentials")]
        out = []
        who = caller_identity(context)
        if who is not None and self.limit > 0:
            out.append((who, self.limit, f"{who} already holds {self.limit} open streams (the per-identity "
                                         f"limit); close one first"))
        if self.total is not None:
            out.append((ALL, self.total, f"the server's {self.total} stream threads are taken; retry later"))
        return out

    def _acquire(self, method: str, context: grpc.ServicerContext) -> None:
        buckets = self._buckets(method, context)
        with self._lock:
            full = next((reason for b, n, reason in buckets if self._open.get(b, 0) >= n), None)
            if full is None:
                for b, _, _ in buckets:
                    self._open[b] = self._open.get(b, 0) + 1
        if full is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, full)
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                for b, _, _ in buckets:
                    left = self._open.get(b, 1) - 1
                    if left > 0:
                        self._open[b] = left
                    else:
                        self._open.pop(b, None)

        if not context.add_callback(release):  # the call already ended
            release()

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not (handler.request_streaming or handler.response_streaming or method in self.held):
            return handler

        def wrap(inner: Callable[[Any, grpc.ServicerContext], Any], request_streaming: bool,
                 response_streaming: bool) -> Callable[[Any, grpc.ServicerContext], Any]:
            if response_streaming:
                def streaming(request: Any, context: grpc.ServicerContext) -> Any:
                    self._acquire(method, context)
                    yield from inner(request, context)

                return streaming

            def single(request: Any, context: grpc.ServicerContext) -> Any:
                self._acquire(method, context)
                return inner(request, context)

            return single

        return rewrap(handler, wrap)
