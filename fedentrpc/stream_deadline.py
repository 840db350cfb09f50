"""Server-side deadlines on every stream: a peer that keeps a server thread waiting on it is cut.

A stream's thread waits on its peer in two places: for the next request message (an upload that stopped
sending chunks) and for the peer to take a response (a download nobody reads). Either wait longer than
``idle_s`` and the call is cancelled (the client sees CANCELLED; the aggregator keeps an upload's verified
chunks, so an honest worker's resume continues where it was cut, ``client.transfer``). Time the server
spends on its own work (decoding, waiting for the next task of a Work stream) never counts.

Two kinds of streams are long-lived on purpose and get other deadlines:

* **sessions** (the aggregator's Work stream, the estimator's Oracle stream) idle between rounds. A session
  must send its first message within ``idle_s`` (the Oracle hello); after that it lives as long as its
  owner does: a Work stream is closed when its worker misses heartbeats (``server.registry``), an Oracle
  stream when its worker's link drops (client keepalive pings, ``fedentrpc.options``).
* **open methods** (health Watch, reflection; callers need no credentials) live at most ``open_max_s``;
  health watchers reconnect, as they do after any server restart.

One watchdog thread per server checks every open stream a few times per deadline; it runs only while
streams are open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import grpc

from fedentrpc.handlers import rewrap
from fedentrpc.security.interceptors import OPEN_METHOD_PREFIXES, caller_identity

log = logging.getLogger("fedent.limits")


class StreamCut(grpc.RpcError):
    """What the servicer's request iterator raises on a stream this module cut, as for any broken stream
    (gRPC itself may end the iterator quietly when the cancel wins the race with the next read, and a
    servicer would then take a cut upload for a complete one)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return self.why


class _Stream:
    """One open stream's clocks (plain attributes, written by its own threads, read by the watchdog)."""

    __slots__ = ("context", "method", "started", "waiting_since", "idle_s", "lifetime_s", "cut", "who")

    def __init__(self, context: grpc.ServicerContext, method: str, idle_s: float | None,
                 lifetime_s: float | None) -> None:
        self.context = context
        self.method = method
        self.started = time.monotonic()
        self.waiting_since: float | None = None
        self.idle_s = idle_s
        self.lifetime_s = lifetime_s
        self.cut = ""
        self.who = caller_identity(context) or context.peer()

    def overdue(self, now: float) -> str:
        """Why this stream is cut now, or ''."""
        since = self.waiting_since
        if self.idle_s is not None and since is not None and now - since > self.idle_s:
            return f"it kept the server waiting for {now - since:.1f}s (stream idle limit {self.idle_s:g}s)"
        if self.lifetime_s is not None and now - self.started > self.lifetime_s:
            return f"open for {now - self.started:.1f}s (open-method stream limit {self.lifetime_s:g}s)"
        return ""


class StreamDeadlineInterceptor(grpc.ServerInterceptor):
    """Cancels streams that keep the server waiting on their peer (see the module docstring)."""

    def __init__(self, idle_s: float, open_max_s: float, sessions: Collection[str] = (),
                 open_prefixes: Sequence[str] = OPEN_METHOD_PREFIXES) -> None:
        if not idle_s > 0 or not open_max_s > 0:
            raise ValueError(f"stream deadlines must be > 0, got idle {idle_s}, open {open_max_s}")
        self.idle_s = idle_s
        self.open_max_s = open_max_s
        self.sessions = frozenset(sessions)
        self.open_prefixes = tuple(open_prefixes)
        self.tick_s = max(0.05, min(1.0, idle_s / 4, open_max_s / 4))
        self._lock = threading.Lock()
        self._streams: set[_Stream] = set()
        self._watchdog: threading.Thread | None = None
        self.cut_count = 0

    def open_streams(self) -> int:
        with self._lock:
            return len(self._streams)

    # ---- the watchdog ------------------------------------------------------------------------------------
    def _add(self, s: _Stream) -> None:
        with self._lock:
            self._streams.add(s)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, name="stream-deadlines", daemon=True)
                self._watchdog.start()

    def _remove(self, s: _Stream) -> None:
        with self._lock:
            self._streams.discard(s)

    def _watch(self) -> None:
        while True:
            time.sleep(self.tick_s)
            now = time.monotonic()
            with self._lock:
                if not self._streams:
                    self._watchdog = None
                    return
                due = [(s, why) for s in self._streams if (why := s.overdue(now))]
                for s, _ in due:
                    self._streams.discard(s)
                self.cut_count += len(due)
            for s, why in due:
                s.cut = why
                log.warning("cut %s from %s: %s", s.method, s.who, why)
                s.context.cancel()

    # ---- the wrapped behaviours --------------------------------------------------------------------------
    def _clocks(self, method: str) -> tuple[float | None, float | None, bool]:
        """(idle limit, lifetime limit, session) of ``method``."""
        if method.startswith(self.open_prefixes):
            return self.idle_s, self.open_max_s, False
        return self.idle_s, None, method in self.sessions

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        method = handler_call_details.method
        idle_s, lifetime_s, session = self._clocks(method)

        def start(context: grpc.ServicerContext, request_streaming: bool) -> _Stream:
            # a session's idle clock runs only until its first message: none at all without a request stream
            s = _Stream(context, method, None if session and not request_streaming else idle_s, lifetime_s)
            if s.idle_s is None and s.lifetime_s is None:
                return s  # nothing to watch (a Work stream: its worker's heartbeats are its deadline)
            self._add(s)
            if not context.add_callback(lambda: self._remove(s)):
                self._remove(s)
            return s

        def reading(s: _Stream, requests: Iterator[Any]) -> Iterator[Any]:
            it = iter(requests)
            while True:
                s.waiting_since = time.monotonic()
                try:
                    m = next(it)
                except StopIteration:
                    if s.cut:
                        raise StreamCut(s.cut) from None
                    return
                finally:
                    s.waiting_since = None
                if session and s.idle_s is not None:
                    s.idle_s = None  # the first message arrived: the session lives as long as its owner
                    if s.lifetime_s is None:
                        self._remove(s)
                yield m

        def wrap(inner: Callable[[Any, grpc.ServicerContext], Any], request_streaming: bool,
                 response_streaming: bool) -> Callable[[Any, grpc.ServicerContext], Any]:
            if response_streaming:
                def streaming(request: Any, context: grpc.ServicerContext) -> Any:
                    s = start(context, request_streaming)
                    try:
                        for r in inner(reading(s, request) if request_streaming else request, context):
                            if not session:  # a session's responses are the server's pace, not the peer's
                                s.waiting_since = time.monotonic()
                            yield r  # gRPC sends it (flow control: the peer must take it) before asking again
                            s.waiting_since = None
                    finally:
                        self._remove(s)

                return streaming

            def single(request_iterator: Any, context: grpc.ServicerContext) -> Any:
                s = start(context, True)
                try:
                    return inner(reading(s, request_iterator), context)
                finally:
                    self._remove(s)

            return single

        return rewrap(handler, wrap)
