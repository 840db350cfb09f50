"""FedAvg (McMahan et al. 2017): local SGD at the base rate, sample-weighted model average."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from fedent.params import clone
from fedent.strategies.base import (
    AggregateResult,
    ClientState,
    ClientTask,
    ClientUpdate,
    RoundPayload,
    Strategy,
    train_generator,
    weighted_average,
)
from fedent.trainer import LocalTrainer


@dataclass(frozen=True)
class FedAvgOptions:
    pass


class FedAvg(Strategy):
    name = "fedavg"
    Options = FedAvgOptions

    def __init__(self, options: FedAvgOptions | None = None) -> None:
        self.options = options or FedAvgOptions()

    def fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> ClientUpdate:
        trainer.load(global_params)
        res = trainer.train(task.indices, task.lr, task.epochs, train_generator(task))
        return ClientUpdate(task.cid, clone(trainer.params), task.num_samples, res.loss)

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        return AggregateResult(weighted_average(updates))
STRATEGY = FedAvg
