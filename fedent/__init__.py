"""FedEnt core: the math, models, data, partitions, strategies and the in-process simulator.

This package must never import grpc, protobuf or fastapi (tests/system/test_core_purity.py checks it), so that
the same algorithm code runs in the simulator and behind the gRPC services.
"""

__version__ = "0.1.0"
