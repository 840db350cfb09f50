"""Algorithm 1 on per-client quadratics F_i(w) = ½‖w − m_i‖² (gradient w − m_i in closed form)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from torch import Tensor

from fedent.meanfield.fixed_point import gradients_at, solve_fixed_point
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
    ("kwargs", "message"),
    [({"horizon": 0}, "horizon T must be >= 1, got 0"), ({"beta": 1.0}, "beta must be in (0, 1), got 1.0"),
     ({"variant": "x"}, "variant must be one of ('exact', 'paper'), got 'x'"),
     ({"eps1": 0.0}, "eps1 and eps2 must be > 0"), ({"eps2": 0.0}, "eps1 and eps2 must be > 0"),
     ({"max_sweeps": 0}, "max_sweeps must be >= 1, got 0"),
     ({"thetas": [0.5, 0.6]}, "thetas must be finite, non-negative and sum to 1"),
     ({"thetas": [1.5, -0.5]}, "thetas must be finite, non-negative and sum to 1"),
     ({"thetas": [float("nan"), 1.0]}, "thetas must be finite, non-negative and sum to 1"),
     ({"thetas": [0.2, 0.3, 0.5]}, "need one theta per client and at least one client"),
     ({"ids": [], "thetas": []}, "need one theta per client and at least one client")],
)
def test_bad_arguments_are_clear_errors(kwargs: dict, message: str) -> None:
    args = {"horizon": 2, "beta": BETA, "variant": "exact", "eps1": 1e-3, "eps2": 1e-3, "max_sweeps": 3,
            "thetas": [0.5, 0.5], "ids": [0, 1]}
    args.update(kwargs)
    oracle = QuadraticOracle(np.zeros((2, 3)))
    with pytest.raises(ValueError) as e:
        solve_fixed_point(
            oracle, [torch.ones(3, dtype=torch.float64)], args["ids"], args["thetas"], args["horizon"], args["beta"],
            args["variant"], args["eps1"], args["eps2"], args["max_sweeps"],
        )
    assert str(e.value) == message
    assert oracle.calls == 0


class BatchedOracle(QuadraticOracle):
    """Answers a round's clients in one call (as the estimator's remote oracle does), recording each call."""

    def __init__(self, means: np.ndarray) -> None:
        super().__init__(means)
        self.asked: list[tuple[int, list[int]]] = []

    def gradients(self, t: int, cids: list[int], point: Sequence[Tensor]) -> list[list[Tensor]]:
        self.asked.append((t, list(cids)))
        return [[point[0] - self.means[c]] for c in cids]


class RecordingOracle(QuadraticOracle):
    def __init__(self, means: np.ndarray) -> None:
        super().__init__(means)
        self.steps: list[tuple[int, int]] = []

    def gradient(self, t: int, cid: int, point: Sequence[Tensor]) -> list[Tensor]:
        self.steps.append((t, cid))
        return super().gradient(t, cid, point)


def test_gradients_are_asked_for_the_right_step_and_clients_batched_when_the_oracle_can() -> None:
    means, w0, thetas = _problem(seed=4)
    point = [torch.tensor(w0)]
    batched = BatchedOracle(means)
    got = gradients_at(batched, 3, (2, 0), point)
    assert batched.asked == [(3, [2, 0])] and batched.calls == 0
    assert torch.equal(got[0][0], point[0] - batched.means[2]) and torch.equal(got[1][0], point[0] - batched.means[0])
    one = RecordingOracle(means)
    assert [g[0].tolist() for g in gradients_at(one, 5, [1, 3], point)] == [g[0].tolist() for g in
                                                                            gradients_at(batched, 5, [1, 3], point)]
    assert one.steps == [(5, 1), (5, 3)]
    # Algorithm 1 asks step t's gradients for t = 0..T-1 in every sweep, with the sweep's clients
    rec = RecordingOracle(means)
    res = solve_fixed_point(rec, point, [0, 1, 2, 3, 4], thetas.tolist(), 3, BETA, eps1=1e-300, eps2=1e-300,
                            max_sweeps=2)
    assert res.report.sweeps == 2 and rec.steps == [(t, c) for _ in range(2) for t in range(3) for c in range(5)]
    bat = BatchedOracle(means)
    same = solve_fixed_point(bat, point, [0, 1, 2, 3, 4], thetas.tolist(), 3, BETA, eps1=1e-300, eps2=1e-300,
                             max_sweeps=2)
    assert bat.asked == [(t, [0, 1, 2, 3, 4]) for _ in range(2) for t in range(3)]
    np.testing.assert_array_equal(res.phi2, same.phi2)


def test_residuals_are_the_relative_changes_of_the_sweep() -> None:
    """Sweep 1 starts from φ1(t) = w(0) and φ2(t) = ‖w(0)‖², so its residuals are max_t ‖φ1'(t) − w(0)‖/‖w(0)‖ and
    max_t |φ2'(t) − ‖w(0)‖²| / ‖w(0)‖²; sweep 2's are the changes from sweep 1's results."""
    means, w0, thetas = _problem(seed=4)
    args = (list(range(len(thetas))), thetas.tolist(), 3, BETA)
    one = solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], *args, eps1=1e-300, eps2=1e-300,
                            max_sweeps=1)
    c0 = float(w0 @ w0)
    r1 = max(float(np.linalg.norm(one.phi1[t][0].numpy() - w0)) / c0 ** 0.5 for t in range(1, 4))
    r2 = max(abs(float(one.phi2[t]) - c0) / c0 for t in range(1, 4))
    assert one.report.history[0] == (pytest.approx(r1, rel=1e-12), pytest.approx(r2, rel=1e-12))
    two = solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], *args, eps1=1e-300, eps2=1e-300,
                            max_sweeps=2)
    r1b = max(float(np.linalg.norm(two.phi1[t][0].numpy() - one.phi1[t][0].numpy()))
              / float(np.linalg.norm(one.phi1[t][0].numpy())) for t in range(1, 4))
    r2b = max(abs(float(two.phi2[t]) - float(one.phi2[t])) / abs(float(one.phi2[t])) for t in range(1, 4))
    assert two.report.history[1] == (pytest.approx(r1b, rel=1e-9), pytest.approx(r2b, rel=1e-9))


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


