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
        self, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float], *,
        cids: Sequence[int] | None = None, eta_prev: Sequence[float] | None = None,
    ) -> Phi2Estimate:
        """φ2(rnd+1) for round ``rnd`` given c = ‖w(rnd)‖² and the participants' (θ_i, a_i, b_i), their client
        ids and their previous rates η_i(t−1) (what ``phi2_rate: used`` needs, spec §5)."""
        ...


PHI2_RATES: tuple[str, ...] = ("used", "star")


class OnlinePhi2Estimator:
    """Solves the round's scalar fixed point φ2' = Σθ_i q_i(η_i(φ2')) (fedent.meanfield.scalar_fixed_point),
    with η_i the decayed rate (``phi2_rate="used"``, needs ``eta_prev``) or η*_i (``"star"``)."""

    def __init__(self, beta: float, variant: str = "exact", *, eta_max: float | None = None,
                 phi2_rate: str = "star", gamma: float = 0.99) -> None:
        if not (0.0 < beta < 1.0):
            raise ValueError(f"beta must be in (0, 1), got {beta}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if phi2_rate not in PHI2_RATES:
            raise ValueError(f"phi2_rate must be one of {PHI2_RATES}, got {phi2_rate!r}")
        self.beta = beta
        self.variant = variant
        self.eta_max = eta_max
        self.phi2_rate = phi2_rate
        self.gamma = gamma

    def estimate(
        self, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float], *,
        cids: Sequence[int] | None = None, eta_prev: Sequence[float] | None = None,
    ) -> Phi2Estimate:
        if self.phi2_rate == "used" and eta_prev is None:
            raise ValueError("phi2_rate 'used' needs each participant's previous rate eta_prev")
        prev = eta_prev if self.phi2_rate == "used" else None
        sol = solve_online(c, thetas, a, b, self.beta, self.variant, eta_max=self.eta_max, eta_prev=prev,
                           gamma=self.gamma)
        return Phi2Estimate(sol.phi2_next, {"mode": "online", "phi2_rate": self.phi2_rate, **sol.to_dict()})


class OfflinePhi2Estimator:
    """Returns φ2(rnd+1) of the trajectory precomputed by Algorithm 1 (fedent.meanfield.fixed_point).

    ``schedule``: the participants Algorithm 1 simulated in each round (spec §5 "One θ"); None when it
    simulated the whole population. A round asked for with other clients (a retried round after a missed
    quorum, or a client that dropped out) still gets the estimate made for the original sample, and the
    report says so (``sample: "changed"`` with the ``planned`` clients; ``"planned"`` otherwise).
    """

    def __init__(self, phi2: Sequence[float], report: dict[str, Any] | None = None,
                 schedule: Sequence[Sequence[int]] | None = None) -> None:
        traj = np.asarray(phi2, dtype=np.float64)
        if traj.ndim != 1 or traj.size < 2 or not np.all(np.isfinite(traj)):
            raise ValueError("offline phi2 trajectory must be a finite 1-D sequence of length T+1 >= 2")
        self.phi2 = traj
        self.report = dict(report or {})
        self.schedule = None if schedule is None else [sorted(int(c) for c in r) for r in schedule]
        if self.schedule is not None and len(self.schedule) < traj.size - 1:
            raise ValueError("offline schedule must name the participants of every round of the trajectory")

    @classmethod
    def from_result(cls, result: FixedPointResult,
                    schedule: Sequence[Sequence[int]] | None = None) -> OfflinePhi2Estimator:
        return cls([float(v) for v in result.phi2], result.report.to_dict(), schedule)

    @property
    def horizon(self) -> int:
        return int(self.phi2.size - 1)

    def estimate(
        self, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float], *,
        cids: Sequence[int] | None = None, eta_prev: Sequence[float] | None = None,
    ) -> Phi2Estimate:
        if not 0 <= rnd < self.horizon:
            raise ValueError(f"round {rnd} is outside the offline trajectory (T = {self.horizon} rounds)")
        report: dict[str, Any] = {"mode": "offline", "round": rnd}
        if self.schedule is not None and cids is not None:
            planned = self.schedule[rnd]
            if sorted(int(c) for c in cids) == planned:
                report["sample"] = "planned"
            else:
                report.update(sample="changed", planned=planned,
                              note="the clients differ from the sample Algorithm 1 simulated (a retry or a "
                                   "dropped client); phi2(t+1) is its estimate for the original sample")
        return Phi2Estimate(float(self.phi2[rnd + 1]), report)

    def state(self) -> dict[str, Any]:
        """JSON-able state for checkpoints and estimator.json."""
        out: dict[str, Any] = {"phi2": [float(v) for v in self.phi2], "report": self.report}
        if self.schedule is not None:
            out["schedule"] = self.schedule
        return out
