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
    SecureSum,
    StrategyError,
)
from fedent.strategies.options import FedCosOptions


def cosine(x: Sequence[Tensor], y: Sequence[Tensor]) -> float:
    """cos(x, y) over all tensors as one vector (float64); 0 when either vector is zero."""
    nx, ny = norm_sq(x), norm_sq(y)
    if nx <= 0.0 or ny <= 0.0:
        return 0.0
    return dot(x, y) / math.sqrt(nx * ny)


def clipped_cosine(global_params: Sequence[Tensor], update: ClientUpdate) -> float:
    """max(0, cos(w_i(t+1), w(t))): one client's raw weight."""
    return max(0.0, cosine(update.params, global_params))


def normalised(raw: Sequence[float], counts: Sequence[int]) -> tuple[list[float], bool]:
    """(the raw weights normalised to sum 1, or the sample weights θ_i where they sum to 0; whether it fell back)."""
    if not raw:
        raise StrategyError("cannot aggregate zero updates")
    total = sum(raw)
    if not total > 0.0 or not math.isfinite(total):
        n = float(sum(counts))
        if n <= 0:
            raise StrategyError("cannot aggregate: the updates hold no samples")
        return [c / n for c in counts], True
    return [r / total for r in raw], False


def cosine_weights(
    global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
) -> tuple[list[float], bool]:
    """(normalised clipped cosine weights, whether the FedAvg fallback was used)."""
    if not updates:
        raise StrategyError("cannot aggregate zero updates")
    return normalised([clipped_cosine(global_params, u) for u in updates], [u.num_samples for u in updates])


class FedCos(LocalSGDStrategy):
    name = "fedcos"
    Options = FedCosOptions
    secure_blocker = "its weights are each client's cosine with w(t), which needs every individual model"
    reduce_by_statistic = True  # a reduced round: each cosine where its client trained, then Σ s_i w_i

    def __init__(self, options: FedCosOptions | None = None) -> None:
        self.options = options or FedCosOptions()

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        weights, fallback = cosine_weights(global_params, updates)
        params = weighted_sum([u.params for u in updates], weights)
        return AggregateResult(params, {"cos_weights": weights, "cos_fallback": fallback})

    def reduce_statistic(self, global_params: Sequence[Tensor], update: ClientUpdate) -> float:
        return clipped_cosine(global_params, update)

    def reduce_weights(self, stats: Sequence[float], counts: Sequence[int]) -> list[float]:
        return normalised(stats, counts)[0]

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        """A reduced round's Σ s_i w_i with the cosine weights its clients' statistics gave (never a secure sum:
        that has no statistics)."""
        if total.stats is None:
            return super().aggregate_sum(rnd, global_params, total)
        weights, fallback = normalised([total.stats[u.cid] for u in total.clients],
                                       [u.num_samples for u in total.clients])
        return AggregateResult(total.mean(), {"cos_weights": weights, "cos_fallback": fallback})


STRATEGY = FedCos
