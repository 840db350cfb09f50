"""FedAvg (McMahan et al. 2017): local SGD at the base rate, sample-weighted model average."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from fedent.strategies.base import (
    AggregateResult,
    ClientUpdate,
    LocalSGDStrategy,
    weighted_average,
)
from fedent.strategies.options import FedAvgOptions


class FedAvg(LocalSGDStrategy):
    name = "fedavg"
    Options = FedAvgOptions

    def __init__(self, options: FedAvgOptions | None = None) -> None:
        self.options = options or FedAvgOptions()

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        return AggregateResult(weighted_average(updates))


STRATEGY = FedAvg

