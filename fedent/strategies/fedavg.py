"""FedAvg (McMahan et al. 2017): local SGD at the base rate, sample-weighted model average.

As a control (``replay_rates``), FedAvg trains each client at the rate a FedEnt run logged for it in that round
(``replay: per_client``) or at that round's θ-weighted mean rate (``round_mean``). FedEnt's client step is SGD at
η_i(t) and its aggregation the θ-weighted mean, so with the same seed the per-client replay retraces the FedEnt
run (a check that the log holds the whole schedule), and the round-mean replay keeps the rate's level but drops
its per-client adaptation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import Tensor

from fedent import runlog
from fedent.strategies.base import (
    AggregateResult,
    ClientTask,
    ClientUpdate,
    LocalSGDStrategy,
    SecureSum,
    StrategyError,
    weighted_average,
)
from fedent.strategies.options import FedAvgOptions


def logged_rates(path: str | Path) -> dict[int, dict[int, float]]:
    """round index (the loop's t = 0..R-1, logged as round t+1) -> client -> η_i(t) from a FedEnt run's
    metrics.jsonl (its per-client ``fedent.clients`` records)."""
    out: dict[int, dict[int, float]] = {}
    for rec in runlog.read_metrics(path):
        fd = rec.get("fedent") or {}
        clients = fd.get("clients") or []
        if clients:
            out[int(rec["round"]) - 1] = {int(c["client"]): float(c["eta"]) for c in clients}
    if not out:
        raise StrategyError(f"replay_rates: {path} holds no FedEnt per-client rates (fedent.clients[].eta)")
    return out


def round_means(path: str | Path) -> dict[int, float]:
    """round index t -> Σθ_i η_i(t) over the round's participants, from the same log."""
    out: dict[int, float] = {}
    for rec in runlog.read_metrics(path):
        clients = (rec.get("fedent") or {}).get("clients") or []
        if clients:
            out[int(rec["round"]) - 1] = float(sum(float(c["theta"]) * float(c["eta"]) for c in clients))
    return out


class FedAvg(LocalSGDStrategy):
    name = "fedavg"
    Options = FedAvgOptions
    secure_weighting = "samples"  # Σ n_i w_i / Σ n_i

    def __init__(self, options: FedAvgOptions | None = None) -> None:
        self.options = options or FedAvgOptions()
        self._rates: Mapping[int, Mapping[int, float]] | None = None
        self._means: Mapping[int, float] | None = None

    def local_rate(self, task: ClientTask) -> float:
        """The base rate, or with ``replay_rates`` the rate the FedEnt run logged (per client or round mean)."""
        path = self.options.replay_rates
        if path is None:
            return task.lr
        if self.options.replay == "round_mean":
            if self._means is None:
                self._means = round_means(path)
            if task.round not in self._means:
                raise StrategyError(f"replay_rates: {path} has no rates for round {task.round + 1}")
            return self._means[task.round]
        if self._rates is None:
            self._rates = logged_rates(path)
        try:
            return self._rates[task.round][task.cid]
        except KeyError:
            raise StrategyError(f"replay_rates: {path} has no rate for client {task.cid} in round {task.round + 1} "
                                "(replay a run with the same seed, clients and sampling)") from None

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        return AggregateResult(weighted_average(updates))

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        return AggregateResult(total.mean())


STRATEGY = FedAvg
