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

    def _problem(self, what: str, cid: int, upload: Probe | ClientUpdate, check: Callable[[int], None]) -> str | None:
        """Why ``upload`` (gathered for client ``cid``) is rejected, or None: it must be that client's, the client
        one of the run's, and ``check`` (given the client's sample count) must raise no ``StrategyError``."""
        if upload.cid != cid:
            return f"{REJECTED}{what} of client {upload.cid} gathered for client {cid}"
        sizes = self.sizes()
        if not 0 <= cid < len(sizes):
            return f"{REJECTED}client {cid} is not one of this run's {len(sizes)} clients"
        try:
            check(int(sizes[cid]))
        except StrategyError as e:
            return f"{REJECTED}{e}"
        return None

    def probe_problem(self, cid: int, probe: Probe) -> str | None:
        return self._problem("probe", cid, probe, lambda n: check_probe(self.strategy(), probe, n))

    def update_problem(self, cid: int, update: ClientUpdate) -> str | None:
        return self._problem("update", cid, update,
                             lambda n: check_update(self.strategy(), update, self.global_params(), n))

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
