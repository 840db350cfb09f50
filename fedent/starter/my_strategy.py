"""Your strategy: FedAvg with a server step size, as a ``Strategy`` with typed options.

Clients train as in FedAvg (``LocalSGDStrategy``); ``aggregate`` is where a new rule goes. Options are
typed and checked once: ``algorithm: {name: "my_strategy:MyFedAvg", server_lr: 0.5}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from fedent.config import StrategyOptions, option
from fedent.strategies.base import AggregateResult, ClientUpdate, LocalSGDStrategy, weighted_average


@dataclass(frozen=True)
class MyFedAvgOptions(StrategyOptions):
    algorithm = "my-fedavg"
    server_lr: float = option(1.0, "η_s, the step from the global model toward the clients' average", gt=0)


class MyFedAvg(LocalSGDStrategy):
    name = "my-fedavg"
    Options = MyFedAvgOptions

    def __init__(self, options: MyFedAvgOptions | None = None) -> None:
        self.options = options or MyFedAvgOptions()

    def aggregate(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]) -> AggregateResult:
        avg = weighted_average(updates)
        step = self.options.server_lr
        return AggregateResult([g + step * (a - g) for g, a in zip(global_params, avg, strict=True)])
