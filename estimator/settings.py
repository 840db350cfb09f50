"""Validated settings at the estimator service's process edge: declared like the config
(``fedent.config.Declared``); building them checks every field and raises one ``SettingsError`` naming
each bad setting."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedent.config import Declared, SettingsError, option
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.stream_limit import (
    StreamLimits,
    anonymous_streams_option,
    limits_of,
    open_stream_max_option,
    stream_idle_option,
)

__all__ = ["EstimatorSettings", "SettingsError"]


@dataclass(frozen=True)
class EstimatorSettings(Declared):
    """How the estimator service runs; the solver's knobs arrive with each request instead."""

    error_type = SettingsError

    host: str = option("127.0.0.1", "interface to bind")
    port: int = option(0, "port to bind; 0 picks a free port (tests, the launcher)", ge=0, le=65535)
    token: str = option("", "workers' Oracle streams must present it when set")
    max_workers: int = option(64, "gRPC thread pool; every open Oracle stream holds one thread", ge=4)
    max_streams_per_identity: int = option(8, ("open streaming calls (Oracle, blobs, health Watch...) one worker "
                                                "identity may hold at once, callers without credentials sharing "
                                                "one such budget; more get RESOURCE_EXHAUSTED. Only with worker "
                                                "authentication; 0 = no limit"), ge=0)
    max_anonymous_streams: int = anonymous_streams_option()
    stream_idle_s: float = stream_idle_option()
    open_stream_max_s: float = open_stream_max_option()
    oracle_timeout_s: float = option(600.0, "deadline of one gradient request to a worker", gt=0)
    oracle_retries: int = option(2, "re-sends of a gradient request after a timeout, error or lost worker", ge=0)
    oracle_prefetch: int = option(16, "clients asked at once at the same point (memory: prefetch x model size)",
                                  ge=1)
    wait_workers_s: float = option(300.0, "default wait for the workers' Oracle streams to cover every client",
                                   ge=0)
    blob_cache_bytes: int = option(8 * 1024**3, "oldest blobs are dropped beyond this many wire bytes", ge=1)
    run_dir: str | None = option(None, "finished offline jobs are written here (and served after a restart)")
    # TLS / mutual TLS / tokens (docs/security.md); in-process callers (tests) default to plaintext
    security: ServerSecurity = field(default_factory=lambda: ServerSecurity(insecure=True),
                                     metadata={"doc": "TLS / mutual TLS / tokens (docs/security.md)"})

    def checks(self) -> list[tuple[str, str]]:
        return [("host", "must not be empty")] if not self.host else []

    def stream_limits(self) -> StreamLimits:
        """The limits :func:`fedentrpc.serving.create_server` enforces (docs/security.md, "Resource limits")."""
        return limits_of(self)
