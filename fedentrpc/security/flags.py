"""Security settings at the process edge: ``ServerSecurity`` / ``ClientSecurity``, their command-line flags
and the ``FEDENT_*`` environment variables they fall back to.

The environment is read here, where a service parses its command line, never in the core (``fedent/``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.tokens import read_worker_token

ENV = {
    "cert": "FEDENT_TLS_CERT",
    "key": "FEDENT_TLS_KEY",
    "ca": "FEDENT_TLS_CA",
    "require_client_auth": "FEDENT_REQUIRE_CLIENT_AUTH",
    "token_file": "FEDENT_TOKEN_FILE",
    "insecure": "FEDENT_INSECURE",
    "server_name": "FEDENT_TLS_SERVER_NAME",
}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _existing(path: str | Path | None, what: str) -> Path | None:
    if path is None or str(path) == "":
        return None
    p = Path(path)
    if not p.is_file():
        raise SecurityConfigError(f"{what} not found: {p}")
    return p


@dataclass(frozen=True)
class ServerSecurity:
    """How a gRPC server listens: TLS files, mutual TLS, the tokens file; or explicitly insecure."""

    insecure: bool = False
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None  # verifies client certificates (mutual TLS)
    require_client_auth: bool = False
    token_file: Path | None = None

    def validate(self) -> ServerSecurity:
        if self.insecure:
            if self.cert or self.key or self.require_client_auth:
                raise SecurityConfigError("--insecure excludes --tls-cert, --tls-key and --require-client-auth")
        else:
            if not (self.cert and self.key):
                raise SecurityConfigError("TLS needs --tls-cert and --tls-key (or --insecure for local experiments)")
            if self.require_client_auth and not self.ca:
                raise SecurityConfigError("--require-client-auth needs --tls-ca to verify client certificates")
        for p, what in ((self.cert, "TLS certificate"), (self.key, "TLS key"), (self.ca, "TLS CA"),
                        (self.token_file, "tokens file")):
            _existing(p, what)
        return self

    @property
    def authenticates(self) -> bool:
        return self.token_file is not None or self.require_client_auth


@dataclass(frozen=True)
class ClientSecurity:
    """How a gRPC client connects: the CA to trust, an optional client certificate, an optional token."""

    insecure: bool = False
    ca: Path | None = None
    cert: Path | None = None  # client certificate for mutual TLS
    key: Path | None = None
    token: str | None = field(default=None, repr=False)
    server_name: str | None = None  # expected name in the server certificate, if not the target host

    def validate(self) -> ClientSecurity:
        if self.insecure:
            if self.ca or self.cert or self.key:
                raise SecurityConfigError("--insecure cannot be combined with --tls-ca/--tls-cert/--tls-key")
        else:
            if not self.ca:
                raise SecurityConfigError("TLS needs --tls-ca to verify the server (or pass --insecure)")
            if bool(self.cert) != bool(self.key):
                raise SecurityConfigError("a client certificate needs both --tls-cert and --tls-key")
        for p, what in ((self.ca, "TLS CA"), (self.cert, "TLS certificate"), (self.key, "TLS key")):
            _existing(p, what)
        return self


def add_server_security_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("security (flags override FEDENT_TLS_* / FEDENT_TOKEN_FILE / FEDENT_INSECURE)")
    g.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM)")
    g.add_argument("--tls-key", type=Path, default=None, help="server private key (PEM)")
    g.add_argument("--tls-ca", type=Path, default=None, help="CA that signs client certificates (mutual TLS)")
    g.add_argument("--require-client-auth", action="store_true", default=None,
                   help="mutual TLS: refuse clients without a certificate signed by --tls-ca")
    g.add_argument("--token-file", type=Path, default=None,
                   help="tokens.json of accepted workers; calls need 'authorization: Bearer <token>'")
    g.add_argument("--insecure", action="store_true", default=None,
                   help="plaintext, for local experiments only")


def add_client_security_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("security (flags override FEDENT_TLS_* / FEDENT_TOKEN_FILE / FEDENT_INSECURE)")
    g.add_argument("--tls-ca", type=Path, default=None, help="CA certificate that signed the server's (PEM)")
    g.add_argument("--tls-cert", type=Path, default=None, help="client certificate for mutual TLS (PEM)")
    g.add_argument("--tls-key", type=Path, default=None, help="client private key for mutual TLS (PEM)")
    g.add_argument("--tls-server-name", default=None, help="name to expect in the server certificate")
    g.add_argument("--token-file", type=Path, default=None,
                   help="this worker's token: a file holding it, or tokens.json (the entry of the worker's --name)")
    g.add_argument("--insecure", action="store_true", default=None,
                   help="plaintext, for local experiments only")


def _path(value: Path | None, env: Mapping[str, str], var: str) -> Path | None:
    if value is not None:
        return Path(value)
    raw = env.get(var, "").strip()
    return Path(raw) if raw else None


def _flag(value: bool | None, env: Mapping[str, str], var: str) -> bool:
    return bool(value) if value is not None else _truthy(env.get(var))


def server_security_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ServerSecurity:
    """Flags from :func:`add_server_security_args`, each falling back to its ``FEDENT_*`` variable."""
    env = os.environ if env is None else env
    return ServerSecurity(
        insecure=_flag(getattr(args, "insecure", None), env, ENV["insecure"]),
        cert=_path(getattr(args, "tls_cert", None), env, ENV["cert"]),
        key=_path(getattr(args, "tls_key", None), env, ENV["key"]),
        ca=_path(getattr(args, "tls_ca", None), env, ENV["ca"]),
        require_client_auth=_flag(getattr(args, "require_client_auth", None), env, ENV["require_client_auth"]),
        token_file=_path(getattr(args, "token_file", None), env, ENV["token_file"]),
    ).validate()


def client_security_from_args(args: argparse.Namespace, worker: str | None = None,
                              env: Mapping[str, str] | None = None) -> ClientSecurity:
    """Flags from :func:`add_client_security_args` (+ env fallbacks); reads this worker's token."""
    env = os.environ if env is None else env
    token_file = _path(getattr(args, "token_file", None), env, ENV["token_file"])
    return ClientSecurity(
        insecure=_flag(getattr(args, "insecure", None), env, ENV["insecure"]),
        ca=_path(getattr(args, "tls_ca", None), env, ENV["ca"]),
        cert=_path(getattr(args, "tls_cert", None), env, ENV["cert"]),
        key=_path(getattr(args, "tls_key", None), env, ENV["key"]),
        token=read_worker_token(token_file, worker) if token_file else None,
        server_name=getattr(args, "tls_server_name", None) or env.get(ENV["server_name"]) or None,
    ).validate()
