"""What the aggregator's registry and remote executor pass around: tasks, worker handles, result collectors.

Kept apart from ``server.engine`` so the servicer and tests can name these types without the run itself,
and so ``ClusterRun`` reads as the registry plus the executor.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedent.strategies.base import RoundPayload
from fedentrpc import codec


class ClusterError(Exception):
    """A rejected request; ``code``: invalid, conflict, unauthenticated, permission, precondition, not_found,
    exhausted, cut."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Task:
    """One unit of work pushed to a worker: probe or fit ``cids`` at the model blob of ``round``."""

    kind: str  # "probe" | "fit" | "evaluate" | "secagg" | "shutdown"
    task_id: int
    round: int
    cids: tuple[int, ...]
    model_blob: str = ""
    payload: RoundPayload | None = None
    payload_blob: str = ""
    deadline_unix: float = 0.0
    reason: str = ""
    failed: bool = False
    secagg: Mapping[int, bytes] | None = None  # secure aggregation: each named client's protocol message


@dataclass
class WorkerHandle:
    worker_id: str
    name: str
    cids: tuple[int, ...]
    device: str
    hostname: str
    identity: str | None = None  # the authenticated worker that registered it (None: no authentication)
    tasks: queue.Queue[Task | None] = field(default_factory=queue.Queue)
    ready: bool = False
    streaming: bool = False
    gone: bool = False
    last_seen: float = field(default_factory=time.time)
    bytes_down: int = 0
    bytes_up: int = 0


class Collector:
    """Results of one phase of one round; wakes the engine when every expected client has answered."""

    def __init__(self, task_ids: dict[int, int], rnd: int, kind: str) -> None:
        self.task_of = dict(task_ids)  # cid -> task id
        self.round = rnd
        self.kind = kind
        self.results: dict[int, Any] = {}
        self.failed: dict[int, str] = {}
        self.cond = threading.Condition()

    def _check(self, task_id: int, rnd: int, cid: int) -> None:
        if rnd != self.round or self.task_of.get(cid) != task_id:
            raise ClusterError("precondition", f"no open {self.kind} task {task_id} for client {cid} in round {rnd}")
        if cid in self.results or cid in self.failed:
            raise ClusterError("conflict", f"client {cid} already reported for round {rnd}")

    def check_open(self, task_id: int, rnd: int, cid: int) -> None:
        """Raise unless ``cid``'s ``task_id`` of round ``rnd`` is open here and not yet answered."""
        with self.cond:
            self._check(task_id, rnd, cid)

    def put(self, task_id: int, rnd: int, cid: int, value: Any) -> None:
        with self.cond:
            self._check(task_id, rnd, cid)
            self.results[cid] = value
            self.cond.notify_all()

    def fail(self, cid: int, why: str, task_id: int | None = None, rnd: int | None = None) -> None:
        with self.cond:
            if task_id is not None and rnd is not None:
                self._check(task_id, rnd, cid)
            if cid in self.task_of and cid not in self.results and cid not in self.failed:
                self.failed[cid] = why
                self.cond.notify_all()

    def done(self) -> bool:
        return len(self.results) + len(self.failed) >= len(self.task_of)

    def wait(self, deadline_mono: float, stop: threading.Event) -> None:
        with self.cond:
            while not self.done() and not stop.is_set():
                left = deadline_mono - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(timeout=left)
            for cid in self.task_of:
                if cid not in self.results and cid not in self.failed:
                    self.failed[cid] = "deadline"


@dataclass(frozen=True)
class Registration:
    worker_id: str
    run_id: str
    worker_config: Mapping[str, Any]  # the resolved config the workers rebuild theirs from (secrets redacted)
    partition_md5: str
    transfer: codec.TransferSpec
    heartbeat_s: float
    download_encoding: str = "full"  # server.settings.AggregatorSettings.download_encoding
