"""FedAdam (Reddi et al. 2021, "Adaptive Federated Optimization"): Adam on the server's pseudo-gradient.

Clients run plain local SGD at the base rate (as FedAvg). The server treats the sample-weighted model
change Δ = Σθ_i w_i(t+1) − w(t) as a pseudo-gradient (θ_i as in Eq. (w_global_static_update)) and
applies Reddi et al.'s Algorithm 2 without bias correction:

    m ← β1 m + (1 − β1) Δ
    v ← β2 v + (1 − β2) Δ²
    w ← w + η_s m / (√v + τ)

with m initialised to 0 and v to τ². The paper fixes β1 = 0.9, β2 = 0.99, τ = 1e-3 but gives no server
rate η_s; ``server_lr`` defaults to 0.01 (a value from Reddi et al.'s grid) and is an option.
The moments are server state and survive checkpoints via ``server_state`` / ``load_server_state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedent.params import Params, clone, sub
from fedent.strategies.base import (
    AggregateResult,
    ClientUpdate,
    LocalSGDStrategy,
    SecureSum,
    align_state,
    tensor_lists_from_state,
    weighted_average,
)
from fedent.strategies.options import FedAdamOptions


class FedAdam(LocalSGDStrategy):
    name = "fedadam"
    Options = FedAdamOptions
    secure_weighting = "samples"  # Δ needs only Σ n_i w_i / Σ n_i

    def __init__(self, options: FedAdamOptions | None = None) -> None:
        self.options = options or FedAdamOptions()
        self._m: Params | None = None
        self._v: Params | None = None

    # ---- server side -----------------------------------------------------------------------------
    def _update_second_moment(self, v: Params, delta_sq: Params) -> None:
        """Adam: v ← β2 v + (1 − β2) Δ² (in place)."""
        b2 = self.options.beta2
        torch._foreach_mul_(v, b2)
        torch._foreach_add_(v, delta_sq, alpha=1.0 - b2)

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        return self._step(global_params, weighted_average(updates))

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        return self._step(global_params, total.mean())

    def _step(self, global_params: Sequence[Tensor], average: Params) -> AggregateResult:
        """Adam on the pseudo-gradient Δ = average − w(t)."""
        o = self.options
        w = list(global_params)
        delta = sub(average, w)  # pseudo-gradient Δ
        if self._m is None or self._v is None:
            self._m = [torch.zeros_like(p) for p in w]
            self._v = [torch.full_like(p, o.tau * o.tau) for p in w]
        self._m = align_state(self._m, w, f"{self.name}: the server's first moment")
        self._v = align_state(self._v, w, f"{self.name}: the server's second moment")
        torch._foreach_mul_(self._m, o.beta1)
        torch._foreach_add_(self._m, delta, alpha=1.0 - o.beta1)
        self._update_second_moment(self._v, list(torch._foreach_mul(delta, delta)))
        denom = list(torch._foreach_sqrt(self._v))
        torch._foreach_add_(denom, o.tau)
        step = torch._foreach_div(self._m, denom)
        new = clone(w)
        torch._foreach_add_(new, step, alpha=o.server_lr)
        return AggregateResult(new)

    def server_state(self) -> dict[str, Any]:
        if self._m is None or self._v is None:
            return {}
        return {"m": clone(self._m), "v": clone(self._v)}

    def load_server_state(self, state: dict[str, Any]) -> None:
        if not state:
            self._m = self._v = None
            return
        got = tensor_lists_from_state(state, ("m", "v"), self.name)
        self._m, self._v = got["m"], got["v"]


STRATEGY = FedAdam
