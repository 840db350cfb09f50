"""The mechanism report (fedent.experiments.mechanism): the sign rule, the cap share, the ramp, the scale response."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedent.experiments.mechanism import main, phi2_scores, phi2_table, scale_response, solve_stats, wilson
from fedent.meanfield.decay import decayed_rates
from fedent.meanfield.lr import solve_eta
from fedent.meanfield.scalar_fixed_point import solve_online


def _round(seed: int, n: int = 20, gamma: float = 0.99, eta_max: float | None = None, prev: float = 0.01,
           w_scale: float = 3.0, g_scale: float = 0.5) -> dict:
    """A logged FedEnt round built as the strategy builds it (online, star rate)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=50) * w_scale / math.sqrt(50)
    g = rng.normal(size=(n, 50)) * g_scale / math.sqrt(50)
    th = rng.dirichlet(np.ones(n) * 5)
    c, a, b = float(w @ w), g @ w, (g * g).sum(1)
    sol = solve_online(c, th, a, b, 0.99, eta_max=eta_max)
    eta = decayed_rates(np.full(n, prev), sol.eta_star, gamma)
    clients = [{"client": i, "theta": th[i], "a": a[i], "b": b[i], "c": c, "phi2_next": sol.phi2_next, "beta": 0.99,
                "gamma": gamma, "variant": "exact", "eta_max": eta_max, "eta_prev": prev, "phi2_rate": "star",
                "eta_star": float(sol.eta_star[i]), "eta": float(eta[i])} for i in range(n)]
    return {"round": 0, "fedent": {"phi2_pred": sol.phi2_next, "phi2_actual": sol.phi2_next, "clients": clients}}


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.integers(5, 40))
def test_sign_rule_eta_star_positive_iff_a_negative(seed: int, n: int) -> None:
    """With p_i(0) < 1/e (any round of several similar clients), η*_i > 0 exactly where ⟨w, g_i⟩ < 0."""
    st_ = solve_stats([[_round(seed, n)]])
    assert st_ is not None and st_["sign_rule_cases"] > 0
    assert st_["sign_rule_holds"] == 1.0
    if st_["sign_rule_cases"] == 1.0:  # every client has p(0) < 1/e: the zeros are exactly the a ≥ 0
        assert st_["zero"] == pytest.approx(1 - st_["a_negative"], abs=1e-12)


def test_loss_scale_moves_eta_star_against_a_learning_rate() -> None:
    """Loss × s: a rate should go as 1/s; η* instead grows (∝ s in the linear regime, Eq. (eta_solve_t_1) with
    K → s²K after η = η̃/s). Weights × s: a rate should go as s²; η* shrinks."""
    rows = {r["s"]: r for r in scale_response(_round(3, w_scale=30.0, g_scale=0.05))}
    assert rows[1.0]["loss_ratio"] == pytest.approx(1.0) and rows[1.0]["weights_ratio"] == pytest.approx(1.0)
    for s in (2.0, 10.0):
        assert rows[s]["loss_ratio"] > 1.0 > rows[s]["loss_ideal"]
        assert rows[s]["weights_ratio"] < 1.0 < rows[s]["weights_ideal"]
    assert rows[2.0]["loss_ratio"] == pytest.approx(2.0, rel=0.05)  # linear regime: η* ∝ s
    assert rows[2.0]["weights_ratio"] == pytest.approx(0.25, rel=0.05)  # η* ∝ 1/s²


def test_cap_share_and_ramp_are_counted() -> None:
    rec = _round(1, eta_max=1e-3, g_scale=5.0)
    st_ = solve_stats([[rec]])
    assert st_ is not None
    cl = rec["fedent"]["clients"]
    capped = sum(1 for c in cl if c["eta_star"] == 1e-3)
    assert capped > 0 and st_["at_bound"] == pytest.approx(capped / len(cl))
    assert st_["rate_first"] == pytest.approx(sum(c["theta"] * c["eta"] for c in cl))
    assert st_["rate_peak"] == max(c["eta"] for c in cl)
    assert st_["base_lr"] == 0.01


def test_phi2_error_at_the_used_rate_is_recomputed_from_the_log() -> None:
    """The logged prediction (star) against the actual Σθ‖w_i‖² at the used rates, and the prediction re-solved
    at the used rate (exact here, so its error is 0)."""
    rec = _round(2, gamma=0.5)
    cl = rec["fedent"]["clients"]
    c = cl[0]["c"]
    used = np.array([x["eta"] for x in cl])
    a, b, th = (np.array([x[k] for x in cl]) for k in ("a", "b", "theta"))
    prev = np.full(len(cl), 0.01)
    at_used = solve_online(c, th, a, b, 0.99, eta_prev=prev, gamma=0.5)
    rec["fedent"]["phi2_actual"] = at_used.phi2_next  # what training at the used rates would give
    st_ = solve_stats([[rec]])
    assert st_ is not None and st_["phi2_err_at_used"] == pytest.approx(0.0, abs=1e-9)
    assert st_["phi2_err_logged"] > 0.0
    assert solve_eta(a, b, c, th, at_used.phi2_next, 0.99).eta_star.shape == used.shape


