"""FedNorm (Tu et al. 2022, as the paper's Eq. (norm_objective)): a rate that keeps w_i(t+1) near w(t+1).

The rate is η*_i = max(0, β g_iᵀΔ / ((1−β) + β‖g_i‖²)) (fedent.meanfield.fednorm), where Δ is the
mean-field aggregated step. The server broadcasts Δ(t) = w(t−1) − w(t), the last actual global step
(zero in round 0); docs/algorithm.md explains why a self-consistent Δ would collapse to 0. g_i is taken
on the probe batch at w(t) as FedEnt does, the rate decays as Eq. (eta_deacy), and aggregation is the
sample-weighted mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedent.meanfield.decay import ETA_STATE_KEY, decayed_rate, previous_rate
from fedent.meanfield.fednorm import fednorm_rate
from fedent.params import Params, clone, dot, norm_sq, sub, zeros_like
from fedent.rng import torch_generator
from fedent.strategies.base import (
    AggregateResult,
    ClientState,
    ClientTask,
    ClientUpdate,
    LocalFit,
    PayloadSpec,
    Probe,
    RoundPayload,
    SecureSum,
    Strategy,
    StrategyError,
    upload,
    weighted_average,
)
from fedent.strategies.options import FedNormOptions
from fedent.trainer import LocalTrainer

DELTA_KEY = "delta"
UPDATE_SCALARS = ("eta_star", "eta", "g_dot_delta", "b", "guarded")  # what fit uploads
SCALAR_RANGES = (("eta_star", 0.0, 1e6), ("eta", 0.0, 1e6), ("g_dot_delta", -1e15, 1e15), ("b", 0.0, 1e15),
                 ("guarded", 0.0, 1.0))  # PayloadSpec.ranges: rates >= 0, b a squared norm, guarded a flag


class FedNorm(Strategy):
    name = "fednorm"
    keeps_client_state = True
    payload_spec = PayloadSpec(update_scalars=UPDATE_SCALARS, ranges=SCALAR_RANGES)
    Options = FedNormOptions
    secure_weighting = "samples"  # Σθ_i w_i; the broadcast Δ(t) is the global step, public anyway

    def __init__(self, options: FedNormOptions | None = None) -> None:
        self.options = options or FedNormOptions()
        self._prev_round: int | None = None  # round whose global model is held in _prev_params
        self._prev_params: Params | None = None

    # ---- server side -------------------------------------------------------------------------
    def round_payload(self, rnd: int, global_params: Sequence[Tensor], probes: Sequence[Probe]) -> RoundPayload:
        """Δ(t) = w(t−1) − w(t) when w(t−1) is held, else zeros (round 0)."""
        if self._prev_params is not None and self._prev_round == rnd - 1:
            delta = sub(self._prev_params, global_params)
        else:
            delta = zeros_like(global_params)
        return RoundPayload(round=rnd, tensors={DELTA_KEY: delta})

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        return self._result(rnd, global_params, weighted_average(updates), updates)

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        return self._result(rnd, global_params, total.mean(), total.clients)

    def _result(self, rnd: int, global_params: Sequence[Tensor], params: Params,
                updates: Sequence[ClientUpdate]) -> AggregateResult:
        """The new model ``params``, w(t) kept for the next Δ, and the per-client rate record."""
        self._prev_round, self._prev_params = rnd, clone(global_params)
        clients = [
            {"client": u.cid, **{k: float(u.scalars[k]) for k in ("eta_star", "eta", "g_dot_delta", "b")}}
            for u in updates
            if all(k in u.scalars for k in ("eta_star", "eta", "g_dot_delta", "b"))
        ]
        diag = {"fednorm": {"beta": self.options.beta, "gamma": self.options.gamma, "clients": clients}}
        return AggregateResult(params, diag)

    def server_state(self) -> dict[str, Any]:
        if self._prev_params is None:
            return {}
        return {"prev_round": self._prev_round, "prev_params": [p.detach().cpu() for p in self._prev_params]}

    def load_server_state(self, state: dict[str, Any]) -> None:
        unknown = sorted(set(state) - {"prev_round", "prev_params"})
        if unknown:
            raise StrategyError(f"fednorm: unknown server state keys {unknown}")
        if state:
            self._prev_round = int(state["prev_round"])
            self._prev_params = [torch.as_tensor(p) for p in state["prev_params"]]

    # ---- client side -------------------------------------------------------------------------
    def plan_fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> LocalFit:
        """η_i from g_i at w(t) on the probe batch and the broadcast Δ, decayed; then plain SGD at η_i."""
        delta = payload.tensors.get(DELTA_KEY)
        if delta is None or len(delta) != len(global_params):
            raise StrategyError("fednorm: the round payload lacks the aggregated step 'delta'")
        trainer.load(global_params)
        gen = torch_generator(task.seed, "probe", task.round, task.cid)
        g = trainer.gradient(task.indices, gen, self.options.probe_batch_size)
        g_dot_delta, b = dot(g, [d.to(g[0].device) for d in delta]), norm_sq(g)
        eta_star, guarded = fednorm_rate(g_dot_delta, b, self.options.beta)
        eta = decayed_rate(previous_rate(state.scalars, task.lr), eta_star, self.options.gamma)
        state.scalars[ETA_STATE_KEY] = eta
        scalars = {"eta_star": eta_star, "eta": eta, "g_dot_delta": g_dot_delta, "b": b, "guarded": float(guarded)}
        return LocalFit(eta, upload(task, scalars))


STRATEGY = FedNorm
