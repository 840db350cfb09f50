"""Transport security and worker authentication for every gRPC link (aggregator, estimator, workers).

* TLS: :func:`server_credentials` / :func:`channel_credentials` from PEM paths, optional mutual TLS.
* Authentication: a worker proves who it is with a bearer token (gRPC metadata
  ``authorization: Bearer <token>``) or with its client certificate (CN/SAN, under mutual TLS).
  :class:`AuthInterceptor` rejects unknown or revoked workers with UNAUTHENTICATED and logs the method,
  peer and worker id — never the token. Tokens are hashed on load and compared with
  ``hmac.compare_digest``; the revocation list is re-read whenever the tokens file changes.
* Redaction: :class:`RedactingFilter` scrubs bearer tokens (and known secrets) from log lines;
  :func:`redact_config` scrubs a config for display on the dashboard.

Settings come from flags, falling back to ``FEDENT_*`` environment variables — read here, at the process
edge, never in the core (``fedent/``).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("fedent.security")

# Methods that stay open: load balancers and operators must be able to probe a secured server.
OPEN_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
REDACTED = "***"
ENV = {
    "cert": "FEDENT_TLS_CERT",
    "key": "FEDENT_TLS_KEY",
    "ca": "FEDENT_TLS_CA",
    "require_client_auth": "FEDENT_REQUIRE_CLIENT_AUTH",
    "token_file": "FEDENT_TOKEN_FILE",
    "insecure": "FEDENT_INSECURE",
    "server_name": "FEDENT_TLS_SERVER_NAME",
}
_BEARER = re.compile(r"(?i)\b(bearer)(\s+|%20|\+)[A-Za-z0-9._~+/=-]+")
_AUTH_KV = re.compile(r"(?i)(['\"]?(?:authorization|token)['\"]?\s*[:=]\s*['\"]?)(?!bearer\b)([A-Za-z0-9._~+/=-]{8,})")
_SECRET_KEY = re.compile(
    r"(?i)(token|secret|password|passwd|credential|private|api[_-]?key|authorization|(^|[_.-])key($|[_.-]))"
)


class SecurityConfigError(ValueError):
    """Inconsistent or unusable security settings (one-line message for the CLI)."""


# ---- redaction ---------------------------------------------------------------------------------------

def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with bearer tokens, ``token=...``/``authorization: ...`` values and given secrets replaced."""
    out = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    out = _AUTH_KV.sub(lambda m: f"{m.group(1)}{REDACTED}", out)
    for s in secrets:
        if s and len(s) >= 8:
            out = out.replace(s, REDACTED)
    return out