def _scored(pred: float, actual: float, c: float, estimator: str | None = "online") -> dict:
    """A logged round with φ2' = ``pred``, the actual Σθ‖w_i‖² = ``actual`` and ‖w(t)‖² = ``c``, its φ2' made by
    ``estimator`` (the round's ``estimate.mode``; None: not logged)."""
    rec = _round(1, n=5)
    for cl in rec["fedent"]["clients"]:
        cl["c"] = c
    rec["fedent"].update(phi2_pred=pred, phi2_actual=actual)
    if estimator is not None:
        rec["fedent"]["estimate"] = {"mode": estimator, "round": 0}
    return rec


def test_phi2_scored_against_the_naive_guess_and_on_the_sign_of_the_change() -> None:
    # c = 10 each round; (prediction, actual): closer, right sign / farther, wrong sign (a wrong sign is always
    # farther) / farther, right sign / no actual change
    recs = [_scored(12.0, 13.0, 10.0), _scored(10.5, 9.9, 10.0), _scored(20.0, 11.0, 10.0), _scored(9.0, 10.0, 10.0)]
    by = phi2_scores([recs])
    assert by is not None and list(by) == ["online"]
    sc = by["online"]
    assert sc["rounds"] == 4 and sc["estimator"] == "online"
    logged = sc["logged"]
    assert logged["n"] == 4
    assert logged["closer"] == pytest.approx(1 / 4)  # round 1 only (round 4: |9 − 10| = 1 > |10 − 10| = 0)
    assert logged["sign_n"] == 3 and logged["sign"] == pytest.approx(2 / 3)  # round 4: no actual change
    assert logged["err"] == pytest.approx(np.median([1 / 13, 0.6 / 9.9, 9 / 11, 0.1]))
    assert sc["naive_err"] == pytest.approx(np.median([3 / 13, 0.1 / 9.9, 1 / 11, 0.0]))
    assert logged["sign_ci"] == wilson(2, 3) and sc["used"]["n"] == 4  # the round logs what a re-solve needs
    lines = phi2_table({"run": by})
    assert len(lines) == 4 and "| run | online | as logged | 4 |" in lines[2] and "67% [" in lines[2]
    assert "| run | online | online, re-solved at the used rate | 4 |" in lines[3]
    assert phi2_scores([[{"round": 1, "fedent": None}]]) is None


# An offline run (Algorithm 1's trajectory, fixed before training) while the model drifts upwards: ‖w(t)‖² = c
# moves every round and the trajectory lags it. (prediction, actual, c), scored by hand against c of the SAME
# round: a guess taken from the previous round's actual, or a sign taken along the trajectory (φ2'(t+1) − φ2'(t))
# or against the actual, gives other numbers.
OFFLINE = [(100.5, 101.0, 100.0),  # closer (0.5 < 1); up, up: right
           (100.8, 102.0, 101.2),  # farther (1.2 > 0.8); predicted down (100.8 < 101.2), went up: wrong
           (101.0, 102.0, 102.5),  # farther (1.0 > 0.5); down, down: right
           (103.0, 104.0, 103.0)]  # a tie (1 = 1) is not closer; no predicted change: not in the sign count


def test_offline_rounds_are_scored_by_the_same_rules_in_their_own_entry() -> None:
    online = [_scored(12.0, 13.0, 10.0), _scored(10.5, 9.9, 10.0)]
    offline = [_scored(p, a, c, "offline") for p, a, c in OFFLINE]
    by = phi2_scores([online, offline + [_scored(12.0, 13.0, 10.0, None)]])
    assert by is not None and list(by) == ["online", "offline", "not logged"]
    assert (by["online"]["rounds"], by["offline"]["rounds"], by["not logged"]["rounds"]) == (2, 4, 1)
    off = by["offline"]
    assert off["estimator"] == "offline"
    assert off["naive_err"] == pytest.approx(np.median([1 / 101, 0.8 / 102, 0.5 / 102, 1 / 104]))
    logged = off["logged"]
    assert logged["err"] == pytest.approx(np.median([0.5 / 101, 1.2 / 102, 1.0 / 102, 1 / 104]))
    assert logged["n"] == 4 and logged["closer"] == pytest.approx(1 / 4) and logged["closer_ci"] == wilson(1, 4)
    assert logged["sign_n"] == 3 and logged["sign"] == pytest.approx(2 / 3) and logged["sign_ci"] == wilson(2, 3)
    # the online rounds alone: round 1 closer and right, round 2 farther and wrong
    on = by["online"]["logged"]
    assert (on["closer"], on["sign_n"], on["sign"]) == (0.5, 2, 0.5)
    assert by["online"]["naive_err"] == pytest.approx(np.median([3 / 13, 0.1 / 9.9]))
    lines = phi2_table({"run": by})
    assert "| run | offline | as logged | 4 | " in lines[4] and lines[4].endswith(
        f"| 25% [{wilson(1, 4)[0]:.0%}, {wilson(1, 4)[1]:.0%}] | 67% [{wilson(2, 3)[0]:.0%}, "  # type: ignore[index]
        f"{wilson(2, 3)[1]:.0%}] (3) |")  # type: ignore[index]
    assert "| run | offline | online, re-solved at the used rate | 4 |" in lines[5]