@pytest.mark.parametrize("gamma,eta_max", [(0.5, 1.0), (0.9, 0.05), (0.0, None), (0.0, 1.0)])
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


def test_a_client_stepping_at_a_rate_of_exactly_one_moves_the_mean_field() -> None:
    """γ = 1 keeps every used rate at η_i(−1) = base_lr = 1: each client steps w − 1·(w − m_i) = m_i, so
    φ1(t) = Σθ_i m_i and φ2(t) = Σθ_i‖m_i‖² for t ≥ 1 (a rate of 1 is a step like any other, not a skipped one)."""
    means, w0, thetas = _problem(seed=2)
    res = solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(),
                            2, BETA, eps1=1e-12, eps2=1e-12, max_sweeps=10, phi2_rate="used", gamma=1.0,
                            base_lr=1.0)
    assert res.eta is not None and np.all(res.eta == 1.0)
    mean = (thetas[:, None] * means).sum(0)
    for t in (1, 2):
        np.testing.assert_allclose(res.phi1[t][0].numpy(), mean, rtol=1e-12, atol=1e-12)
        assert res.phi2[t] == pytest.approx(float((thetas * (means * means).sum(1)).sum()), rel=1e-12)
    np.testing.assert_array_equal(res.phi1[0][0].numpy(), w0)


@pytest.mark.parametrize("eps1,eps2", [(1.0, 1e-300), (1e-300, 1.0)])
def test_one_test_passing_is_not_convergence(eps1: float, eps2: float) -> None:
    """Algorithm 1 stops early only when both ε tests pass; with one of them unreachable it runs every sweep and
    reports which test held at the last one."""
    means, w0, thetas = _problem(seed=4)
    res = solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(),
                            3, BETA, eps1=eps1, eps2=eps2, max_sweeps=4)
    rep = res.report
    assert rep.sweeps == 4 and not rep.converged
    assert (rep.stop_reason, rep.stopped_by) == ("max_sweeps", "max_sweeps")
    assert (rep.phi1_converged, rep.phi2_converged) == (eps1 == 1.0, eps2 == 1.0)


def test_the_report_as_a_dict_and_the_default_tolerances() -> None:
    means, w0, thetas = _problem(seed=6)
    oracle = QuadraticOracle(means)
    res = solve_fixed_point(oracle, [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(), 2, BETA)
    rep = res.report
    assert (rep.eps1, rep.eps2) == (1e-3, 1e-3) and rep.converged
    assert rep.phi1_residual < 1e-3 and rep.phi2_residual < 1e-3 and rep.history[-1] == (rep.phi1_residual,
                                                                                           rep.phi2_residual)
    assert rep.to_dict() == {
        "sweeps": rep.sweeps, "stop_reason": "converged", "stopped_by": "eps1+eps2", "phi1_converged": True,
        "phi2_converged": True, "phi1_residual": rep.phi1_residual, "phi2_residual": rep.phi2_residual,
        "history": [list(h) for h in rep.history], "gradient_evaluations": oracle.calls, "guards": rep.guards,
        "eps1": 1e-3, "eps2": 1e-3,
    }
    assert rep.gradient_evaluations == rep.sweeps * 2 * len(thetas)


def test_bad_schedule_and_rate_reading_messages_are_exact() -> None:
    means, w0, thetas = _problem()
    ids, th = list(range(len(thetas))), thetas.tolist()
    with pytest.raises(ValueError) as e:
        solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], ids, th, 2, BETA, schedule=[[0], []])
    assert str(e.value) == "every round of the schedule needs at least one client"
    with pytest.raises(ValueError) as e:
        solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], ids, th, 2, BETA, schedule=[[0]])
    assert str(e.value) == "schedule names 1 rounds, need 2"
    with pytest.raises(ValueError) as e:
        solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], ids, th, 2, BETA, schedule=[[0], [9]])
    assert str(e.value) == "schedule names client 9 that is not among client_ids"
    with pytest.raises(ValueError) as e:
        solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], ids, th, 2, BETA, phi2_rate="x")
    assert str(e.value) == "phi2_rate must be 'used' or 'star', got 'x'"


def test_the_report_is_plain_data_a_checkpoint_stores() -> None:
    """The offline estimator's report is saved in the checkpoint's server state, which refuses numpy scalars
    (an offline FedEnt run failed at its first checkpoint on a numpy bool ``phi2_converged``)."""
    from fedent.checkpoint import _check_storable

    means, w0, thetas = _problem(seed=6)
    res = solve_fixed_point(QuadraticOracle(means), [torch.tensor(w0)], list(range(len(thetas))), thetas.tolist(),
                            3, BETA, eps1=1e-300, eps2=1e-300, max_sweeps=2)
    d = res.report.to_dict()
    assert type(d["phi1_converged"]) is bool and type(d["phi2_converged"]) is bool
    assert type(d["phi2_residual"]) is float and all(type(v) is float for h in d["history"] for v in h)
    _check_storable(d, "report")
