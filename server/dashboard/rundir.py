"""Defensive, cached reads of a run directory.

The writer (simulator or aggregator) may be mid-write, may not have created a file yet, or may have
crashed; the dashboard must still answer. So every reader here turns a missing, partial or malformed file
into "no data" instead of an exception, and re-parses a file only when its mtime or size changed.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedent.runlog import RunPaths, read_metrics

# The files whose changes the live page cares about (in the order a run creates them).
WATCHED_FILES = ("config.yaml", "partition.json", "status.json", "clients.json", "estimator.json", "metrics.jsonl")

Stamp = tuple[int, int]  # (mtime_ns, size); (-1, -1) when the file is missing


def file_stamp(path: Path) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1)
    return (st.st_mtime_ns, st.st_size)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, unreadable, half-written, not UTF-8
        return None


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None


def _load_metrics(path: Path) -> list[dict[str, Any]]:
    try:
        return read_metrics(path)  # skips a torn last line
    except (OSError, ValueError):
        return []


@dataclass(frozen=True)
class Snapshot:
    """Everything the dashboard knows about a run at one moment (raw, unvalidated JSON values)."""

    run_id: str
    config: Any
    partition: Any
    metrics: list[dict[str, Any]]
    status: Any
    clients: Any
    estimator: Any


class RunDirReader:
    """Reads a run directory; re-parses a file only when its (mtime, size) stamp changes."""

    def __init__(self, root: Path) -> None:
        self.paths = RunPaths(Path(root))
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[Stamp, Any]] = {}

    @property
    def root(self) -> Path:
        return self.paths.root

    def _cached(self, path: Path, load: Callable[[Path], Any], empty: Any) -> Any:
        stamp = file_stamp(path)
        if stamp == (-1, -1):
            return empty
        key = str(path)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        value = load(path)
        with self._lock:
            self._cache[key] = (stamp, value)
        return value

    def config(self) -> Any:
        return self._cached(self.paths.config, _load_yaml, None)

    def partition(self) -> Any:
        return self._cached(self.paths.partition, _load_json, None)

    def metrics(self) -> list[dict[str, Any]]:
        value = self._cached(self.paths.metrics, _load_metrics, [])
        return value if isinstance(value, list) else []

    def status(self) -> Any:
        return self._cached(self.paths.status, _load_json, None)

    def clients(self) -> Any:
        return self._cached(self.paths.clients, _load_json, None)

    def estimator(self) -> Any:
        return self._cached(self.paths.estimator, _load_json, None)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            run_id=self.paths.run_id,
            config=self.config(),
            partition=self.partition(),
            metrics=self.metrics(),
            status=self.status(),
            clients=self.clients(),
            estimator=self.estimator(),
        )

    def stamps(self) -> dict[str, Stamp]:
        """Cheap change detection for the live event stream (stat calls only)."""
        return {name: file_stamp(self.root / name) for name in WATCHED_FILES}
