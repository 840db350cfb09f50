"""grpc.health.v1 and server reflection, set up the same way on every fedent gRPC server.

Probes (docker-compose healthchecks, ``python -m server.healthcheck``, load balancers) and tools such as
grpcurl see the same surface whichever service they ask; both stay open under authentication
(``fedentrpc.security.interceptors.OPEN_METHOD_PREFIXES``).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection


def add_health_and_reflection(server: grpc.Server, service_names: Sequence[str]) -> health.HealthServicer:
    """Register health (the whole server ``""`` and each of ``service_names`` SERVING) and reflection.

    Returns the health servicer, so the caller can ``enter_graceful_shutdown()`` before stopping.
    """
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    for name in ["", *service_names]:
        hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    return hs
