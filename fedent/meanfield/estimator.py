"""Where FedEnt's φ2(t+1) comes from: the ``Phi2Estimator`` protocol and its two in-process forms.

The strategy asks the estimator once per round with the round's participants' scalars. The simulator
injects one of the classes below; the cluster injects an adapter that calls the estimator service and
implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fedent.meanfield.fixed_point import FixedPointResult
from fedent.meanfield.lr import VARIANTS
from fedent.meanfield.scalar_fixed_point import solve_online


@dataclass(frozen=True)
class Phi2Estimate:
    phi2_next: float
    report: dict[str, Any] = field(default_factory=dict)


class Phi2Estimator(Protocol):
    def estimate(
        self, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float]
    ) -> Phi2Estimate:
        """φ2(rnd+1) for round ``rnd`` given c = ‖w(rnd)‖² and the participants' (θ_i, a_i, b_i)."""
        ...


class OnlinePhi2Estimator:
    """Solves the round's scalar fixed point φ2' = Σθ_i q_i(η*_i(φ2')) (fedent.meanfield.scalar_fixed_point)."""

    def __init__(self, beta: float, variant: str = "exact") -> None:
        if not (0.0 < beta < 1.0):
            raise ValueError(f"beta must be in (0, 1), got {beta}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.beta = beta
        self.variant = variant

    def estimate(
        self, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float]
    ) -> Phi2Estimate:
        sol = solve_online(c, thetas, a, b, self.beta, self.variant)
        return Phi2Estimate(sol.phi2_next, {"mode": "online", **sol.to_dict()})


class OfflinePhi2Estimator:
    """Returns φ2(rnd+1) of the trajectory precomputed by Algorithm 1 (fedent.meanfield.fixed_point)."""

    def __init__(self, phi2: Sequence[float], report: dict[str, Any] | None = None) -> None:
        traj = np.asarray(phi2, dtype=np.float64)
        if traj.ndim != 1 or traj.size < 2 or not np.all(np.isfinite(traj)):
            raise ValueError("offline phi2 trajectory must be a finite 1-D sequence of length T+1 >= 2")
        self.phi2 = traj
        self.report = dict(report or {})

    @classmethod
    def from_result(cls, result: FixedPointResult) -> OfflinePhi2Estimator:
        return cls([float(v) for v in result.phi2], result.report.to_dict())

    @property
    def horizon(self) -> int:
        return int(self.phi2.size - 1)

    def estimate(
        self, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float]
    ) -> Phi2Estimate:
        if not 0 <= rnd < self.horizon:
            raise ValueError(f"round {rnd} is outside the offline trajectory (T = {self.horizon} rounds)")
        return Phi2Estimate(float(self.phi2[rnd + 1]), {"mode": "offline", "round": rnd})

    def state(self) -> dict[str, Any]:
        """JSON-able state for checkpoints and estimator.json."""
        return {"phi2": [float(v) for v in self.phi2], "report": self.report}
