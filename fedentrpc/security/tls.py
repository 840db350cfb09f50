"""TLS on the wire: credentials from PEM paths (optionally mutual TLS), binding a server's port and
opening a client channel, TLS unless a setting says ``insecure`` explicitly."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.flags import ClientSecurity, ServerSecurity
from fedentrpc.security.interceptors import MetadataClientInterceptor, bearer_metadata, token_call_credentials

log = logging.getLogger("fedent.security")


def _read(path: Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def server_credentials(sec: ServerSecurity) -> grpc.ServerCredentials:
    assert sec.cert is not None and sec.key is not None
    return grpc.ssl_server_credentials(
        [(Path(sec.key).read_bytes(), Path(sec.cert).read_bytes())],
        root_certificates=_read(sec.ca),
        require_client_auth=sec.require_client_auth,
    )


def bind(server: grpc.Server, address: str, sec: ServerSecurity) -> int:
    """Add the listening port (TLS unless insecure); returns the bound port (address may use port 0)."""
    if sec.insecure:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, server_credentials(sec))
    if port == 0:
        raise SecurityConfigError(f"cannot listen on {address}")
    return port


def channel_credentials(sec: ClientSecurity) -> grpc.ChannelCredentials:
    creds = grpc.ssl_channel_credentials(root_certificates=_read(sec.ca), private_key=_read(sec.key),
                                         certificate_chain=_read(sec.cert))
    if sec.token:
        creds = grpc.composite_channel_credentials(creds, token_call_credentials(sec.token))
    return creds


def open_channel(target: str, sec: ClientSecurity, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A channel to ``target`` with TLS (+ client cert, + token) or, if ``sec.insecure``, plaintext."""
    opts = list(options)
    if sec.insecure:
        channel = grpc.insecure_channel(target, options=opts)
        if sec.token:
            log.warning("sending a worker token over an insecure channel to %s (local experiments only)", target)
            channel = grpc.intercept_channel(channel, MetadataClientInterceptor(bearer_metadata(sec.token)))
        return channel
    if sec.server_name:
        opts.append(("grpc.ssl_target_name_override", sec.server_name))
    return grpc.secure_channel(target, channel_credentials(sec), options=opts)
