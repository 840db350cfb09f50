"""gRPC channel and server options shared by every fedent service and its clients.

One message-size limit for every link, so that a sender can never emit a message its peer refuses:
tensor chunks are at most 4 MiB, the limit leaves headroom for a chunk's header.
"""

from __future__ import annotations

from typing import Any

MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # chunks are ≤ 4 MiB; headroom for the chunk's header
KEEPALIVE_TIME_MS = 30_000  # long-lived streams (Work, Oracle) through NATs and idle-timeout proxies


def grpc_options(keepalive: bool = False) -> list[tuple[str, Any]]:
    """Options for ``grpc.server(...)`` and channels: the message-size limits, plus client keepalive pings
    (``keepalive=True``, for a worker's long-lived streams) sent even while no call is open."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if keepalive:
        options += [("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS), ("grpc.keepalive_permit_without_calls", 1)]
    return options
