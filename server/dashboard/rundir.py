"""Defensive, cached reads of a run directory.

The writer (simulator or aggregator) may be mid-write, may not have created a file yet, or may have
crashed; the dashboard must still answer. So every reader here turns a missing, partial or malformed file
into "no data" instead of an exception, and re-parses a file only when its mtime or size changed.
metrics.jsonl is append-only and can reach thousands of rounds, so it is read incrementally: only the
bytes appended since the last read are parsed (a torn last line is retried on the next read).
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

from fedent.runlog import RunPaths
from server.dashboard.models import RoundOut
from server.dashboard.records import round_row

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


def _parse_lines(chunk: bytes) -> list[RoundOut]:
    rows = []
    for line in chunk.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # garbage or not UTF-8: skip the line, keep the rest
            continue
        row = round_row(rec) if isinstance(rec, dict) else None
        if row is not None:
            rows.append(row)
    return rows


class MetricsTail:
    """metrics.jsonl as ``RoundOut`` rows, parsing only what was appended since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._ino = -1
        self._stamp: Stamp = (-1, -1)
        self._offset = 0  # end of the last complete line parsed
        self._rows: list[RoundOut] = []

    def rows(self) -> list[RoundOut]:
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError:
                self._ino, self._stamp, self._offset, self._rows = -1, (-1, -1), 0, []
                return []
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp and st.st_ino == self._ino:
                return self._rows
            if st.st_ino != self._ino or st.st_size < self._offset:  # replaced or truncated: start over
                self._offset, self._rows = 0, []
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    chunk = f.read()
            except OSError:
                return self._rows
            complete = chunk.rfind(b"\n") + 1  # a torn last line waits for its newline
            rows = self._rows + _parse_lines(chunk[:complete])
            self._offset += complete
            self._ino, self._stamp, self._rows = st.st_ino, stamp, rows
            return rows


@dataclass(frozen=True)
class Snapshot:
    """Everything the dashboard knows about a run at one moment (raw, unvalidated JSON values)."""

    run_id: str
    config: Any
    partition: Any
    rounds: list[RoundOut]  # metrics.jsonl, typed
    status: Any
    clients: Any
    estimator: Any


class RunDirReader:
    """Reads a run directory; re-parses a file only when its (mtime, size) stamp changes."""

    def __init__(self, root: Path) -> None:
        self.paths = RunPaths(Path(root))
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[Stamp, Any]] = {}
        self._metrics = MetricsTail(self.paths.metrics)

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

    def rounds(self) -> list[RoundOut]:
        return self._metrics.rows()

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
            rounds=self.rounds(),
            status=self.status(),
            clients=self.clients(),
            estimator=self.estimator(),
        )

    def stamps(self) -> dict[str, Stamp]:
        """Cheap change detection for the live event stream (stat calls only)."""
        return {name: file_stamp(self.root / name) for name in WATCHED_FILES}
