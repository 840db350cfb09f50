"""The online mean-field estimate (spec §3 "online", §5): φ2' = Σ θ_i q_i(η_i(φ2')) for one round.

Which rate the mean field steps with (spec §5, option ``phi2_rate``): ``used`` (default) takes the rate the
client then trains with, η_i(φ2') = γη_i(t−1) + (1 − γ)η*_i(φ2') (Eq. (eta_deacy)), so each participant also
reports η_i(t−1) (``eta_prev``); ``star`` (the first reading) takes η*_i(φ2') itself (``eta_prev`` None).

φ1(t) is the real global model w(t), so c = ‖w(t)‖² is known and each participant contributes only
(a_i, b_i, θ_i). The scalar equation F(φ) = φ − G(φ) = 0, G(φ) = Σθ_i q_i(η*_i(φ)), is solved by
bracketing then a safeguarded regula falsi (Illinois) — never by blind iteration.

Why a root exists (docs/algorithm.md §4): G is continuous on (0, ∞); G ≥ m = Σθ_i min_{η≥0} q_i(η);
for φ ≥ c every η*_i ≤ B_i(φ) ≤ 2βθ_i b_i/((1−β)√c), so G is bounded above. Hence F < 0 just above 0
when m > 0 and F > 0 for large φ. Which root when there are several: starting at φ = c (the value the
offline sweep starts from, ‖φ1(t)‖²), we move by factors of 2 in the direction in which the iteration
φ ← G(φ) would move (up if G(c) > c, down otherwise) and take the first sign change; when G is
nondecreasing that is exactly the fixed point the iteration φ ← G(φ) from c converges to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedent.meanfield.decay import check_gamma, decayed_rates
from fedent.meanfield.lr import LRSolution, q_value, solve_eta

_MAX_EXPANSIONS = 200


@dataclass(frozen=True, eq=False)
class OnlineFixedPoint:
    """The round's φ2(t+1), each participant's η*_i at it, and how it was found."""

    phi2_next: float
    eta_star: NDArray[np.float64]
    eta: NDArray[np.float64]  # the rate each q_i was evaluated at: η*_i (star) or the decayed η_i (used)
    guarded: NDArray[np.bool_]
    iterations: int  # evaluations of G (each one vectorised solve over all participants)
    bracket: tuple[float, float]
    residual: float  # |F(φ2')| / φ2'
    bracketed: bool  # False only in the degenerate case where no sign change was found
    expansions: int = 0  # doublings/halvings of the bracket search from c
    refinements: int = 0  # regula falsi (Illinois) steps inside the bracket

    @property
    def guards(self) -> int:
        return int(np.count_nonzero(self.guarded))

    def to_dict(self) -> dict[str, float | int | bool | list[float]]:
        """The round's report (``iterations``: G evaluations; ``expansions``/``refinements``: the steps)."""
        return {
            "phi2_next": self.phi2_next,
            "iterations": self.iterations,
            "bracket": [self.bracket[0], self.bracket[1]],
            "residual": self.residual,
            "bracketed": self.bracketed,
            "guards": self.guards,
            "expansions": self.expansions,
            "refinements": self.refinements,
        }


DEFAULT_RTOL = 1e-12  # relative tolerance of the round's scalar fixed point
DEFAULT_MAX_ITER = 200


