"""Proposition 1 (Eq. (eta_solve_t_1)): each client's optimal rate η*_i from scalars only.

Notation (spec §"Notation"): a = φ1ᵀg, b = ‖g‖², c = ‖φ1‖², q(η) = c − 2ηa + η²b,
p(η) = θq(η)/φ2', K = βθ/((1−β)φ2'), h(η) = K(a − ηb)(1 + log p(η)) and
B = 2βθ√c√b/((1−β)φ2') (Eq. (eta_upper_bound) with the client's own ‖g‖ for D).

Variant ``exact`` (default, spec §1) returns the smallest η in [0, B] with η = clip(h(η), 0, B).
With F(η) = η − h(η) (∝ dJ/dη of the per-step objective), docs/algorithm.md shows
F'' = −(2Kr/q)(b + 2Δ/q) with r = a − ηb and Δ = bc − a² ≥ 0, so F is concave while r > 0 and
convex while r < 0. That makes the smallest root unique inside an explicit bracket [0, U]:

* a > 0 and 1 + log p(0) > 0: F is increasing and concave on [0, U], U = min(a/b, s_L, B) where
  s_L is the first η with 1 + log p(η) = 0; Newton from 0 climbs monotonically to the root.
* a < 0 and 1 + log p(0) < 0: F is convex on [0, U], U = min(s_L, B); Newton from U descends
  monotonically to the root.
* otherwise h(0) ≤ 0 and η* = 0 (the paper's max{0, ·}).

Newton steps are safeguarded by bisection on the bracket and run over all clients at once.
Variant ``paper`` evaluates the printed closed form literally (‖g‖ = √b, p at η = 0), clipped to B.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

log = logging.getLogger(__name__)

Variant = Literal["exact", "paper"]
VARIANTS: tuple[str, ...] = ("exact", "paper")
FloatArray = NDArray[np.float64]

# Inputs whose Cauchy–Schwarz gap a² − bc exceeds this relative slack cannot come from real vectors.
_CS_SLACK = 1e-9


@dataclass(frozen=True, eq=False)
class LRSolution:
    """η*_i per client, the bound B_i, which clients were guarded (η* forced to 0), and the solve's cost.

    ``iterations``: Newton sweeps (each one vectorised step over the clients still unconverged: the largest
    count any client needed); ``evaluations``: evaluations of F(η) = η − h(η) summed over clients (the Newton
    steps plus the one check of F at the bound where the bracket reaches it). Variant ``paper``: 0 and 0.
    """

    eta_star: FloatArray
    bound: FloatArray
    guarded: NDArray[np.bool_]
    iterations: int
    evaluations: int = 0

    @property
    def guards(self) -> int:
        return int(np.count_nonzero(self.guarded))


def q_value(eta: ArrayLike, a: ArrayLike, b: ArrayLike, c: ArrayLike) -> FloatArray:
    """q(η) = ‖φ1 − ηg‖² = c − 2ηa + η²b (the one-step local model's squared norm)."""
    e = np.asarray(eta, dtype=np.float64)
    return np.asarray(c, dtype=np.float64) + e * (e * np.asarray(b, dtype=np.float64) - 2.0 * np.asarray(a))


def implicit_rhs(
    eta: ArrayLike, a: ArrayLike, b: ArrayLike, c: ArrayLike, theta: ArrayLike, phi2_next: ArrayLike, beta: float
) -> FloatArray:
    """h(η), the right-hand side of Eq. (eta_solve_t_1); the limit 0·log 0 = 0 where q and a − ηb vanish."""
    e, a_, b_ = (np.asarray(v, dtype=np.float64) for v in (eta, a, b))
    k = beta * np.asarray(theta, dtype=np.float64) / ((1.0 - beta) * np.asarray(phi2_next, dtype=np.float64))
    r = a_ - e * b_
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.maximum(q_value(e, a_, b_, c), 0.0)
        ell = 1.0 + np.log(np.asarray(theta, dtype=np.float64) * q / np.asarray(phi2_next, dtype=np.float64))
        h = k * r * ell
    return np.where(r == 0.0, 0.0, h)


def upper_bound(b: ArrayLike, c: ArrayLike, theta: ArrayLike, phi2_next: ArrayLike, beta: float) -> FloatArray:
    """B = 2βθ√c√b/((1−β)φ2'): Eq. (eta_upper_bound) with the client's own gradient norm as D."""
    b_, c_ = np.asarray(b, dtype=np.float64), np.asarray(c, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return 2.0 * beta * np.asarray(theta) * np.sqrt(c_) * np.sqrt(b_) / ((1.0 - beta) * np.asarray(phi2_next))


def _check_beta(beta: float) -> None:
    if not (0.0 < beta < 1.0):
        raise ValueError(f"beta must be in (0, 1), got {beta}")


def solve_eta(
    a: ArrayLike,
    b: ArrayLike,
    c: ArrayLike,
    theta: ArrayLike,
    phi2_next: ArrayLike,
    beta: float,
    variant: str = "exact",
    rtol: float = 1e-12,
    max_iter: int = 100,
    eta_max: float | None = None,
) -> LRSolution:
    """η*_i of Proposition 1 for every client at once (arrays broadcast to a common 1-D shape).

    ``eta_max`` (spec §5, the paper's domain η ∈ [0, 1]): the solve runs on [0, U_i] with
    U_i = min(B_i, eta_max) — variant ``exact`` takes the smallest root of η = clip(h(η), 0, U_i), variant
    ``paper`` clips its closed form to U_i. None: no cap (U_i = B_i, the first reading). ``bound`` is U_i.

    Guards (spec §1): a non-finite input, c = q(0) ≤ 0, φ2' ≤ 0, θ ≤ 0, b < 0, or a > 0 with
    a² > bc (q would turn negative) give η* = 0, a set ``guarded`` flag and one logged warning.
    """
    _check_beta(beta)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    arrs = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in (a, b, c, theta, phi2_next)))
    a_, b_, c_, th, phi = (np.array(v, dtype=np.float64).reshape(-1) for v in arrs)
    finite = np.isfinite(a_) & np.isfinite(b_) & np.isfinite(c_) & np.isfinite(th) & np.isfinite(phi)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~finite | (c_ <= 0) | (phi <= 0) | (th <= 0) | (b_ < 0)
        bad |= (a_ > 0) & (a_ * a_ > b_ * c_ * (1.0 + _CS_SLACK))
    # Neutral values where guarded, so no warning or NaN is produced below.
    a_, b_, c_, th, phi = (np.where(bad, 1.0, v) for v in (a_, b_, c_, th, phi))
    a_ = np.where(bad, 0.0, a_)
    bound = np.where(bad, 0.0, upper_bound(b_, c_, th, phi, beta))
    if eta_max is not None:
        if not (np.isfinite(eta_max) and eta_max > 0):
            raise ValueError(f"eta_max must be a positive number or None, got {eta_max}")
        bound = np.minimum(bound, float(eta_max))
    if variant == "paper":
        eta, guarded, iters = _paper(a_, b_, c_, th, phi, beta, bound)
        guarded |= bad
        evals = 0
    else:
        eta, iters, evals = _exact(a_, b_, c_, th, phi, beta, bound, rtol, max_iter)
        guarded = bad
    eta = np.where(guarded | ~np.isfinite(eta), 0.0, eta)
    if guarded.any():
        log.warning(
            "learning-rate guard: %d of %d clients got eta*=0 (non-positive q or phi2', or non-finite input)",
            int(guarded.sum()), guarded.size,
        )
    return LRSolution(eta_star=eta, bound=bound, guarded=guarded, iterations=iters, evaluations=evals)


