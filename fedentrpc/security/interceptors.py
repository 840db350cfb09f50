"""Who is calling: bearer tokens on the wire and the interceptors that add and check them.

* Client side: :func:`token_call_credentials` adds ``authorization: Bearer <token>`` to every call over
  TLS; :class:`MetadataClientInterceptor` does the same on an explicitly insecure channel.
* Server side: :class:`AuthInterceptor` rejects unknown or revoked workers with UNAUTHENTICATED and logs
  the method, peer and worker id (never the token). A call whose metadata already decides (no credentials
  where tokens are required, an unknown or revoked token) is refused on a small pool of its own before
  any work thread is taken, so a flood of them cannot queue ahead of honest calls. A worker proves who it
  is with its token or, under mutual TLS, with its client certificate (CN/SAN). Health and reflection
  stay open for probes. The servicer learns who that is with :func:`caller_identity` (None when nothing authenticates).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from fedentrpc.handlers import Behaviour, rewrap
from fedentrpc.malformed import MalformedRequestInterceptor
from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.security.tokens import TokenRegistry

log = logging.getLogger("fedent.security")

# Methods that stay open: load balancers and operators must be able to probe a secured server.
OPEN_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


# ---- client side -------------------------------------------------------------------------------------

def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata entry that carries ``token``."""
    return (("authorization", f"Bearer {token}"),)


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        callback(self._metadata, None)

    def __repr__(self) -> str:
        return "_BearerToken(***)"


def token_call_credentials(token: str) -> grpc.CallCredentials:
    """Per-call credentials that add ``authorization: Bearer <token>`` (gRPC sends them over TLS only)."""
    return grpc.metadata_call_credentials(_BearerToken(token), name="fedent-token")


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class MetadataClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds fixed metadata to every call: how a token travels on an explicitly insecure channel."""

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def __repr__(self) -> str:
        return f"MetadataClientInterceptor({len(self._metadata)} entries)"

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


# ---- server side -------------------------------------------------------------------------------------

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


def auth_interceptors(sec: ServerSecurity) -> list[grpc.ServerInterceptor]:
    """``[AuthInterceptor]`` when tokens or mTLS are configured, else ``[]`` (with a warning for TLS without
    worker authentication)."""
    if not sec.authenticates:
        if not sec.insecure:
            log.warning("TLS without worker authentication: any client trusting the CA may call this server")
        return []
    tokens = TokenRegistry(sec.token_file) if sec.token_file else None
    return [AuthInterceptor(tokens=tokens, accept_client_certs=sec.require_client_auth)]


def server_interceptors(sec: ServerSecurity, max_streams_per_identity: int = 0) -> list[grpc.ServerInterceptor]:
    """Authentication when tokens or mTLS are configured, then (with authentication and
    ``max_streams_per_identity`` > 0) the per-identity stream limit (:mod:`fedentrpc.stream_limit`), then
    (always, inside them) :class:`~fedentrpc.malformed.MalformedRequestInterceptor`, so a request that does
    not parse is INVALID_ARGUMENT with one log line, after authentication. The services build their servers
    with :func:`fedentrpc.serving.create_server`, which adds the pools, the other limits and the deadlines."""
    guard = MalformedRequestInterceptor()
    auth = auth_interceptors(sec)
    if not auth:
        return [guard]
    from fedentrpc.stream_limit import StreamLimitInterceptor  # it reads caller_identity from this module

    if max_streams_per_identity > 0:
        return [*auth, StreamLimitInterceptor(max_streams_per_identity), guard]
    return [*auth, guard]


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
        # refusals decided from the metadata run here, never on the work pool (gRPC's per-method pool hook)
        self.refusal_pool = futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="refuse")

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

    def _check(self, method: str, token: str | None, context: grpc.ServicerContext) -> str:
        worker, reason = self._authenticate(token, context)
        if reason or worker is None:
            self.log.warning("rejected %s from %s (worker %s): %s", method, context.peer(), worker or "?", reason)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked worker credentials")
            raise AssertionError("unreachable")  # abort raises
        return worker

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(self.open_prefixes):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        worker, reason = self._precheck(token)
        if reason:
            return self._refusal(handler, method, worker, reason)
        return _wrap_handler(handler, lambda ctx: self._check(method, token, ctx))

    def _precheck(self, token: str | None) -> tuple[str | None, str]:
        """(worker, reason) when the metadata alone refuses the call; reason '' when the call goes on to the
        full check (a client certificate can only be seen inside the call)."""
        if token is None:
            return None, "" if self.accept_client_certs else "no credentials"
        if self.tokens is None:
            return None, "unknown token"
        self.tokens.reload_if_due()
        worker = self.tokens.identify(token)
        if worker is None:
            return None, "unknown token"
        return worker, "revoked" if self.tokens.is_revoked(worker) else ""

    def _refusal(self, handler: grpc.RpcMethodHandler, method: str, worker: str | None, reason: str) -> Any:
        """``handler``'s shape, answering UNAUTHENTICATED at once on :attr:`refusal_pool`."""

        def wrap(inner: Behaviour, request_streaming: bool, response_streaming: bool) -> Behaviour:
            def refuse(request: Any, context: grpc.ServicerContext) -> Any:
                self.log.warning("rejected %s from %s (worker %s): %s", method, context.peer(), worker or "?",
                                 reason)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked worker credentials")

            refuse.experimental_thread_pool = self.refusal_pool  # type: ignore[attr-defined]
            return refuse

        return rewrap(handler, wrap)


class IdentifiedContext:
    """A servicer context that also carries the caller's authenticated worker id (``fedent_identity``).

    The interceptor hands this to the servicer in place of gRPC's context; everything else is delegated.
    A per-call object rather than a contextvar: nothing can leak from one call to the next on a pooled
    thread, and a stream's generator sees the identity whichever thread resumes it.
    """

    def __init__(self, context: grpc.ServicerContext, identity: str) -> None:
        self._context = context
        self.fedent_identity = identity

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def __repr__(self) -> str:
        return f"IdentifiedContext({self.fedent_identity!r})"


def caller_identity(context: Any) -> str | None:
    """The worker id the call's credentials name (token or client certificate), or None when the server
    does not authenticate (plaintext local runs, in-process tests)."""
    identity = getattr(context, "fedent_identity", None)
    return identity if isinstance(identity, str) and identity else None


def _wrap_handler(handler: grpc.RpcMethodHandler, check: Callable[[grpc.ServicerContext], str]) -> Any:
    """The same handler with ``check(context)`` run before its behaviour (all four call shapes); the
    servicer gets an :class:`IdentifiedContext` naming the worker ``check`` authenticated.

    Streamed responses are checked again before each message, so a worker revoked while its long-lived
    Work stream is open loses that stream at its next task instead of keeping it for the rest of the run.
    """

    def wrap(inner: Behaviour, request_streaming: bool, response_streaming: bool) -> Behaviour:
        if response_streaming:
            def streaming(request: Any, context: grpc.ServicerContext) -> Any:
                ident = IdentifiedContext(context, check(context))
                for response in inner(request, ident):
                    check(context)
                    yield response

            return streaming

        def single(request: Any, context: grpc.ServicerContext) -> Any:
            return inner(request, IdentifiedContext(context, check(context)))

        return single

    return rewrap(handler, wrap)
