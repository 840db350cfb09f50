"""FedProx (Li et al. 2020): local SGD on F_i(w) + (μ/2)‖w − w(t)‖², FedAvg aggregation.

The proximal term's gradient μ (w − w(t)) is the plan's correction (``LocalFit``: weight μ, constant
−μ w(t)). The paper sets μ = 0.01. With μ = 0 there is no correction, so FedProx is then FedAvg bit
for bit (tested).
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
    LocalFit,
    RoundPayload,
    SecureSum,
    Strategy,
    upload,
    weighted_average,
)
from fedent.strategies.options import FedProxOptions
from fedent.trainer import LocalTrainer


class FedProx(Strategy):
    name = "fedprox"
    Options = FedProxOptions
    secure_weighting = "samples"  # Σ n_i w_i / Σ n_i

    def __init__(self, options: FedProxOptions | None = None) -> None:
        self.options = options or FedProxOptions()

    def plan_fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> LocalFit:
        """grad += μ (w − w(t)): weight μ and the constant −μ w(t) (no correction at all when μ = 0)."""
        mu, finish = self.options.mu, upload(task)
        if mu <= 0:
            return LocalFit(task.lr, finish)
        trainer.load(global_params)  # the anchor on the trainer's device (global_params may live elsewhere)
        anchor = clone(trainer.params)
        torch._foreach_mul_(anchor, -mu)
        return LocalFit(task.lr, finish, weight_coef=mu, linear=anchor)

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        return AggregateResult(weighted_average(updates))

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        return AggregateResult(total.mean())


STRATEGY = FedProx
