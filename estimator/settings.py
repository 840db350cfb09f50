"""Validated settings at the estimator service's process edge (range-checked, one-line errors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedentrpc.security.flags import ServerSecurity


class SettingsError(ValueError):
    """A bad process setting; the message is one line naming the setting."""


@dataclass(frozen=True)
class EstimatorSettings:
    """How the estimator service runs; the solver's knobs arrive with each request instead."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port (tests, the launcher)
    token: str = ""  # workers' Oracle streams must present it when set
    max_workers: int = 64  # gRPC thread pool; every open Oracle stream holds one thread
    oracle_timeout_s: float = 600.0  # deadline of one gradient request to a worker
    oracle_retries: int = 2  # re-sends of a gradient request after a timeout, error or lost worker
    oracle_prefetch: int = 16  # clients asked at once at the same point (bounds memory: prefetch x model size)
    wait_workers_s: float = 300.0  # default wait for the workers' Oracle streams to cover every client
    blob_cache_bytes: int = 8 * 1024**3  # oldest blobs are dropped beyond this many wire bytes
    run_dir: str | None = None  # finished offline jobs are written here (and served after a restart)
    # TLS / mutual TLS / tokens (docs/security.md); in-process callers (tests) default to plaintext
    security: ServerSecurity = field(default_factory=lambda: ServerSecurity(insecure=True))

    def __post_init__(self) -> None:
        if not self.host:
            raise SettingsError("host must not be empty")
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        if self.max_workers < 4:
            raise SettingsError(f"max_workers must be >= 4, got {self.max_workers}")
        if not self.oracle_timeout_s > 0:
            raise SettingsError(f"oracle_timeout_s must be > 0, got {self.oracle_timeout_s}")
        if self.oracle_retries < 0:
            raise SettingsError(f"oracle_retries must be >= 0, got {self.oracle_retries}")
        if self.oracle_prefetch < 1:
            raise SettingsError(f"oracle_prefetch must be >= 1, got {self.oracle_prefetch}")
        if self.wait_workers_s < 0:
            raise SettingsError(f"wait_workers_s must be >= 0, got {self.wait_workers_s}")
        if self.blob_cache_bytes < 1:
            raise SettingsError(f"blob_cache_bytes must be >= 1, got {self.blob_cache_bytes}")
