"""Generated protobuf/gRPC modules for the fedentrpc.v1 API (do not edit; run ``make proto``)."""