def paper_closed_form(
    a: FloatArray, b: FloatArray, c: FloatArray, theta: FloatArray, phi2_next: FloatArray, beta: float
) -> FloatArray:
    """The printed formula: max{0, a / ((1−β)φ2'/(βθ(1 + log p(0))) + ‖g‖)}, ‖g‖ = √b (unclipped)."""
    ell0 = 1.0 + np.log(theta * c / phi2_next)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        denom = (1.0 - beta) * phi2_next / (beta * theta * ell0) + np.sqrt(b)
        val = np.maximum(0.0, a / denom)
    return np.where(ell0 == 0.0, 0.0, val)


def _paper(
    a: FloatArray, b: FloatArray, c: FloatArray, th: FloatArray, phi: FloatArray, beta: float, bound: FloatArray
) -> tuple[FloatArray, NDArray[np.bool_], int]:
    val = paper_closed_form(a, b, c, th, phi, beta)
    guarded = ~np.isfinite(val)  # the printed denominator vanished
    return np.minimum(np.where(guarded, 0.0, val), bound), guarded, 0


def _f_and_slope(
    x: FloatArray, a: FloatArray, b: FloatArray, c: FloatArray, th: FloatArray, phi: FloatArray, k: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """F(η) = η − h(η) and F'(η) = 1 + K(b·L + 2r²/q), L = 1 + log p (valid where q > 0)."""
    r = a - x * b
    q = c + x * (x * b - 2.0 * a)
    ell = 1.0 + np.log(th * q / phi)
    return x - k * r * ell, 1.0 + k * (b * ell + 2.0 * r * r / q)


def _exact(
    a: FloatArray,
    b: FloatArray,
    c: FloatArray,
    th: FloatArray,
    phi: FloatArray,
    beta: float,
    bound: FloatArray,
    rtol: float,
    max_iter: int,
) -> tuple[FloatArray, int, int]:
    """η* of variant exact, the Newton sweeps it took and the F evaluations (summed over clients)."""
    k = beta * th / ((1.0 - beta) * phi)
    q_star = phi / (np.e * th)  # q at which 1 + log p = 0
    ell0 = 1.0 + np.log(th * c / phi)
    h0 = k * a * ell0
    eta = np.zeros_like(a)
    active = (h0 > 0) & (bound > 0)
    case_a = active & (a > 0)  # here ell0 > 0: F increasing and concave on the bracket
    # otherwise (active and a < 0) ell0 < 0: F convex on the bracket
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        disc_a = a * a - b * (c - q_star)
        s_l_a = np.where(disc_a >= 0, (c - q_star) / (a + np.sqrt(np.maximum(disc_a, 0.0))), np.inf)
        s_r = np.where(b > 0, a / b, np.inf)
        disc_b = a * a + b * (q_star - c)
        s_l_b = (q_star - c) / (-a + np.sqrt(np.maximum(disc_b, 0.0)))
    upper = np.where(case_a, np.minimum(np.minimum(s_r, s_l_a), bound), np.minimum(s_l_b, bound))
    upper = np.where(active, upper, 0.0)
    # Where the bracket reaches B and F(B) ≤ 0, h(B) ≥ B and the clipped equation's root is B.
    idx = np.flatnonzero(active)
    if idx.size == 0:
        return eta, 0, 0
    evals = 0
    at_b = upper[idx] >= bound[idx]
    if at_b.any():
        j = idx[at_b]
        evals += j.size
        f_b, _ = _f_and_slope(bound[j], a[j], b[j], c[j], th[j], phi[j], k[j])
        hit = f_b <= 0
        eta[j[hit]] = bound[j[hit]]
        idx = np.concatenate([idx[~at_b], j[~hit]])
    idx.sort()
    lo = np.zeros(idx.size)
    hi = upper[idx].copy()
    x = np.where(case_a[idx], lo, hi)  # the side from which Newton converges monotonically
    aa, bb, cc, tt, pp, kk = a[idx], b[idx], c[idx], th[idx], phi[idx], k[idx]
    done = np.zeros(idx.size, dtype=bool)
    zero_seen = x == 0.0
    iters = 0
    while not done.all() and iters < max_iter:
        iters += 1
        w = np.flatnonzero(~done)
        evals += w.size
        xw = x[w]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            f, fp = _f_and_slope(xw, aa[w], bb[w], cc[w], tt[w], pp[w], kk[w])
            neg = f < 0
            lo[w] = np.where(neg, xw, lo[w])
            hi[w] = np.where(neg, hi[w], xw)
            newton = xw - f / fp
        finite = np.isfinite(newton) & (fp > 0)
        # A Newton step below the tolerance means x is the root to rtol (the step may touch the bracket).
        tiny = finite & (np.abs(newton - xw) <= rtol * np.abs(xw))
        # A step that overshoots 0 by rounding (root ≪ x) goes to η = 0 once; F(0) < 0 is then known.
        to_zero = finite & (newton < lo[w]) & (lo[w] == 0.0) & ~zero_seen[w]
        ok = finite & (newton >= lo[w]) & (newton <= hi[w]) & (newton != xw)
        nxt = np.where(ok, newton, np.where(to_zero, 0.0, 0.5 * (lo[w] + hi[w])))
        zero_seen[w] |= (xw == 0.0) | to_zero
        conv = (f == 0) | tiny | (np.abs(nxt - xw) <= rtol * np.abs(nxt)) | (hi[w] - lo[w] <= rtol * hi[w])
        x[w] = np.where((f == 0) | tiny, np.clip(np.where(tiny, newton, xw), lo[w], hi[w]), nxt)
        done[w] = conv
    eta[idx] = x
    return eta, iters, evals
