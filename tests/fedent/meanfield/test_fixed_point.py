"""Algorithm 1 on per-client quadratics F_i(w) = ½‖w − m_i‖² (gradient w − m_i in closed form)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from torch import Tensor

from fedent.meanfield.fixed_point import solve_fixed_point
from fedent.meanfield.lr import solve_eta
from fedent.meanfield.scalar_fixed_point import solve_online

BETA = 0.9


class QuadraticOracle:
    """∇F_i(w) = w − m_i, counting calls."""

    def __init__(self, means: np.ndarray) -> None:
        self.means = [torch.tensor(m, dtype=torch.float64) for m in means]
        self.calls = 0

    def gradient(self, t: int, cid: int, point: Sequence[Tensor]) -> list[Tensor]:
        self.calls += 1
        return [point[0] - self.means[cid]]


def _problem(seed: int = 0, n: int = 5, d: int = 6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n, d)) * 2.0
    w0 = rng.normal(size=d)
    sizes = rng.integers(10, 100, size=n)
    return means, w0, sizes / sizes.sum()


def _simulate(means: np.ndarray, w0: np.ndarray, thetas: np.ndarray, phi2: np.ndarray, horizon: int):
    """Direct simulation of the clients (Eq. (equ_dynamicsMF)) with rates from Prop. 1 at the given φ2(t+1)."""
    w = w0.copy()
    ws, s2 = [w.copy()], [float(w @ w)]
    for t in range(horizon):
        g = w[None, :] - means
        sol = solve_eta(g @ w, (g * g).sum(1), float(w @ w), thetas, phi2[t + 1], BETA)
        local = w[None, :] - sol.eta_star[:, None] * g
        w = (thetas[:, None] * local).sum(0)
        ws.append(w.copy())
        s2.append(float((thetas * (local * local).sum(1)).sum()))
    return ws, np.array(s2)


def test_fixed_point_reproduces_direct_simulation() -> None:
    """Proposition 2: at the fixed point φ1(t), φ2(t) equal Σθ_i w_i(t), Σθ_i‖w_i(t)‖² of the clients."""
    means, w0, thetas = _problem()
    horizon = 4
    oracle = QuadraticOracle(means)
    res = solve_fixed_point(
        oracle, [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(), horizon, BETA,
        eps1=1e-12, eps2=1e-12, max_sweeps=200,
    )
    rep = res.report
    assert rep.converged and rep.stop_reason == "converged" and rep.stopped_by == "eps1+eps2"
    assert rep.phi1_residual < 1e-12 and rep.phi2_residual < 1e-12
    assert len(rep.history) == rep.sweeps > 1
    assert rep.gradient_evaluations == oracle.calls == rep.sweeps * horizon * len(thetas)
    assert np.count_nonzero(res.eta_star) > 0, "degenerate test: every rate is zero"
    ws, s2 = _simulate(means, w0, thetas, res.phi2, horizon)
    for t in range(horizon + 1):
        np.testing.assert_allclose(res.phi1[t][0].numpy(), ws[t], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.phi2, s2, rtol=1e-9)


def test_first_sweep_uses_initial_norm_and_max_sweeps_stops() -> None:
    means, w0, thetas = _problem(seed=3)
    res = solve_fixed_point(
        QuadraticOracle(means), [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(), 3, BETA,
        eps1=1e-300, eps2=1e-300, max_sweeps=1,
    )
    rep = res.report
    assert rep.sweeps == 1 and rep.stop_reason == "max_sweeps" and not rep.converged
    # Sweep 1 at t = 0 solves with φ2(1) = ‖w(0)‖² (spec §3).
    g = w0[None, :] - means
    first = solve_eta(g @ w0, (g * g).sum(1), float(w0 @ w0), thetas, float(w0 @ w0), BETA)
    np.testing.assert_allclose(res.eta_star[0], first.eta_star, rtol=1e-12)


def test_online_matches_offline_on_one_round_horizon() -> None:
    means, w0, thetas = _problem(seed=1)
    res = solve_fixed_point(
        QuadraticOracle(means), [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(), 1, BETA,
        eps1=1e-13, eps2=1e-13, max_sweeps=500,
    )
    assert res.report.converged
    g = w0[None, :] - means
    online = solve_online(float(w0 @ w0), thetas, g @ w0, (g * g).sum(1), BETA)
    assert online.bracketed and online.residual < 1e-10
    assert online.phi2_next == pytest.approx(float(res.phi2[1]), rel=1e-9)
    np.testing.assert_allclose(online.eta_star, res.eta_star[0], rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [{"horizon": 0}, {"beta": 1.0}, {"variant": "x"}, {"eps1": 0.0}, {"max_sweeps": 0}, {"thetas": [0.5, 0.6]}],
)
def test_bad_arguments_are_clear_errors(kwargs: dict) -> None:
    args = {"horizon": 2, "beta": BETA, "variant": "exact", "eps1": 1e-3, "max_sweeps": 3, "thetas": [0.5, 0.5]}
    args.update(kwargs)
    oracle = QuadraticOracle(np.zeros((2, 3)))
    with pytest.raises(ValueError):
        solve_fixed_point(
            oracle, [torch.ones(3, dtype=torch.float64)], [0, 1], args["thetas"], args["horizon"], args["beta"],
            args["variant"], args["eps1"], 1e-3, args["max_sweeps"],
        )


def _simulate_scheduled(means: np.ndarray, w0: np.ndarray, sizes: np.ndarray, phi2: np.ndarray,
                        schedule: list[list[int]], gamma: float, base_lr: float, eta_max: float | None):
    """Training as it runs (spec §5): round t's sampled clients, θ over them, each stepping with its decayed
    rate γη_i(t−1) + (1 − γ)η*_i (η_i(−1) = base_lr, carried over skipped rounds), η* capped at eta_max."""
    w = w0.copy()
    prev = np.full(len(sizes), base_lr)
    ws, s2 = [w.copy()], [float(w @ w)]
    for t, part in enumerate(schedule):
        idx = np.asarray(part)
        th = sizes[idx] / sizes[idx].sum()
        g = w[None, :] - means[idx]
        star = solve_eta(g @ w, (g * g).sum(1), float(w @ w), th, phi2[t + 1], BETA, eta_max=eta_max).eta_star
        eta = gamma * prev[idx] + (1 - gamma) * star
        prev[idx] = eta
        local = w[None, :] - eta[:, None] * g
        w = (th[:, None] * local).sum(0)
        ws.append(w.copy())
        s2.append(float((th * (local * local).sum(1)).sum()))
    return ws, np.array(s2)


@pytest.mark.parametrize("gamma,eta_max", [(0.5, 1.0), (0.9, 0.05), (0.0, None)])
def test_scheduled_used_rate_fixed_point_replicates_training(gamma: float, eta_max: float | None) -> None:
    """Spec §5 (one θ, rate used, η ∈ [0, eta_max]): at Algorithm 1's fixed point, φ1(t) and φ2(t) equal
    Σθ_i w_i(t) and Σθ_i‖w_i(t)‖² of the run that follows — the same clients, θ and rates."""
    means, w0, _ = _problem(seed=5, n=8)
    sizes = np.random.default_rng(5).integers(10, 100, size=8).astype(float)
    schedule = [[0, 3, 5], [1, 3], [2, 4, 6, 7], [0, 5]]  # client 3 and 5 come back after a gap
    oracle = QuadraticOracle(means)
    res = solve_fixed_point(oracle, [torch.tensor(w0)], list(range(8)), (sizes / sizes.sum()).tolist(), 4, BETA,
                            eps1=1e-13, eps2=1e-13, max_sweeps=300, schedule=schedule, eta_max=eta_max,
                            phi2_rate="used", gamma=gamma, base_lr=0.02)
    assert res.report.converged
    assert oracle.calls == res.report.sweeps * sum(len(p) for p in schedule)  # only the sampled clients
    assert res.eta is not None and np.isnan(res.eta[0, 1]) and not np.isnan(res.eta[1, 1])
    if eta_max is not None:
        assert np.all(res.eta_star <= eta_max)
    ws, s2 = _simulate_scheduled(means, w0, sizes, res.phi2, schedule, gamma, 0.02, eta_max)
    for t in range(5):
        np.testing.assert_allclose(res.phi1[t][0].numpy(), ws[t], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.phi2, s2, rtol=1e-9)


def test_online_used_rate_matches_offline_on_one_round_horizon() -> None:
    means, w0, thetas = _problem(seed=1)
    res = solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(),
                            1, BETA, eps1=1e-13, eps2=1e-13, max_sweeps=500, phi2_rate="used", gamma=0.7,
                            base_lr=0.05, eta_max=1.0)
    g = w0[None, :] - means
    online = solve_online(float(w0 @ w0), thetas, g @ w0, (g * g).sum(1), BETA, eta_max=1.0,
                          eta_prev=np.full(len(thetas), 0.05), gamma=0.7)
    assert online.phi2_next == pytest.approx(float(res.phi2[1]), rel=1e-9)


def test_schedule_must_fit_the_clients() -> None:
    means, w0, thetas = _problem()
    for sched, why in (([[0]], "rounds"), ([[0], [9]], "not among"), ([[0], []], "at least one")):
        with pytest.raises(ValueError, match=why):
            solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(),
                              2, BETA, schedule=sched)