def test_a_tiny_offline_runs_log_is_scored(tmp_path: Path) -> None:
    """A real FedEnt run with Algorithm 1's estimator: each round logs its φ2(t+1), the actual value and
    ``estimate.mode: offline`` (and checkpoints), and phi2_scores scores every round from metrics.jsonl; the
    logged prediction is the trajectory of estimator.json (φ2(1..T)) and c is each round's ‖w(t)‖²
    (φ2(0) = ‖w(0)‖²)."""
    import json

    from conftest import tiny_inputs

    from fedent import runlog
    from fedent.config import config_from_dict
    from fedent.rounds.engine import RoundPolicy
    from fedent.sim.simulator import run_simulation

    rounds = 3
    cfg = config_from_dict({
        "name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
        "train": {"rounds": rounds, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "seed": 1,
                  "device": "cpu"},
        "algorithm": {"name": "fedent", "estimator": "offline", "max_sweeps": 2}})
    # checkpointing as `fedent simulate` does: the offline estimator's report is in every checkpoint
    run_simulation(cfg, tmp_path / "run", progress=False, inputs=tiny_inputs(), plots=False,
                   policy=RoundPolicy(checkpoint_keep=1))
    recs = runlog.read_metrics(runlog.RunPaths(tmp_path / "run").metrics)
    fed = [r["fedent"] for r in recs if r.get("fedent")]
    assert len(fed) == rounds and all(f["estimate"]["mode"] == "offline" for f in fed)
    traj = json.loads((tmp_path / "run" / "estimator.json").read_text())["report"]["phi2"]
    assert [f["phi2_pred"] for f in fed] == traj[1:]
    assert fed[0]["clients"][0]["c"] == pytest.approx(traj[0], rel=1e-9)
    by = phi2_scores([recs])
    assert by is not None and list(by) == ["offline"]
    sc = by["offline"]
    assert sc["rounds"] == rounds and sc["logged"]["n"] == rounds and sc["used"]["n"] == rounds
    cs = [f["clients"][0]["c"] for f in fed]
    acts = [f["phi2_actual"] for f in fed]
    assert sc["naive_err"] == pytest.approx(np.median([abs(c - a) / a for c, a in zip(cs, acts, strict=True)]))
    closer = sum(abs(p - a) < abs(c - a) for p, c, a in zip(traj[1:], cs, acts, strict=True))
    assert sc["logged"]["closer"] == pytest.approx(closer / rounds)
    moved = [(p, c, a) for p, c, a in zip(traj[1:], cs, acts, strict=True) if a != c and p != c]
    assert sc["logged"]["sign_n"] == len(moved) > 0
    assert sc["logged"]["sign"] == pytest.approx(sum((p > c) == (a > c) for p, c, a in moved) / len(moved))


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson(8, 10)  # type: ignore[misc]
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson(0, 0) is None and wilson(0, 5)[0] == 0.0  # type: ignore[index]


def test_main_prints_the_phi2_table(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [_scored(12.0, 13.0, 10.0)]) + "\n")
    assert main([str(tmp_path), "--phi2"]) == 0
    out = capsys.readouterr().out
    assert "‖w(t)‖² guess" in out and "| online | as logged | 1 |" in out
    for seed, rec in ((0, _scored(12.0, 13.0, 10.0)), (1, _scored(20.0, 11.0, 10.0))):
        (tmp_path / f"arm-s{seed}").mkdir()
        (tmp_path / f"arm-s{seed}" / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    assert main([str(tmp_path / "arm-s0"), str(tmp_path / "arm-s1"), "--phi2", "--pool"]) == 0
    out = capsys.readouterr().out
    assert "| arm (pooled) | online | as logged | 2 |" in out and "| arm (pooled) | 10 |" in out
