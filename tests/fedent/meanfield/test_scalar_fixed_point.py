"""The online scalar fixed point φ2' = Σθ_i q_i(η*_i(φ2')) (fedent.meanfield.scalar_fixed_point)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedent.meanfield.lr import q_value, solve_eta
from fedent.meanfield.scalar_fixed_point import _MAX_EXPANSIONS, _bracket, _illinois, solve_online


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
    f = phi - _g(phi, c, th, a, b, beta, variant)
    assert sol.residual == pytest.approx(abs(f) / phi, rel=1e-12, abs=1e-300)  # reported honestly
    if abs(f) > 1e-9 * phi:
        # Only the paper variant: its printed closed form jumps (η from 0 to the bound where its denominator
        # changes sign), so G can jump over the diagonal and no fixed point exists; the solver then returns
        # the sign change of F to rtol, with the residual it has.
        assert variant == "paper", (f, sol.to_dict())
        f_lo = phi * (1 - 1e-9) - _g(phi * (1 - 1e-9), c, th, a, b, beta, variant)
        f_hi = phi * (1 + 1e-9) - _g(phi * (1 + 1e-9), c, th, a, b, beta, variant)
        assert f_lo <= 0 <= f_hi
    np.testing.assert_array_equal(sol.eta_star, solve_eta(a, b, c, th, phi, beta, variant).eta_star)
    # the cost is what the solver reports: one G evaluation at c, one per bracket step, one per Illinois step
    assert 1 + sol.expansions <= sol.iterations <= 1 + sol.expansions + sol.refinements


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


def test_illinois_needs_a_handful_of_steps_where_bisection_needs_forty() -> None:
    """Solver cost, from the counts the solver reports (not the clock), over 300 seeded rounds of every scale
    (exact variant): regula falsi with the Illinois fix reaches rtol 1e-12 in at most 15 steps, 1,531 in all
    (measured); bisection halves a bracket [c, 2c] ~40 times, regula falsi without the Illinois fix on either
    side stalls (57 steps, 2,140 in all), and without a convergence test it would run max_iter = 200."""
    total = worst = 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        n, scale_w, scale_g = int(rng.integers(1, 30)), 10 ** rng.uniform(-3, 3), 10 ** rng.uniform(-3, 3)
        w, g = rng.normal(size=10) * scale_w, rng.normal(size=(n, 10)) * scale_g
        if seed % 2:  # some gradients (anti)parallel to w
            g[: n // 2] = w[None, :] * rng.normal(size=(n // 2, 1)) * scale_g / scale_w
        sol = solve_online(float(w @ w), rng.dirichlet(np.ones(n)), g @ w, (g * g).sum(1), [0.5, 0.9, 0.99][seed % 3])
        assert sol.bracketed and sol.residual <= 1e-9
        assert sol.iterations == 1 + sol.expansions + sol.refinements  # G at c, one per step
        d = sol.to_dict()
        assert (d["iterations"], d["expansions"], d["refinements"]) == (sol.iterations, sol.expansions,
                                                                        sol.refinements)
        total, worst = total + sol.refinements, max(worst, sol.refinements)
    assert worst <= 16 and 1000 <= total <= 1700, (worst, total)


def test_degenerate_inputs_do_not_crash() -> None:
    th, a, b = np.array([0.5, 0.5]), np.array([0.1, -0.2]), np.array([1.0, 2.0])
    for c in (0.0, -1.0, math.nan):
        sol = solve_online(c, th, a, b, 0.9)
        assert sol.phi2_next == 0.0 and sol.guards == 2 and np.all(sol.eta_star == 0)
    sol = solve_online(1.0, th, np.array([math.nan, 0.1]), b, 0.9)
    assert sol.guarded.tolist() == [True, False] and sol.bracketed
    # the guarded client stays at q = c; the other moves: φ2' = 0.5·c + 0.5·q(η*(φ2')) just below c = 1
    eta = solve_eta(0.1, 2.0, 1.0, 0.5, sol.phi2_next, 0.9).eta_star
    assert sol.eta_star[1] == eta[0] > 0 and sol.eta_star[0] == 0.0
    assert sol.phi2_next == pytest.approx(0.5 + 0.5 * float(q_value(eta, 0.1, 2.0, 1.0)[0]), rel=1e-12)
    assert sol.phi2_next == pytest.approx(0.99767805463799, rel=1e-9)
    assert sol.residual <= 1e-12 and sol.bracket == (0.5, 1.0)
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


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9, 1.0])
def test_a_previous_rate_of_zero(gamma: float) -> None:
    """η_i(t−1) = 0 (a client whose last η* was 0, or base rate 0: real runs have it): η_i = (1 − γ)η*_i, and
    γ = 1 freezes every rate at 0 so φ2' = Σθ q(0) = c exactly; γ = 0 is the star reading."""
    th, a, b, c = np.array([0.5, 0.5]), np.array([0.1, -0.2]), np.array([1.0, 2.0]), 1.0
    sol = solve_online(c, th, a, b, 0.9, eta_prev=[0.0, 0.0], gamma=gamma)
    assert sol.bracketed and sol.guards == 0
    phi = sol.phi2_next
    star = solve_eta(a, b, c, th, phi, 0.9).eta_star
    np.testing.assert_array_equal(sol.eta_star, star)
    np.testing.assert_allclose(sol.eta, (1 - gamma) * star, rtol=1e-15, atol=0)
    assert abs(phi - float(np.sum(th * q_value(sol.eta, a, b, c)))) <= 1e-12 * phi
    if gamma == 1.0:
        assert phi == c and np.all(sol.eta == 0.0)
    else:
        assert star[0] > 0 and phi < c  # client 0 descends (a > 0), so the mean field shrinks
        plain = solve_online(c, th, a, b, 0.9)
        assert (phi == pytest.approx(plain.phi2_next, rel=1e-12)) == (gamma == 0.0)


