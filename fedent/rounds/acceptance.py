"""What the engine accepts from any executor: one rule, applied to whatever a round gathered.

An upload (probe or update) is accepted when it is the client's own (its cid is the one it was gathered
for), finite, and exactly what the strategy's ``PayloadSpec`` declares (fedent.strategies.validation). A
rejected upload is a failed client with a reason, ``rejected: ...``, recorded in the round's
``failed_clients`` like any other failure; the quorum rule then decides whether the round goes on. The same
rule runs on the simulator's in-process hosts and on the cluster's remote uploads (where the servicer also
asks it early, so the worker hears INVALID_ARGUMENT for the upload it sent).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from torch import Tensor

from fedent.rounds.executor import Gathered
from fedent.strategies.base import ClientUpdate, Probe, Strategy, StrategyError
from fedent.strategies.validation import check_probe, check_update

T = TypeVar("T", Probe, ClientUpdate)

REJECTED = "rejected: "  # the prefix of every reason this module gives
NOT_FINITE = ("not finite", "non-finite")  # in a reason when an upload carried NaN/inf (training diverged)


class Acceptance:
    """The acceptance rule of one run; reads the run's current strategy, model and client sizes."""

    def __init__(self, strategy: Callable[[], Strategy], global_params: Callable[[], Sequence[Tensor]],
                 sizes: Callable[[], Sequence[int]]) -> None:
        self.strategy, self.global_params, self.sizes = strategy, global_params, sizes

    def _stranger(self, cid: int) -> str | None:
        n = len(self.sizes())
        return None if 0 <= cid < n else f"{REJECTED}client {cid} is not one of this run's {n} clients"

    def probe_problem(self, cid: int, probe: Probe) -> str | None:
        """Why ``probe`` (gathered for client ``cid``) is rejected, or None."""
        if probe.cid != cid:
            return f"{REJECTED}probe of client {probe.cid} gathered for client {cid}"
        if (why := self._stranger(cid)) is not None:
            return why
        try:
            check_probe(self.strategy(), probe, int(self.sizes()[cid]))
        except StrategyError as e:
            return f"{REJECTED}{e}"
        return None

    def update_problem(self, cid: int, update: ClientUpdate) -> str | None:
        """Why ``update`` (gathered for client ``cid``) is rejected, or None."""
        if update.cid != cid:
            return f"{REJECTED}update of client {update.cid} gathered for client {cid}"
        if (why := self._stranger(cid)) is not None:
            return why
        try:
            check_update(self.strategy(), update, self.global_params(), int(self.sizes()[cid]))
        except StrategyError as e:
            return f"{REJECTED}{e}"
        return None

    def screen(self, got: Gathered[T], problem: Callable[[int, T], str | None]) -> Gathered[T]:
        """``got`` with every rejected result moved to ``failed`` (with its reason)."""
        results: dict[int, T] = {}
        failed = dict(got.failed)
        for cid, value in got.results.items():
            why = problem(cid, value)
            if why is None:
                results[cid] = value
            else:
                failed[cid] = why
        return Gathered(results, failed)

    def probes(self, got: Gathered[Probe]) -> Gathered[Probe]:
        return self.screen(got, self.probe_problem)

    def updates(self, got: Gathered[ClientUpdate]) -> Gathered[ClientUpdate]:
        return self.screen(got, self.update_problem)


def diverged(failed: dict[int, str]) -> list[int]:
    """The clients whose upload was rejected for NaN/inf."""
    return sorted(c for c, why in failed.items() if why.startswith(REJECTED) and any(w in why for w in NOT_FINITE))
