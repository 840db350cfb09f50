"""The online scalar fixed point φ2' = Σθ_i q_i(η*_i(φ2')) (fedent.meanfield.scalar_fixed_point)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedent.meanfield.lr import q_value, solve_eta
from fedent.meanfield.scalar_fixed_point import solve_online


def _g(phi: float, c: float, th: np.ndarray, a: np.ndarray, b: np.ndarray, beta: float, variant: str) -> float:
    sol = solve_eta(a, b, c, th, phi, beta, variant)
    return float(np.sum(th * q_value(sol.eta_star, a, b, c)))


@st.composite
def rounds(draw: st.DrawFn) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, float, str]:
    n = draw(st.integers(1, 30))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    d = 10
    scale_w = 10 ** draw(st.floats(-3, 3))
    scale_g = 10 ** draw(st.floats(-3, 3))
    w = rng.normal(size=d) * scale_w
    g = rng.normal(size=(n, d)) * scale_g
    if draw(st.booleans()):  # some gradients (anti)parallel to w
        g[: n // 2] = w[None, :] * rng.normal(size=(n // 2, 1)) * scale_g / scale_w
    th = rng.dirichlet(np.ones(n))
    return float(w @ w), th, g @ w, (g * g).sum(1), draw(st.sampled_from([0.5, 0.9, 0.99])), draw(
        st.sampled_from(["exact", "paper"])
    )


Round = tuple[float, np.ndarray, np.ndarray, np.ndarray, float, str]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(rounds())
def test_root_is_a_fixed_point_inside_its_bracket(r: Round) -> None:
    c, th, a, b, beta, variant = r
    sol = solve_online(c, th, a, b, beta, variant)
    assert sol.bracketed
    phi = sol.phi2_next
    assert math.isfinite(phi) and phi > 0
    lo, hi = sol.bracket
    assert lo <= phi <= hi
    assert lo - _g(lo, c, th, a, b, beta, variant) <= 0 <= hi - _g(hi, c, th, a, b, beta, variant)
    assert abs(phi - _g(phi, c, th, a, b, beta, variant)) <= 1e-9 * phi
    np.testing.assert_array_equal(sol.eta_star, solve_eta(a, b, c, th, phi, beta, variant).eta_star)


def test_root_is_the_first_one_from_c_in_the_iteration_direction() -> None:
    """With G nondecreasing, iterating φ ← G(φ) from c converges to the same root."""
    rng = np.random.default_rng(5)
    w = rng.normal(size=8)
    g = rng.normal(size=(6, 8))
    th = np.full(6, 1 / 6)
    c, a, b = float(w @ w), g @ w, (g * g).sum(1)
    sol = solve_online(c, th, a, b, 0.9)
    phi = c
    for _ in range(2000):
        nxt = _g(phi, c, th, a, b, 0.9, "exact")
        if abs(nxt - phi) <= 1e-15 * phi:
            break
        phi = nxt
    assert sol.phi2_next == pytest.approx(phi, rel=1e-9)


def test_degenerate_inputs_do_not_crash() -> None:
    th, a, b = np.array([0.5, 0.5]), np.array([0.1, -0.2]), np.array([1.0, 2.0])
    for c in (0.0, -1.0, math.nan):
        sol = solve_online(c, th, a, b, 0.9)
        assert sol.phi2_next == 0.0 and sol.guards == 2 and np.all(sol.eta_star == 0)
    sol = solve_online(1.0, th, np.array([math.nan, 0.1]), b, 0.9)
    assert math.isfinite(sol.phi2_next) and sol.guarded.tolist() == [True, False]
    with pytest.raises(ValueError):
        solve_online(1.0, th, a[:1], b, 0.9)


# ---- spec §5: the mean field at the rate actually used -------------------------------------------------


@settings(max_examples=60, deadline=None, derandomize=True)
@given(rounds(), st.sampled_from([0.0, 0.5, 0.99, 1.0]), st.sampled_from([None, 1.0]),
       st.floats(1e-4, 1.0))
def test_used_rate_fixed_point(r: Round, gamma: float, eta_max: float | None, prev_scale: float) -> None:
    """φ2' = Σθ_i q_i(γη_i(t−1) + (1 − γ)η*_i(φ2')) at the returned root, the rates at it are Eq. (eta_deacy)'s,
    and γ = 0 is the star reading."""
    c, th, a, b, beta, variant = r
    prev = np.random.default_rng(len(th)).uniform(0, prev_scale, size=th.size)
    sol = solve_online(c, th, a, b, beta, variant, eta_max=eta_max, eta_prev=prev, gamma=gamma)
    assert sol.bracketed
    phi = sol.phi2_next
    star = solve_eta(a, b, c, th, phi, beta, variant, eta_max=eta_max).eta_star
    np.testing.assert_array_equal(sol.eta_star, star)
    np.testing.assert_allclose(sol.eta, gamma * prev + (1 - gamma) * star, rtol=1e-15, atol=0)
    assert abs(phi - float(np.sum(th * q_value(sol.eta, a, b, c)))) <= 1e-9 * phi
    if gamma == 0.0:
        plain = solve_online(c, th, a, b, beta, variant, eta_max=eta_max)
        assert plain.phi2_next == pytest.approx(phi, rel=1e-9)
    if gamma == 1.0:  # the rate is frozen: φ2' is Σθ q(η_prev), whatever η* is
        assert phi == pytest.approx(float(np.sum(th * q_value(prev, a, b, c))), rel=1e-9)


def test_used_rate_needs_one_valid_previous_rate_per_client() -> None:
    for bad in ([0.1], [0.1, -1.0], [0.1, math.nan]):
        with pytest.raises(ValueError, match="eta_prev"):
            solve_online(1.0, [0.5, 0.5], [-0.1, 0.1], [1.0, 1.0], 0.9, eta_prev=bad, gamma=0.5)