def solve_online(
    c: float,
    thetas: ArrayLike,
    a: ArrayLike,
    b: ArrayLike,
    beta: float,
    variant: str = "exact",
    rtol: float = DEFAULT_RTOL,
    max_iter: int = DEFAULT_MAX_ITER,
    *,
    eta_max: float | None = None,
    eta_prev: ArrayLike | None = None,
    gamma: float = 0.0,
) -> OnlineFixedPoint:
    """Solve φ2' = Σθ_i q_i(η_i(φ2')) (Eq. (phi_next_t_2) with φ1(t) = w(t)).

    ``eta_prev`` None: η_i = η*_i (``phi2_rate: star``); else η_i = γ·eta_prev_i + (1 − γ)η*_i
    (``phi2_rate: used``, spec §5). ``eta_max`` caps η* as in ``solve_eta``.
    """
    th = np.atleast_1d(np.asarray(thetas, dtype=np.float64))
    a_ = np.atleast_1d(np.asarray(a, dtype=np.float64))
    b_ = np.atleast_1d(np.asarray(b, dtype=np.float64))
    if not (th.shape == a_.shape == b_.shape) or th.ndim != 1 or th.size == 0:
        raise ValueError("thetas, a and b must be equal-length non-empty 1-D arrays")
    prev: NDArray[np.float64] | None = None
    if eta_prev is not None:
        prev = np.atleast_1d(np.asarray(eta_prev, dtype=np.float64))
        if prev.shape != th.shape or not np.all(np.isfinite(prev)) or np.any(prev < 0):
            raise ValueError("eta_prev must hold one finite rate >= 0 per participant")
        check_gamma(gamma)
    n = th.size
    if not np.isfinite(c) or c <= 0:
        # No positive φ1: every client is guarded (η* = 0), so Σθ q = c; report 0 if c is unusable.
        phi = float(c) if np.isfinite(c) and c > 0 else 0.0
        used0 = np.zeros(n) if prev is None else gamma * prev
        return OnlineFixedPoint(phi, np.zeros(n), used0, np.ones(n, dtype=bool), 0, (phi, phi), 0.0, False)

    evals = 0
    cache: dict[float, tuple[float, LRSolution, NDArray[np.float64]]] = {}

    def residual(phi: float) -> float:
        nonlocal evals
        if phi not in cache:
            evals += 1
            sol = solve_eta(a_, b_, c, th, phi, beta, variant, eta_max=eta_max)
            rate = sol.eta_star if prev is None else decayed_rates(prev, sol.eta_star, gamma)
            q = q_value(rate, a_, b_, c)
            if prev is None:  # a guarded client does not move: q = c
                q = np.where(sol.guarded, c, q)
            g = float(np.sum(th * q))
            cache[phi] = (phi - g, sol, rate)
        return cache[phi][0]

    lo, hi, bracketed, expansions = _bracket(residual, float(c))
    phi, refinements = _illinois(residual, lo, hi, rtol, max_iter) if bracketed else (lo, 0)
    f, sol, rate = cache[phi]
    return OnlineFixedPoint(
        phi2_next=phi,
        eta_star=sol.eta_star,
        eta=rate,
        guarded=sol.guarded,
        iterations=evals,
        bracket=(lo, hi),
        residual=abs(f) / phi,
        bracketed=bracketed,
        expansions=expansions,
        refinements=refinements,
    )


def _bracket(residual: Callable[[float], float], start: float) -> tuple[float, float, bool, int]:
    """[lo, hi] with F(lo) ≤ 0 ≤ F(hi), found by doubling/halving from ``start`` in F's direction; and the
    number of doublings/halvings it took."""
    f0 = residual(start)
    if f0 == 0.0:
        return start, start, True, 0
    x = start
    for k in range(1, _MAX_EXPANSIONS + 1):
        y = x * 2.0 if f0 < 0 else x * 0.5
        fy = residual(y)
        if (fy >= 0) if f0 < 0 else (fy <= 0):
            return (x, y, True, k) if f0 < 0 else (y, x, True, k)
        x = y
    return x, x, False, _MAX_EXPANSIONS


def _illinois(
    residual: Callable[[float], float], lo: float, hi: float, rtol: float, max_iter: int
) -> tuple[float, int]:
    """Regula falsi with the Illinois fix and a bisection fallback; returns the best end point and the number
    of steps taken."""
    f_lo, f_hi = residual(lo), residual(hi)
    if f_lo == 0.0:
        return lo, 0
    if f_hi == 0.0 or lo == hi:
        return hi, 0
    side = 0
    steps = 0
    for _ in range(max_iter):
        if hi - lo <= rtol * hi:
            break
        steps += 1
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        if not (lo < x < hi):
            x = 0.5 * (lo + hi)
        fx = residual(x)
        if fx == 0.0:
            return x, steps
        if fx < 0:
            lo, f_lo = x, fx
            if side == -1:
                f_hi *= 0.5
            side = -1
        else:
            hi, f_hi = x, fx
            if side == 1:
                f_lo *= 0.5
            side = 1
    return (lo if abs(residual(lo)) <= abs(residual(hi)) else hi), steps
