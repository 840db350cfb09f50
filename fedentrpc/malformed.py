"""Requests that do not parse: INVALID_ARGUMENT and one log line, for every service.

grpc-python parses a request with the handler's ``request_deserializer`` (the generated ``FromString``)
before any servicer code runs; when that raises, grpc logs a full traceback ("Exception deserializing
message!") and ends the call with INTERNAL. :class:`MalformedRequestInterceptor` replaces every method
handler's deserializer with one that never raises: a message that does not parse becomes a
:class:`Malformed` marker, and the handler's behaviour, on meeting it, logs one warning line (method, peer,
message type, parser error; no traceback) and aborts the call with
``INVALID_ARGUMENT: malformed <MessageName>: <error>``. For a streamed request the marker is met where the
servicer reads that message, so garbage mid-stream ends the call there; the server keeps serving.

Installed by :func:`fedentrpc.security.interceptors.server_interceptors` (both services), *after* the
authentication interceptor, so authentication still runs first: garbage from an unauthenticated caller
is UNAUTHENTICATED and logs only the rejection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from fedentrpc.handlers import Behaviour, rewrap

log = logging.getLogger("fedent.transport")

_MAX_ERROR_CHARS = 200


class Malformed:
    """What the guarded deserializer returns for bytes that do not parse as ``type_name``."""

    __slots__ = ("type_name", "error")

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error

    def __repr__(self) -> str:
        return f"Malformed({self.type_name!r}, {self.error!r})"


def message_name(deserializer: Callable[[bytes], Any]) -> str:
    """``RegisterRequest`` for ``RegisterRequest.FromString`` (a best effort for other callables)."""
    owner = getattr(deserializer, "__self__", None)
    if isinstance(owner, type):
        return owner.__name__
    qual = str(getattr(deserializer, "__qualname__", "") or getattr(deserializer, "__name__", "") or "request")
    return qual.rsplit(".", 2)[-2] if qual.endswith(".FromString") and "." in qual else qual


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= _MAX_ERROR_CHARS else line[:_MAX_ERROR_CHARS] + "..."


def guard_deserializer(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserializer`` returning :class:`Malformed` in place of raising."""
    name = message_name(deserializer)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:  # DecodeError, and anything else a parser may raise on hostile bytes
            return Malformed(name, _one_line(e))

    return deserialize


def _reject(method: str, bad: Malformed, context: grpc.ServicerContext) -> NoReturn:
    log.warning("rejected %s from %s: malformed %s: %s", method, context.peer(), bad.type_name, bad.error)
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {bad.type_name}: {bad.error}")
    raise AssertionError("unreachable")  # abort raises


def _checked(method: str, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
    for request in requests:
        if isinstance(request, Malformed):
            _reject(method, request, context)
        yield request


def guard_handler(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The same handler with a deserializer that never raises and a behaviour that rejects what did not
    parse (all four call shapes). Handlers without a deserializer (raw bytes) are returned unchanged."""
    if handler.request_deserializer is None:
        return handler

    def wrap(inner: Behaviour, request_streaming: bool, response_streaming: bool) -> Behaviour:
        if request_streaming:
            def streamed(request_iterator: Any, context: grpc.ServicerContext) -> Any:
                return inner(_checked(method, request_iterator, context), context)

            return streamed

        def single(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, Malformed):
                _reject(method, request, context)
            return inner(request, context)

        return single

    return rewrap(handler, wrap, guard_deserializer(handler.request_deserializer))


class MalformedRequestInterceptor(grpc.ServerInterceptor):
    """Every method's unparseable request: INVALID_ARGUMENT and one warning line (see the module doc).

    Put it after any authentication interceptor in ``grpc.server(interceptors=...)``: the first
    interceptor is the outermost, so authentication then runs before the marker is looked at.
    """

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return guard_handler(handler_call_details.method, handler)
