"""Transport security for every gRPC link (aggregator, estimator, workers), shared by the three services.

It lives in the transport package, not in one service, so that ``client/`` and ``estimator/`` need not
import ``server/``. One module per concern; import from the module you need:

* :mod:`~fedentrpc.security.errors`: :class:`SecurityConfigError`, the one-line settings error.
* :mod:`~fedentrpc.security.flags`: ``ServerSecurity`` / ``ClientSecurity`` and their flags with
  ``FEDENT_*`` environment fallbacks, read at the process edge (never in the core).
* :mod:`~fedentrpc.security.tokens`: the workers' token registry (hashes, revocation, reload) and
  reading a worker's own token.
* :mod:`~fedentrpc.security.interceptors`: bearer tokens on the wire, the server's
  :class:`AuthInterceptor` (which hands servicers the caller's identity, read with ``caller_identity``)
  and the client's metadata interceptor for insecure channels.
* :mod:`~fedentrpc.security.tls`: credentials, binding a server port, opening a channel.
* :mod:`~fedentrpc.security.redaction`: scrubbing tokens and secrets from logs and configs.

Every module logs to ``fedent.security``.
"""
