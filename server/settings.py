"""Validated settings at the aggregator's process edge (unknown keys are errors, values are range-checked)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedentrpc.codec import TransferSpec


class SettingsError(ValueError):
    """A bad process setting; the message is one line naming the setting."""


@dataclass(frozen=True)
class AggregatorSettings:
    """How the aggregator runs (the experiment itself is the ExperimentConfig)."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port (tests, the launcher)
    token: str = ""  # registration token hook; empty = no check
    round_deadline_s: float = 600.0  # a round's results after this are ignored (stragglers)
    quorum: float = 0.5  # fraction of the round's participants that must report for the round to count
    register_timeout_s: float = 300.0  # how long to wait until every client is hosted by a ready worker
    heartbeat_s: float = 10.0
    heartbeat_misses: int = 3  # a worker silent this many heartbeat periods is dead (clients down); 0 = never
    round_retries: int = -1  # quorum missed: -1 skip the round (model kept); N >= 0 retry with fresh clients
    # N times, then fail the run
    wire_dtype: str = "native"
    compression: str = "none"
    chunk_bytes: int = 4 * 1024 * 1024
    estimator: str = ""  # HOST:PORT of the estimator service; empty = in-process fallback
    max_workers: int = 128  # gRPC thread pool; every connected worker's Work stream holds one thread
    stop_workers_when_done: bool = True
    checkpoint_keep: int = 2  # checkpoints kept in runs/<id>/checkpoint/ (resume); 0 = no checkpoints

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"port must be in [0, 65535], got {self.port}")
        if self.round_deadline_s <= 0:
            raise SettingsError("round_deadline_s must be > 0")
        if not 0.0 <= self.quorum <= 1.0:
            raise SettingsError(f"quorum must be in [0, 1], got {self.quorum}")
        if self.register_timeout_s <= 0:
            raise SettingsError("register_timeout_s must be > 0")
        if self.heartbeat_s <= 0:
            raise SettingsError("heartbeat_s must be > 0")
        if self.heartbeat_misses < 0:
            raise SettingsError("heartbeat_misses must be >= 0")
        if self.round_retries < -1:
            raise SettingsError("round_retries must be >= -1 (-1: skip a round that misses its quorum)")
        if self.checkpoint_keep < 0:
            raise SettingsError("checkpoint_keep must be >= 0")
        if self.max_workers < 8:
            raise SettingsError("max_workers must be >= 8")
        try:
            self.transfer()
        except ValueError as e:
            raise SettingsError(str(e)) from None

    def transfer(self) -> TransferSpec:
        return TransferSpec(wire_dtype=self.wire_dtype, compression=self.compression, chunk_bytes=self.chunk_bytes)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> AggregatorSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise SettingsError(
                f"unknown aggregator setting(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
        return cls(**dict(raw))
