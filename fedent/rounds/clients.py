"""clients.json as one object: the rows the dashboard shows, written by the engine and by the executor.

The engine records what a round did (participation, bytes, η); the executor records where clients run
(worker, device, registered, down). Both write through here, under one lock, so no row is half-updated.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedent import runlog
from fedent.rounds.acceptance import REJECTED
from fedent.strategies.base import ClientUpdate

ACTIVE = ("training", "done")  # states a round sets; after the round a client not taken is idle again


class ClientBook:
    def __init__(self, path: Path, sizes: Sequence[int], **defaults: Any) -> None:
        self.path = path
        self.lock = threading.RLock()
        self._write_lock = threading.Lock()  # file writes only: updates never wait for the disk
        self.rows: list[dict[str, Any]] = [
            runlog.client_row(cid, samples=n, participation=0, bytes=0, **defaults) for cid, n in enumerate(sizes)]

    def update(self, cids: Iterable[int], **values: Any) -> None:
        with self.lock:
            for c in cids:
                self.rows[c].update(values)

    def add_bytes(self, cid: int, n: int) -> None:
        with self.lock:
            self.rows[cid]["bytes"] = (self.rows[cid]["bytes"] or 0) + int(n)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(r) for r in self.rows]

    def write(self) -> None:
        """Snapshot and file in one order: a writer that snapshotted earlier can never land its older rows
        over a later writer's (the rounds thread and the servicers' threads all write)."""
        with self._write_lock:
            runlog.write_clients(self.path, self.snapshot())

    def record_round(self, rnd: int, updates: Sequence[ClientUpdate], download_bytes: int,
                     failed: Mapping[int, str] | None = None) -> None:
        """Clients whose update was aggregated: done, one more participation, the model download counted
        (their upload was counted by the executor as it arrived); those that failed: ``last_failure`` says
        the round and why, and a rejected upload's client is ``rejected``; the others that were busy: idle."""
        taken = {u.cid: u for u in updates}
        failed = failed or {}
        with self.lock:
            for row in self.rows:
                u = taken.get(row["cid"])
                why = failed.get(row["cid"])
                if why is not None:
                    row["last_failure"] = f"round {rnd + 1}: {why}"[:300]
                if u is None:
                    if why is not None and why.startswith(REJECTED):
                        row["state"] = "rejected"
                    elif row["state"] in ACTIVE:
                        row["state"] = "idle"
                    continue
                row["state"] = "done"
                row["participation"] += 1
                row["bytes"] = (row["bytes"] or 0) + download_bytes
                row["eta"] = u.scalars.get("eta", row["eta"])
                row["eta_star"] = u.scalars.get("eta_star", row["eta_star"])
                row["last_round"] = rnd + 1  # 1..R, as every round number written (runlog)
        self.write()