class RedactingFilter(logging.Filter):
    """A logging filter that rewrites each record's final message with :func:`redact_text`.

    Attach it to handlers (``install_log_redaction``): a filter on a logger does not see records that
    propagate from child loggers, a filter on the handler sees everything it will print.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets: set[str] = {s for s in secrets if s}

    def add_secret(self, secret: str) -> None:
        if secret:
            self.secrets.add(secret)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the formatter's own error path
            return True
        clean = redact_text(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self.secrets)
        return True


def install_log_redaction(secrets: Iterable[str] = (), logger: logging.Logger | None = None) -> RedactingFilter:
    """Attach one :class:`RedactingFilter` to every handler of ``logger`` (default: root) and to the logger."""
    target = logger or logging.getLogger()
    filt = RedactingFilter(secrets)
    target.addFilter(filt)
    for h in target.handlers:
        h.addFilter(filt)
    return filt


def redact_config(obj: Any) -> Any:
    """A copy of a nested config for display: secret-looking keys become ``***``, strings are scrubbed."""
    if isinstance(obj, Mapping):
        return {k: (REDACTED if _SECRET_KEY.search(str(k)) and v not in (None, "", False)
                    else redact_config(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_config(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


# ---- tokens ------------------------------------------------------------------------------------------

def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _parse_tokens(data: Any, where: str) -> tuple[dict[str, str], frozenset[str]]:
    """``{"workers": {id: token | "sha256:<hex>"}, "revoked": [id, ...]}`` -> (id -> hash, revoked)."""
    if not isinstance(data, dict) or not isinstance(data.get("workers"), dict):
        raise SecurityConfigError(f"{where}: expected {{\"workers\": {{id: token}}, \"revoked\": [...]}}")
    hashes: dict[str, str] = {}
    for wid, value in data["workers"].items():
        if not isinstance(value, str) or not value:
            raise SecurityConfigError(f"{where}: worker {wid!r} has no token")
        if value.startswith("sha256:"):
            digest = value[len("sha256:"):].lower()
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise SecurityConfigError(f"{where}: worker {wid!r} has a malformed sha256 token hash")
            hashes[str(wid)] = digest
        else:
            hashes[str(wid)] = token_hash(value)
    revoked = data.get("revoked") or []
    if not isinstance(revoked, list) or not all(isinstance(r, str) for r in revoked):
        raise SecurityConfigError(f"{where}: 'revoked' must be a list of worker ids")
    return hashes, frozenset(revoked)


class TokenRegistry:
    """Known workers' token hashes and the revocation list, reloaded when the tokens file changes.

    Only hashes are kept in memory. A reload that fails to parse keeps the previous registry (and logs
    it), so a half-edited file cannot lock every worker out or let everyone in.
    """

    def __init__(self, path: str | Path, min_reload_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.min_reload_interval_s = min_reload_interval_s
        self._clock = clock
        self._hashes: dict[str, str] = {}
        self._revoked: frozenset[str] = frozenset()
        self._stamp: tuple[int, int] | None = None
        self._checked_at = float("-inf")
        self.reload(strict=True)

    @property
    def workers(self) -> list[str]:
        return sorted(self._hashes)

    @property
    def revoked(self) -> frozenset[str]:
        return self._revoked

    def reload(self, strict: bool = False) -> bool:
        """Re-read the file; returns whether it changed. ``strict``: errors raise instead of being logged."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return False
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                log.warning("tokens file %s is readable by group/others; chmod 600 it", self.path)
            data = json.loads(self.path.read_text())
            hashes, revoked = _parse_tokens(data, str(self.path))
        except (OSError, json.JSONDecodeError, SecurityConfigError) as e:
            msg = str(e) if isinstance(e, SecurityConfigError) else f"{self.path}: unreadable ({e.__class__.__name__})"
            if strict:
                raise SecurityConfigError(msg) from None
            log.error("keeping the previous worker tokens: %s", msg)
            return False
        changed = self._stamp is not None
        self._hashes, self._revoked, self._stamp = hashes, revoked, stamp
        if changed:
            log.info("reloaded worker tokens from %s: %d workers, %d revoked", self.path, len(hashes), len(revoked))
        return True

    def reload_if_due(self) -> None:
        now = self._clock()
        if now - self._checked_at >= self.min_reload_interval_s:
            self._checked_at = now
            self.reload()

    def identify(self, token: str) -> str | None:
        """The worker owning ``token`` (revoked or not), comparing hashes in constant time."""
        probe = token_hash(token)
        found = None
        for wid, h in self._hashes.items():  # no early exit: timing does not reveal the match position
            if hmac.compare_digest(probe, h):
                found = wid
        return found

    def is_known(self, worker: str) -> bool:
        return worker in self._hashes

    def is_revoked(self, worker: str) -> bool:
        return worker in self._revoked


def read_worker_token(path: str | Path, worker: str | None = None) -> str:
    """A worker's own token from a file: a tokens.json (picked by ``worker``) or a file holding just it."""
    p = Path(path)
    try:
        text = p.read_text().strip()
    except OSError as e:
        raise SecurityConfigError(f"cannot read token file {p} ({e.strerror})") from None
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise SecurityConfigError(f"{p}: not valid JSON") from None
        workers = data.get("workers") if isinstance(data, dict) else None
        if not isinstance(workers, dict):
            raise SecurityConfigError(f"{p}: no 'workers' mapping")
        if worker is None:
            raise SecurityConfigError(f"{p} holds several workers' tokens: say which worker this is (--worker-id)")
        token = workers.get(worker)
        if not isinstance(token, str) or not token or token.startswith("sha256:"):
            raise SecurityConfigError(f"{p} has no usable token for worker {worker!r}")
        return token
    if not text or any(c.isspace() for c in text):
        raise SecurityConfigError(f"{p} must hold exactly one token")
    return text


