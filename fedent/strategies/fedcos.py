"""FedCos (after Wu et al. 2021, the paper's Eq. (cos_objective)): cosine-similarity aggregation weights.

Clients run plain local SGD at the base rate. The server weights client i by the cosine similarity
between its uploaded model w_i(t+1) and the global model w(t), computed over all parameters as one
vector (fedent-spec §4): negative similarities are clipped to 0, the weights are normalised to sum
to 1, and if every weight is 0 the round falls back to FedAvg's sample weights θ_i. A zero-norm model
has no direction and gets similarity 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor

from fedent.params import dot, norm_sq, weighted_sum
from fedent.strategies.base import (
    AggregateResult,
    ClientUpdate,
    LocalSGDStrategy,
    StrategyError,
    sample_weights,
)
from fedent.strategies.options import FedCosOptions


def cosine(x: Sequence[Tensor], y: Sequence[Tensor]) -> float:
    """cos(x, y) over all tensors as one vector (float64); 0 when either vector is zero."""
    nx, ny = norm_sq(x), norm_sq(y)
    if nx <= 0.0 or ny <= 0.0:
        return 0.0
    return dot(x, y) / math.sqrt(nx * ny)


def cosine_weights(
    global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
) -> tuple[list[float], bool]:
    """(normalised clipped cosine weights, whether the FedAvg fallback was used)."""
    if not updates:
        raise StrategyError("cannot aggregate zero updates")
    raw = [max(0.0, cosine(u.params, global_params)) for u in updates]
    total = sum(raw)
    if not total > 0.0 or not math.isfinite(total):
        return sample_weights(updates), True
    return [r / total for r in raw], False


class FedCos(LocalSGDStrategy):
    name = "fedcos"
    Options = FedCosOptions
    secure_blocker = "its weights are each client's cosine with w(t), which needs every individual model"

    def __init__(self, options: FedCosOptions | None = None) -> None:
        self.options = options or FedCosOptions()

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        weights, fallback = cosine_weights(global_params, updates)
        params = weighted_sum([u.params for u in updates], weights)
        return AggregateResult(params, {"cos_weights": weights, "cos_fallback": fallback})


STRATEGY = FedCos