# ---- the two solver parts on residuals whose answers are known exactly -----------------------------------


def test_bracket_doubles_up_from_the_start_to_the_first_sign_change() -> None:
    # F(x) = x - 5 from 1: 1 -> 2 -> 4 -> 8, the sign changes between 4 and 8 after three doublings
    assert _bracket(lambda x: x - 5.0, 1.0) == (4.0, 8.0, True, 3)


def test_bracket_halves_down_and_stops_at_an_exact_zero() -> None:
    # F(x) = x - 0.25 from 1: 1 -> 0.5 -> 0.25, where F is exactly 0: that end point closes the bracket
    assert _bracket(lambda x: x - 0.25, 1.0) == (0.25, 0.5, True, 2)


def test_bracket_of_a_root_at_the_start_is_that_point() -> None:
    assert _bracket(lambda x: x - 1.0, 1.0) == (1.0, 1.0, True, 0)


def test_bracket_without_a_sign_change_says_so() -> None:
    lo, hi, bracketed, k = _bracket(lambda x: -1.0, 1.0)
    assert not bracketed and lo == hi == 2.0 ** _MAX_EXPANSIONS and k == _MAX_EXPANSIONS


def test_illinois_returns_an_end_point_that_is_already_a_root_without_a_step() -> None:
    assert _illinois(lambda x: x - 1.0, 1.0, 3.0, 1e-12, 100) == (1.0, 0)
    assert _illinois(lambda x: x - 3.0, 1.0, 3.0, 1e-12, 100) == (3.0, 0)


def test_illinois_stops_when_the_bracket_is_exactly_at_the_tolerance() -> None:
    # hi - lo = 1 = rtol * hi: already converged, no step
    assert _illinois(lambda x: x - 1.5, 1.0, 2.0, 0.5, 100) == (1.0, 0)


def test_illinois_returns_the_end_point_with_the_smaller_residual() -> None:
    assert _illinois(lambda x: x - 1.9, 1.0, 2.0, 1e-12, 0) == (2.0, 0)
    assert _illinois(lambda x: x - 1.1, 1.0, 2.0, 1e-12, 0) == (1.0, 0)
    assert _illinois(lambda x: x - 1.5, 1.0, 2.0, 1e-12, 0) == (1.0, 0)  # a tie keeps the lower end


def test_illinois_first_two_steps_are_plain_regula_falsi() -> None:
    # Concave F = sqrt(x) - 1.2 on [0, 4]: the first step lands right of the root (F > 0), so hi moves; the
    # Illinois halving applies only when the same side moves twice, so the second point is plain regula falsi.
    seen: list[float] = []

    def f(x: float) -> float:
        seen.append(x)
        return math.sqrt(x) - 1.2

    _illinois(f, 0.0, 4.0, 1e-12, 2)
    x1 = 4.0 - 0.8 * 4.0 / (0.8 + 1.2)
    f1 = math.sqrt(x1) - 1.2
    assert seen[2] == pytest.approx(x1, rel=1e-15) and f1 > 0
    assert seen[3] == pytest.approx(x1 - f1 * x1 / (f1 + 1.2), rel=1e-15)


