"""FedProx (Li et al. 2020): local SGD on F_i(w) + (μ/2)‖w − w(t)‖², FedAvg aggregation.

The proximal term's gradient μ (w − w(t)) is added to each SGD step's gradient through
``LocalTrainer.train(grad_hook=...)``. The paper sets μ = 0.01. With μ = 0 no hook is installed, so
FedProx is then FedAvg bit for bit (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
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
from fedent.strategies.options import FedProxOptions
from fedent.trainer import GradHook, LocalTrainer


def proximal_hook(anchor: Sequence[Tensor], mu: float) -> GradHook:
    """grad += μ (w − anchor): the gradient of (μ/2)‖w − anchor‖²."""
    anchor_list = list(anchor)

    def hook(params: Sequence[Tensor], grads: Sequence[Tensor]) -> None:
        with torch.no_grad():  # two in-place adds, no temporary
            g = list(grads)
            torch._foreach_add_(g, list(params), alpha=mu)
            torch._foreach_add_(g, anchor_list, alpha=-mu)

    return hook


class FedProx(Strategy):
    name = "fedprox"
    Options = FedProxOptions

    def __init__(self, options: FedProxOptions | None = None) -> None:
        self.options = options or FedProxOptions()

    def fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> ClientUpdate:
        trainer.load(global_params)
        mu = self.options.mu
        # The anchor is a copy on the trainer's device: global_params may be the caller's live tensors.
        hook = proximal_hook(clone(trainer.params), mu) if mu > 0 else None
        res = trainer.train(task.indices, task.lr, task.epochs, train_generator(task), grad_hook=hook)
        return ClientUpdate(task.cid, clone(trainer.params), task.num_samples, res.loss)

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        return AggregateResult(weighted_average(updates))


STRATEGY = FedProx
