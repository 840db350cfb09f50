"""FedYogi (Reddi et al. 2021): FedAdam with Yogi's additive second-moment update.

Identical to FedAdam (fedent/strategies/fedadam.py: local SGD at the base rate, pseudo-gradient
Δ = Σθ_i w_i(t+1) − w(t), no bias correction, m₀ = 0, v₀ = τ²) except for

    v ← v − (1 − β2) Δ² sign(v − Δ²),

which changes v by at most (1 − β2) Δ² per round, so a single large Δ cannot inflate v abruptly.
The paper uses FedAdam's hyperparameters for its adaptive baseline; FedYogi reuses them.
"""

from __future__ import annotations

import torch

from fedent.params import Params
from fedent.strategies.fedadam import FedAdam
from fedent.strategies.options import FedYogiOptions


class FedYogi(FedAdam):
    name = "fedyogi"
    Options = FedYogiOptions

    def __init__(self, options: FedYogiOptions | None = None) -> None:
        super().__init__(options or FedYogiOptions())

    def _update_second_moment(self, v: Params, delta_sq: Params) -> None:
        """Yogi: v ← v − (1 − β2) Δ² sign(v − Δ²) (in place)."""
        sign = torch._foreach_sub(v, delta_sq)
        torch._foreach_sign_(sign)
        torch._foreach_mul_(sign, delta_sq)
        torch._foreach_add_(v, sign, alpha=-(1.0 - self.options.beta2))


STRATEGY = FedYogi
