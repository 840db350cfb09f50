"""``python -m server.healthcheck HOST:PORT``: exit 0 when a fedent gRPC service reports SERVING.

A tiny grpc.health.v1 client for container healthchecks (docker-compose) and scripts: exit 1 with a
one-line reason when the service is not serving or cannot be reached, 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m server.healthcheck", description="gRPC health probe")
    p.add_argument("address", help="HOST:PORT of the service")
    p.add_argument("--service", default="", help="service name to ask about ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds before giving up")
    p.add_argument("--tls-ca", type=Path, default=None,
                   help="CA certificate (PEM) of a TLS server; plaintext when omitted")
    p.add_argument("--tls-server-name", default=None, help="name to expect in the server certificate")
    return p


def _channel(address: str, ca: Path | None, server_name: str | None) -> grpc.Channel:
    if ca is None:
        return grpc.insecure_channel(address)
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca.read_bytes()), options=options)


def check(address: str, service: str = "", timeout_s: float = 3.0, tls_ca: Path | None = None,
          server_name: str | None = None) -> tuple[bool, str]:
    """(serving, one-line status) of ``service`` at ``address`` (health is an open method: no token)."""
    with _channel(address, tls_ca, server_name) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            return False, f"{address}: {e.code().name}: {e.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    host, sep, port = args.address.rpartition(":")
    if not sep or not host or not port.isdigit():
        print(f"healthcheck: address must be HOST:PORT, got {args.address!r}", file=sys.stderr)
        return 2
    if args.tls_ca is not None and not args.tls_ca.is_file():
        print(f"healthcheck: TLS CA not found: {args.tls_ca}", file=sys.stderr)
        return 2
    ok, line = check(args.address, args.service, args.timeout, args.tls_ca, args.tls_server_name)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
