"""Durable per-client state for a worker: FedDyn's h_k, SCAFFOLD's c_i, FedEnt's η_i(t−1).

Each save writes one checksummed file (same framing as :mod:`fedent.checkpoint`) atomically, tagged with
the round whose ``fit`` produced it. Keeping a few versions per client matters for resume: when the
aggregator restarts from its checkpoint of round r and re-runs round r+1, a worker that had already
fitted round r+1 must start from the state saved *before* r+1 (``load(cid, before_round=r + 1)``),
or FedDyn/SCAFFOLD would apply that round's correction twice.

A SIGKILL mid-save leaves only a temp file beside the previous version; temp files are never read.

``background=True`` (the simulator's store) takes the encoding and the fsynced writes off the round's critical path:
``save`` copies the state to the CPU at once (the caller may change its tensors afterwards) and a single writer
thread writes the files in the order saved. Every read waits for the writes before it, and ``flush`` (which the
engine calls before each checkpoint, so a checkpoint never points at states still in memory) waits for all and
raises a write's error, so a failed write fails the run instead of being lost.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from pathlib import Path
from typing import Any

from torch import Tensor

from fedent.checkpoint import CorruptStateError, encode_payload, read_state_file
from fedent.runlog import atomic_write_bytes
from fedent.strategies.base import ClientState

log = logging.getLogger(__name__)

_NAME = re.compile(r"^c(\d+)-r(\d+)\.state$")


class ClientStoreError(ValueError):
    """A stored client state is corrupt or malformed (one-line message naming the file)."""


def _state_to_payload(cid: int, rnd: int, state: ClientState) -> dict[str, Any]:
    if not isinstance(state, ClientState):
        raise TypeError(f"client {cid}: expected a ClientState, got {type(state).__name__}")
    tensors: dict[str, list[Tensor]] = {}
    for name, tl in state.tensors.items():
        if not isinstance(tl, (list, tuple)) or not all(isinstance(t, Tensor) for t in tl):
            raise TypeError(f"client {cid}: state tensors {name!r} must be a list of tensors")
        tensors[str(name)] = [t.detach().to("cpu").clone() for t in tl]
    scalars = {str(k): float(v) for k, v in state.scalars.items()}
    return {"kind": "client_state", "cid": int(cid), "round": int(rnd),
            "tensors": tensors, "scalars": scalars}


def _state_from_payload(payload: Any, cid: int, where: str) -> ClientState:
    if not isinstance(payload, dict) or payload.get("kind") != "client_state":
        raise ClientStoreError(f"{where}: not a client state file")
    if payload.get("cid") != cid:
        raise ClientStoreError(f"{where}: holds client {payload.get('cid')}, expected {cid}")
    tensors = payload.get("tensors")
    scalars = payload.get("scalars")
    if not isinstance(tensors, dict) or not isinstance(scalars, dict):
        raise ClientStoreError(f"{where}: malformed client state")
    for name, tl in tensors.items():
        if not isinstance(tl, list) or not all(isinstance(t, Tensor) for t in tl):
            raise ClientStoreError(f"{where}: tensors {name!r} is not a list of tensors")
    return ClientState(tensors={str(k): list(v) for k, v in tensors.items()},
                       scalars={str(k): float(v) for k, v in scalars.items()})


class ClientStateStore:
    """Versioned, atomic, per-client ``ClientState`` files under one directory (one store per worker)."""

    def __init__(self, directory: str | Path, keep: int = 3, background: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()
        self._queue: queue.Queue[tuple[int, int, dict[str, Any]] | None] | None = None
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        self._error_at: tuple[int, int] | None = None  # (client, round) of the write that failed
        if background:
            self._queue = queue.Queue()
            self._writer = threading.Thread(target=self._write_loop, name=f"client-state-writer-{self.directory.name}",
                                            daemon=True)
            self._writer.start()

    def path(self, cid: int, rnd: int) -> Path:
        return self.directory / f"c{int(cid):06d}-r{int(rnd):08d}.state"

    def versions(self, cid: int) -> list[int]:
        """Rounds with a saved state for ``cid``, newest first."""
        self.flush()
        return self._versions(cid)

    def _versions(self, cid: int) -> list[int]:
        return [r for c, r, _ in self._files() if c == cid]

    def cids(self) -> list[int]:
        self.flush()
        return sorted({c for c, _, _ in self._files()})

    def save(self, cid: int, state: ClientState, rnd: int) -> Path:
        """Persist the state produced by round ``rnd``'s fit; drops what it supersedes (:meth:`superseded`).
        In the background: the state is copied now and written by the writer thread (its path is returned)."""
        if rnd < 0 or cid < 0:
            raise ValueError(f"client id and round must be >= 0, got cid={cid} round={rnd}")
        payload = _state_to_payload(cid, rnd, state)
        if self._queue is not None:
            self._raise_failed()
            self._queue.put((cid, rnd, payload))
            return self.path(cid, rnd)
        return self._write(cid, rnd, payload)

    def _write(self, cid: int, rnd: int, payload: dict[str, Any]) -> Path:
        path = self.path(cid, rnd)
        atomic_write_bytes(path, encode_payload(payload))
        for old in self._superseded(cid, rnd):
            try:
                self.path(cid, old).unlink()
            except OSError:
                pass
        return path

    def flush(self) -> None:
        """Wait until every state saved so far is on disk; raises a background write's error (then and later)."""
        if self._queue is not None:
            self._queue.join()
            self._raise_failed()

    def close(self) -> None:
        """Wait for the pending writes, then end the writer thread (a closed store writes synchronously). For the
        end of a run, however it ended: a write's error was raised by ``flush`` already, so it is not raised here."""
        if self._queue is None:
            return
        q, self._queue = self._queue, None
        q.join()
        q.put(None)
        # the thread must be gone before the interpreter shuts down: a daemon thread still running then is stopped
        # inside the C++ it may be in, which aborted `fedent simulate` (exit -6, "terminate called without an active
        # exception") in 2 of 20 runs stopped by SIGINT
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def _write_loop(self) -> None:
        q = self._queue
        assert q is not None
        while True:
            item = q.get()
            try:
                if item is None:
                    return
                if self._error is None:  # after a failure nothing more is written: a later state must not
                    self._write(*item)  # land on disk without the one before it
            except BaseException as e:  # noqa: BLE001 - raised by the next save or flush, in the caller's thread
                self._error, self._error_at = e, (item[0], item[1]) if item is not None else None
            finally:
                q.task_done()

    def _raise_failed(self) -> None:
        if self._error is not None:
            which = f"client {self._error_at[0]}'s state of round {self._error_at[1]}" if self._error_at else "a state"
            raise ClientStoreError(f"writing {which} under {self.directory} failed (in the background): "
                                   f"{type(self._error).__name__}: {self._error}") from self._error

    def superseded(self, cid: int, rnd: int) -> list[int]:
        """See ``_superseded`` (after the pending writes)."""
        self.flush()
        return self._superseded(cid, rnd)

    def _superseded(self, cid: int, rnd: int) -> list[int]:
        """Versions a save at ``rnd`` makes useless: every later round (a timeline the aggregator abandoned by
        resuming earlier or starting over; keeping them by age deleted the state just saved, and a later
        ``load`` read the old run's), and all but the newest ``keep`` of the rest. ``keep`` must exceed the
        aggregator's ``checkpoint_keep``: a resume from its oldest checkpoint c replays round c+1 and needs
        the newest state saved before c+1, which the worker may have followed with two newer saves."""
        versions = self._versions(cid)
        return [r for r in versions if r > rnd] + [r for r in versions if r <= rnd][self.keep:]

    def load(self, cid: int, before_round: int | None = None) -> ClientState | None:
        """The newest state of ``cid`` (saved by a round < ``before_round`` if given), or None if none."""
        for rnd in self.versions(cid):
            if before_round is not None and rnd >= before_round:
                continue
            path = self.path(cid, rnd)
            try:
                payload = read_state_file(path)
            except CorruptStateError as e:
                raise ClientStoreError(str(e)) from None
            return _state_from_payload(payload, cid, str(path))
        return None

    def all(self, before_round: int | None = None) -> dict[int, ClientState]:
        """Every client's newest state (restricted like :meth:`load`)."""
        out: dict[int, ClientState] = {}
        for cid in self.cids():
            state = self.load(cid, before_round)
            if state is not None:
                out[cid] = state
        return out

    def delete(self, cid: int) -> None:
        for rnd in self.versions(cid):  # after the pending writes
            self.path(cid, rnd).unlink(missing_ok=True)

    def _files(self) -> list[tuple[int, int, Path]]:
        found = []
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m and p.is_file():
                found.append((int(m.group(1)), int(m.group(2)), p))
        return sorted(found, key=lambda x: (x[0], -x[1]))

    def _remove_stale_temps(self) -> None:
        for p in self.directory.glob(".*.tmp"):
            try:
                p.unlink()
                log.info("removed a temp file left by an interrupted save: %s", p.name)
            except OSError:
                pass
