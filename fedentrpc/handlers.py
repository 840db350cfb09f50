"""Rebuilding a gRPC method handler with a wrapped behaviour, whatever its call shape.

Server interceptors that act inside a call (authentication, the malformed-request guard) need the same
handler back with another behaviour; grpc-python has one factory per call shape. This module holds that
dispatch once, so each interceptor only says how it wraps a unary or a streamed behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

Behaviour = Callable[..., Any]
# (behaviour, request_streaming, response_streaming) -> the new behaviour
Wrap = Callable[[Behaviour, bool, bool], Behaviour]

_FACTORIES = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def rewrap(handler: grpc.RpcMethodHandler, wrap: Wrap,
           request_deserializer: Callable[[bytes], Any] | None = None) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour replaced by ``wrap(behaviour, request_streaming, response_streaming)``;
    same call shape and serializers (the request deserializer too, unless one is given)."""
    shape = (bool(handler.request_streaming), bool(handler.response_streaming))
    behaviour = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    des = handler.request_deserializer if request_deserializer is None else request_deserializer
    return _FACTORIES[shape](wrap(behaviour, *shape), des, handler.response_serializer)
