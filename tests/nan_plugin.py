"""A plug-in strategy (loaded by import path, ``nan_plugin:NaNFedAvg``) whose clients 1, 4 and 7 upload a
NaN model every round they take part in: what a diverged or broken client sends. Used to check that every
world (sequential, vectorised, remote executors) rejects those uploads by the same rule. ``AbsurdProbeFedEnt``:
FedEnt whose client 3 probes a finite but absurd eta_prev (-1e300)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from fedent.strategies.base import ClientState, ClientTask, ClientUpdate, LocalFit, Probe, ProbePlan, RoundPayload
from fedent.strategies.fedavg import FedAvg
from fedent.strategies.fedent import FedEnt
from fedent.trainer import LocalTrainer, TrainResult

POISONED = frozenset({1, 4, 7})


class NaNFedAvg(FedAvg):
    name = "nanfedavg"

    def plan_fit(self, trainer: LocalTrainer, global_params: Sequence[Tensor], payload: RoundPayload,
                 task: ClientTask, state: ClientState) -> LocalFit:
        plan = super().plan_fit(trainer, global_params, payload, task, state)
        if task.cid not in POISONED:
            return plan

        def finish(params: list[Tensor], res: TrainResult) -> ClientUpdate:
            update = plan.finish(params, res)
            update.params = [torch.full_like(p, float("nan")) for p in update.params]
            return update

        return dataclasses.replace(plan, finish=finish)


ABSURD = 3  # the client whose FedEnt probe reports eta_prev = -1e300 (finite, far outside its range)


class AbsurdProbeFedEnt(FedEnt):
    name = "absurdprobe"

    def plan_probe(self, global_params: Sequence[Tensor], task: ClientTask, state: ClientState) -> ProbePlan:
        plan = super().plan_probe(global_params, task, state)
        if task.cid != ABSURD:
            return plan

        def finish(g: list[Tensor]) -> Probe:
            probe = plan.finish(g)
            return dataclasses.replace(probe, scalars={**probe.scalars, "eta_prev": -1e300})

        return dataclasses.replace(plan, finish=finish)
