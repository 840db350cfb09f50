"""The example's strategy: FedAvg with server momentum (Hsu et al. 2019), a ``Strategy`` with typed options.

The client step is FedAvg's (``LocalSGDStrategy.fit``); only ``aggregate`` and the server state differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from fedent.config import StrategyOptions, option
from fedent.strategies.base import (
    AggregateResult,
    ClientUpdate,
    LocalSGDStrategy,
    tensor_lists_from_state,
    weighted_average,
)


@dataclass(frozen=True)
class FedAvgMOptions(StrategyOptions):
    algorithm = "fedavgm"
    momentum: float = option(0.5, "β, server momentum on the averaged update (0 is FedAvg)", ge=0, lt=1)
    server_lr: float = option(1.0, "η_s, the server step on the momentum buffer", gt=0)


class FedAvgM(LocalSGDStrategy):
    name = "fedavgm"
    Options = FedAvgMOptions

    def __init__(self, options: FedAvgMOptions | None = None) -> None:
        self.options = options or FedAvgMOptions()
        self.velocity: list[Tensor] | None = None

    def aggregate(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]) -> AggregateResult:
        avg = weighted_average(updates)
        delta = [g - a for g, a in zip(global_params, avg, strict=True)]  # the pseudo-gradient
        if self.velocity is None:
            self.velocity = [d.clone() for d in delta]
        else:
            self.velocity = [self.options.momentum * v + d for v, d in zip(self.velocity, delta, strict=True)]
        new = [g - self.options.server_lr * v for g, v in zip(global_params, self.velocity, strict=True)]
        return AggregateResult(new)

    def server_state(self) -> dict[str, Any]:
        return {} if self.velocity is None else {"velocity": self.velocity}

    def load_server_state(self, state: dict[str, Any]) -> None:
        self.velocity = tensor_lists_from_state(state, ["velocity"], self.name)["velocity"] if state else None