# ---- settings at the process edge -------------------------------------------------------------------

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
                   help="this worker's token: a file holding it, or tokens.json plus --worker-id")
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


# ---- credentials and channels -----------------------------------------------------------------------

def _read(path: Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def server_credentials(sec: ServerSecurity) -> grpc.ServerCredentials:
    assert sec.cert is not None and sec.key is not None
    return grpc.ssl_server_credentials(
        [(Path(sec.key).read_bytes(), Path(sec.cert).read_bytes())],
        root_certificates=_read(sec.ca),
        require_client_auth=sec.require_client_auth,
    )


def server_interceptors(sec: ServerSecurity) -> list[grpc.ServerInterceptor]:
    """The interceptors to pass to ``grpc.server(...)``: authentication when tokens or mTLS are configured."""
    if not sec.authenticates:
        if not sec.insecure:
            log.warning("TLS without worker authentication: any client trusting the CA may call this server")
        return []
    tokens = TokenRegistry(sec.token_file) if sec.token_file else None
    return [AuthInterceptor(tokens=tokens, accept_client_certs=sec.require_client_auth)]


def bind(server: grpc.Server, address: str, sec: ServerSecurity) -> int:
    """Add the listening port (TLS unless insecure); returns the bound port (address may use port 0)."""
    if sec.insecure:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, server_credentials(sec))
    if port == 0:
        raise SecurityConfigError(f"cannot listen on {address}")
    return port


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        callback(self._metadata, None)

    def __repr__(self) -> str:
        return "_BearerToken(***)"


def token_call_credentials(token: str) -> grpc.CallCredentials:
    """Per-call credentials that add ``authorization: Bearer <token>`` (gRPC sends them over TLS only)."""
    return grpc.metadata_call_credentials(_BearerToken(token), name="fedent-token")


def channel_credentials(sec: ClientSecurity) -> grpc.ChannelCredentials:
    creds = grpc.ssl_channel_credentials(root_certificates=_read(sec.ca), private_key=_read(sec.key),
                                         certificate_chain=_read(sec.cert))
    if sec.token:
        creds = grpc.composite_channel_credentials(creds, token_call_credentials(sec.token))
    return creds


class _MetadataClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds fixed metadata to every call: how a token travels on an explicitly insecure channel."""

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        md = list(details.metadata or []) + list(self._metadata)
        return _CallDetails(details.method, details.timeout, md, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


def open_channel(target: str, sec: ClientSecurity, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A channel to ``target`` with TLS (+ client cert, + token) or, if ``sec.insecure``, plaintext."""
    opts = list(options)
    if sec.insecure:
        channel = grpc.insecure_channel(target, options=opts)
        if sec.token:
            log.warning("sending a worker token over an insecure channel to %s (local experiments only)", target)
            channel = grpc.intercept_channel(channel, _MetadataClientInterceptor(
                [("authorization", f"Bearer {sec.token}")]))
        return channel
    if sec.server_name:
        opts.append(("grpc.ssl_target_name_override", sec.server_name))
    return grpc.secure_channel(target, channel_credentials(sec), options=opts)


# ---- server-side authentication ---------------------------------------------------------------------

