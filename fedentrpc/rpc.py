"""gRPC wiring for the tensor bulk path: servicers and stubs whose chunk-carrying methods skip protobuf's copies.

The messages on the wire are the ones the .proto files define; only how Python turns them into objects
changes, for the tensor-carrying methods: ``FetchBlob`` answers with chunks serialised once
(``EncodedTensors.wire``); uploads (``PutBlob``, ``SubmitUpdate``, the ``Oracle`` stream's gradients) take
pre-serialised chunks; and ``FetchBlob`` replies and those uploads are read as zero-copy views
(``fedentrpc.wire``). Every other method keeps protobuf's (de)serializers. Servicers are registered from
the service descriptors, as the generated ``add_*Servicer_to_server`` would, with those overrides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import aggregator_pb2_grpc as agg_grpc
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc
from fedentrpc.wire import parse_chunk, parse_oracle_message, parse_update_part, serialize_any

Codec = Callable[[Any], Any]

_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _handler(m: MethodDescriptor, fn: Callable[..., Any], deserializer: Codec, serializer: Codec) -> Any:
    make = _HANDLERS[(m.client_streaming, m.server_streaming)]
    return make(fn, request_deserializer=deserializer, response_serializer=serializer)


def add_servicer(server: grpc.Server, service: ServiceDescriptor, servicer: Any,
                 overrides: Mapping[str, tuple[Codec | None, Codec | None]]) -> None:
    """Register every method of ``service``; ``overrides`` maps a method to (request deserializer,
    response serializer), None keeping protobuf's."""
    unknown = set(overrides) - {m.name for m in service.methods}
    if unknown:
        raise ValueError(f"{service.full_name} has no methods {sorted(unknown)}")
    handlers = {}
    for m in service.methods:
        deserializer, serializer = overrides.get(m.name, (None, None))
        handlers[m.name] = _handler(
            m, getattr(servicer, m.name),
            deserializer or message_factory.GetMessageClass(m.input_type).FromString,
            serializer or message_factory.GetMessageClass(m.output_type).SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(service.full_name, handlers)


def add_estimator_servicer(servicer: Any, server: grpc.Server) -> None:
    add_servicer(server, est_pb.DESCRIPTOR.services_by_name["Estimator"], servicer,
                 {"PutBlob": (parse_chunk, None), "FetchBlob": (None, serialize_any),
                  "Oracle": (parse_oracle_message, None)})


def add_aggregator_servicer(servicer: Any, server: grpc.Server) -> None:
    add_servicer(server, agg_pb.DESCRIPTOR.services_by_name["Aggregator"], servicer,
                 {"FetchBlob": (None, serialize_any), "SubmitUpdate": (parse_update_part, None)})


def _rewire(stub: Any, channel: grpc.Channel, service: ServiceDescriptor,
            overrides: Mapping[str, tuple[Codec | None, Codec | None]]) -> None:
    """Replace ``stub``'s methods named in ``overrides`` (request serializer, response deserializer)."""
    make = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
            (True, False): channel.stream_unary, (True, True): channel.stream_stream}
    for name, (serializer, deserializer) in overrides.items():
        m = service.methods_by_name[name]
        setattr(stub, name, make[(m.client_streaming, m.server_streaming)](
            f"/{service.full_name}/{name}",
            request_serializer=serializer or message_factory.GetMessageClass(m.input_type).SerializeToString,
            response_deserializer=deserializer or message_factory.GetMessageClass(m.output_type).FromString))


def estimator_stub(channel: grpc.Channel) -> est_grpc.EstimatorStub:
    """The generated stub, with PutBlob and Oracle taking pre-serialised chunks and FetchBlob answering views."""
    stub = est_grpc.EstimatorStub(channel)
    _rewire(stub, channel, est_pb.DESCRIPTOR.services_by_name["Estimator"],
            {"PutBlob": (serialize_any, None), "FetchBlob": (None, parse_chunk), "Oracle": (serialize_any, None)})
    return stub


def aggregator_stub(channel: grpc.Channel) -> agg_grpc.AggregatorStub:
    """The generated stub, with FetchBlob answering views and SubmitUpdate taking pre-serialised parts."""
    stub = agg_grpc.AggregatorStub(channel)
    _rewire(stub, channel, agg_pb.DESCRIPTOR.services_by_name["Aggregator"],
            {"FetchBlob": (None, parse_chunk), "SubmitUpdate": (serialize_any, None)})
    return stub
