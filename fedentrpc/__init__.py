"""gRPC wire layer: code generated from proto/fedentrpc/v1/*.proto (``make proto``) plus the codec
in :mod:`fedentrpc.convert`, the only module where protobuf messages and core types meet."""