def bearer_token(metadata: Iterable[Any] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry, or None."""
    for item in metadata or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if str(key).lower() == "authorization" and isinstance(value, str):
            scheme, _, tok = value.strip().partition(" ")
            if scheme.lower() == "bearer" and tok.strip():
                return tok.strip()
    return None


def peer_cert_identities(context: grpc.ServicerContext) -> list[str]:
    """CN and SANs of the verified client certificate (empty without mutual TLS)."""
    try:
        auth = context.auth_context()
    except Exception:
        return []
    if b"ssl" not in [v for v in auth.get("transport_security_type", [])]:
        return []
    names: list[str] = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for v in auth.get(key, []):
            s = v.decode() if isinstance(v, bytes) else str(v)
            if s not in names:
                names.append(s)
    return names


class AuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls from unknown or revoked workers with UNAUTHENTICATED (open methods pass through).

    The check runs inside the wrapped handler because only the handler's context exposes the peer's
    certificate (``auth_context``). A call is accepted when it carries the token of a known, unrevoked
    worker — and, if it also presents a client certificate, the certificate names the same worker — or,
    with ``accept_client_certs``, when it presents a CA-verified certificate of an unrevoked worker
    (known to the tokens file when there is one).
    """

    def __init__(self, tokens: TokenRegistry | None = None, accept_client_certs: bool = False,
                 open_prefixes: Sequence[str] = OPEN_METHOD_PREFIXES,
                 logger: logging.Logger | None = None) -> None:
        if tokens is None and not accept_client_certs:
            raise SecurityConfigError("authentication needs a tokens file or mutual TLS")
        self.tokens = tokens
        self.accept_client_certs = accept_client_certs
        self.open_prefixes = tuple(open_prefixes)
        self.log = logger or log

    def identify(self, context: grpc.ServicerContext) -> str | None:
        """The authenticated worker id of a call (for servicers), or None."""
        worker, _ = self._authenticate(bearer_token(context.invocation_metadata()), context)
        return worker

    def _authenticate(self, token: str | None, context: grpc.ServicerContext) -> tuple[str | None, str]:
        """(worker, "") if accepted, else (worker or None, reason)."""
        if self.tokens is not None:
            self.tokens.reload_if_due()
        cert_ids = peer_cert_identities(context)
        if token is not None:
            worker = self.tokens.identify(token) if self.tokens is not None else None
            if worker is None:
                return None, "unknown token"
            if cert_ids and worker not in cert_ids:
                return worker, f"token of {worker} presented with the certificate of {cert_ids[0]}"
        elif self.accept_client_certs and cert_ids:
            known = [c for c in cert_ids if self.tokens is None or self.tokens.is_known(c)]
            if not known:
                return None, f"certificate of unknown worker {cert_ids[0]}"
            worker = known[0]
        else:
            return None, "no credentials"
        if self.tokens is not None and self.tokens.is_revoked(worker):
            return worker, "revoked"
        return worker, ""

    def _check(self, method: str, token: str | None, context: grpc.ServicerContext) -> None:
        worker, reason = self._authenticate(token, context)
        if reason:
            self.log.warning("rejected %s from %s (worker %s): %s", method, context.peer(), worker or "?", reason)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked worker credentials")

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(self.open_prefixes):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        return _wrap_handler(handler, lambda ctx: self._check(method, token, ctx))


def _wrap_handler(handler: grpc.RpcMethodHandler, check: Callable[[grpc.ServicerContext], None]) -> Any:
    """The same handler with ``check(context)`` run before its behaviour (all four call shapes).

    Streamed responses are checked again before each message, so a worker revoked while its long-lived
    Work stream is open loses that stream at its next task instead of keeping it for the rest of the run.
    """
    if handler.unary_unary:
        inner_uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            return inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer,
                                                   handler.response_serializer)
    if handler.unary_stream:
        inner_us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            for response in inner_us(request, context):
                check(context)
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, handler.request_deserializer,
                                                    handler.response_serializer)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        def stream_unary(request_iterator: Any, context: grpc.ServicerContext) -> Any:
            check(context)
            return inner_su(request_iterator, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, handler.request_deserializer,
                                                    handler.response_serializer)
    inner_ss = handler.stream_stream

    def stream_stream(request_iterator: Any, context: grpc.ServicerContext) -> Any:
        check(context)
        for response in inner_ss(request_iterator, context):
            check(context)
            yield response

    return grpc.stream_stream_rpc_method_handler(stream_stream, handler.request_deserializer,
                                                 handler.response_serializer)
