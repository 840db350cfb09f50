"""Durable per-client state for a worker: FedDyn's h_k, SCAFFOLD's c_i, FedEnt's η_i(t−1).

Each save writes one checksummed file (same framing as :mod:`fedent.checkpoint`) atomically, tagged with
the round whose ``fit`` produced it. Keeping a few versions per client matters for resume: when the
aggregator restarts from its checkpoint of round r and re-runs round r+1, a worker that had already
fitted round r+1 must start from the state saved *before* r+1 (``load(cid, before_round=r + 1)``),
or FedDyn/SCAFFOLD would apply that round's correction twice.

A SIGKILL mid-save leaves only a temp file beside the previous version; temp files are never read.
"""

from __future__ import annotations

import logging
import re
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

    def __init__(self, directory: str | Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()

    def path(self, cid: int, rnd: int) -> Path:
        return self.directory / f"c{int(cid):06d}-r{int(rnd):08d}.state"

    def versions(self, cid: int) -> list[int]:
        """Rounds with a saved state for ``cid``, newest first."""
        return [r for c, r, _ in self._files() if c == cid]

    def cids(self) -> list[int]:
        return sorted({c for c, _, _ in self._files()})

    def save(self, cid: int, state: ClientState, rnd: int) -> Path:
        """Persist the state produced by round ``rnd``'s fit; drops what it supersedes (:meth:`superseded`)."""
        if rnd < 0 or cid < 0:
            raise ValueError(f"client id and round must be >= 0, got cid={cid} round={rnd}")
        path = self.path(cid, rnd)
        atomic_write_bytes(path, encode_payload(_state_to_payload(cid, rnd, state)))
        for old in self.superseded(cid, rnd):
            try:
                self.path(cid, old).unlink()
            except OSError:
                pass
        return path

    def superseded(self, cid: int, rnd: int) -> list[int]:
        """Versions a save at ``rnd`` makes useless: every later round (a timeline the aggregator abandoned by
        resuming earlier or starting over; keeping them by age deleted the state just saved, and a later
        ``load`` read the old run's), and all but the newest ``keep`` of the rest. ``keep`` must exceed the
        aggregator's ``checkpoint_keep``: a resume from its oldest checkpoint c replays round c+1 and needs
        the newest state saved before c+1, which the worker may have followed with two newer saves."""
        versions = self.versions(cid)
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
        for rnd in self.versions(cid):
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
