"""gRPC wire layer: code generated from proto/fedentrpc/v1/*.proto (``make proto``), used as generated, plus
:mod:`fedentrpc.codec` (tensor lists <-> ``TensorChunk`` streams) and :mod:`fedentrpc.mappers`, the only
module where protobuf messages and core types meet."""