def test_bracket_stops_at_the_first_sign_change_however_small() -> None:
    # F(x) = x - 7.5 from 1: F(8) = 0.5 is the first value >= 0, so [4, 8] after three doublings
    assert _bracket(lambda x: x - 7.5, 1.0) == (4.0, 8.0, True, 3)


def test_illinois_stops_at_an_exact_root_of_a_step() -> None:
    # regula falsi on F(x) = x - 1.5 over [1, 2] lands on 1.5 exactly, where F = 0: one step
    assert _illinois(lambda x: x - 1.5, 1.0, 2.0, 1e-12, 100) == (1.5, 1)


def test_illinois_bisects_when_regula_falsi_gives_an_end_point() -> None:
    # F(1) = -1e-300, F(2) = 1: the secant point 2 - 1·1/(1 + 1e-300) rounds to lo = 1, no progress: bisect
    seen: list[float] = []

    def f(x: float) -> float:
        seen.append(x)
        return x - 1.0 - 1e-300

    assert 2.0 - f(2.0) * (2.0 - 1.0) / (f(2.0) - f(1.0)) == 1.0
    seen.clear()
    _illinois(f, 1.0, 2.0, 1e-12, 1)
    assert seen[:3] == [1.0, 2.0, 1.5]


def test_the_report_as_a_dict() -> None:
    th, a, b = np.array([0.5, 0.5]), np.array([0.1, math.nan]), np.array([2.0, 1.0])
    sol = solve_online(1.0, th, a, b, 0.9)
    assert sol.guards == 1 and sol.bracketed
    assert sol.to_dict() == {
        "phi2_next": sol.phi2_next, "iterations": sol.iterations, "bracket": [sol.bracket[0], sol.bracket[1]],
        "residual": sol.residual, "bracketed": True, "guards": 1, "expansions": sol.expansions,
        "refinements": sol.refinements,
    }
    assert sol.bracket == (0.5, 1.0) and sol.to_dict()["bracket"] == [0.5, 1.0]
    assert sol.to_dict()["residual"] <= 1e-12 and 0.99 < sol.to_dict()["phi2_next"] < 1.0


def test_the_used_rate_default_gamma_is_zero() -> None:
    """With eta_prev and no gamma, η = (1 − 0)·η* + 0·η_prev: the star reading."""
    th, a, b = np.array([0.5, 0.5]), np.array([0.1, -0.2]), np.array([1.0, 2.0])
    used = solve_online(1.0, th, a, b, 0.9, eta_prev=[0.3, 0.7])
    star = solve_online(1.0, th, a, b, 0.9)
    assert used.phi2_next == star.phi2_next
    np.testing.assert_array_equal(used.eta, star.eta_star)


def test_no_usable_mean_field_keeps_the_decayed_previous_rate() -> None:
    """c ≤ 0 or non-finite: every client guarded (η* = 0), no G evaluated, no bracket; the rate used is γη_prev."""
    th, a, b = np.array([0.5, 0.5]), np.array([0.1, -0.2]), np.array([1.0, 2.0])
    for c in (0.0, math.inf):
        sol = solve_online(c, th, a, b, 0.9, eta_prev=[0.2, 0.4], gamma=0.5)
        assert sol.phi2_next == 0.0 and sol.iterations == 0 and sol.bracketed is False
        assert sol.bracket == (0.0, 0.0) and sol.residual == 0.0 and sol.expansions == sol.refinements == 0
        assert sol.guarded.dtype == np.bool_ and sol.guarded.tolist() == [True, True]
        np.testing.assert_array_equal(sol.eta, [0.1, 0.2])
        np.testing.assert_array_equal(sol.eta_star, [0.0, 0.0])
    np.testing.assert_array_equal(solve_online(-1.0, th, a, b, 0.9).eta, [0.0, 0.0])


@pytest.mark.parametrize("th,a,b", [
    ([0.5, 0.5], [0.1], [1.0, 1.0]),  # one a short
    ([[0.5, 0.5]], [[0.1, 0.2]], [[1.0, 1.0]]),  # equal shapes, but 2-D
    ([], [], []),  # no participant
])
def test_participants_must_be_one_equal_length_list(th: list, a: list, b: list) -> None:
    with pytest.raises(ValueError, match=r"^thetas, a and b must be equal-length non-empty 1-D arrays$"):
        solve_online(1.0, th, a, b, 0.9)
