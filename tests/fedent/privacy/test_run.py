"""A run's privacy through the one round engine: the logged ε, the noise in the model, the budget stop."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dp_accounting
import pytest
import torch
from conftest import tiny_config, tiny_inputs
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

from fedent.config import ExecutorName, ExperimentConfig, PrivacyConfig
from fedent.privacy import accountant
from fedent.privacy.run import RunPrivacy, released_rounds
from fedent.runlog import read_json
from fedent.sim.simulator import SimResult, run_simulation
from fedent.strategies.base import AggregateResult, ClientUpdate
from fedent.strategies.fedavg import FedAvg


def _cfg(algorithm: str = "fedavg", rounds: int = 3, **privacy: Any) -> ExperimentConfig:
    cfg = tiny_config(algorithm, num_clients=10, rounds=rounds)  # fraction 0.5: 5 of 10 clients a round
    return dataclasses.replace(cfg, privacy=PrivacyConfig(**privacy))


def _run(cfg: ExperimentConfig, where: Path) -> SimResult:
    return run_simulation(cfg, where, progress=False, inputs=tiny_inputs(10), plots=False)


def _gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_a_central_runs_logged_epsilon_is_dp_accountings_for_the_same_event(tmp_path: Path) -> None:
    res = _run(_cfg(dp="central", noise_multiplier=1.2, clip_norm=0.5, delta=1e-4), tmp_path / "r")
    for k, rec in enumerate(res.records, start=1):
        acc = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_event.SelfComposedDpEvent(  # 5 of 10 without replacement; sum sensitivity 2C, noise 1.2C
            dp_event.SampledWithoutReplacementDpEvent(10, 5, dp_event.GaussianDpEvent(0.6)), k))
        p = rec["privacy"]
        assert p["epsilon"] == pytest.approx(acc.get_epsilon(1e-4), rel=1e-9)
        assert (p["delta"], p["accountant"], p["dp"], p["event"]["count"]) == (1e-4, "rdp", "central", k)
        assert p["clip_norm"] == 0.5 and p["noise_std"] == pytest.approx(0.6)


def test_without_noise_and_clipping_central_dp_is_fedavg_and_the_noise_visibly_moves_the_model(
        tmp_path: Path) -> None:
    plain = _run(_cfg(), tmp_path / "plain")
    assert all(r["privacy"] is None for r in plain.records)
    # equal client sizes: FedAvg's sample weights are uniform, so clip ∞ and z = 0 give FedAvg's model
    idle = _run(_cfg(dp="central", noise_multiplier=0.0, clip_norm=1e6), tmp_path / "idle")
    assert _gap(idle.params, plain.params) < 1e-6
    noisy = _run(_cfg(dp="central", noise_multiplier=1.0, clip_norm=1.0), tmp_path / "noisy")
    assert _gap(noisy.params, plain.params) > 0.05
    again = _run(_cfg(dp="central", noise_multiplier=1.0, clip_norm=1.0), tmp_path / "again")
    assert _gap(noisy.params, again.params) == 0.0  # seeded by (seed, round): reproducible


@pytest.mark.parametrize("algorithm", ["fedadam", "feddyn", "scaffold", "fedent"])
def test_every_strategy_aggregates_the_one_noised_release(tmp_path: Path, algorithm: str) -> None:
    """Extras included (FedDyn's Σλ, SCAFFOLD's Δc, FedAdam's moments): they see only the release, and the noise
    changes the result."""
    base = _run(_cfg(algorithm, rounds=2, dp="central", noise_multiplier=0.0, clip_norm=1e6), tmp_path / "a")
    noisy = _run(_cfg(algorithm, rounds=2, dp="central", noise_multiplier=1.0, clip_norm=1.0), tmp_path / "b")
    assert all(math.isfinite(float(p.abs().sum())) for p in noisy.params)
    assert _gap(base.params, noisy.params) > 1e-3
    assert noisy.records[-1]["privacy"]["epsilon"] > 0


def test_the_target_epsilon_stops_the_run_cleanly_before_it_is_passed(tmp_path: Path) -> None:
    one = accountant.central_report(10, 5, 1.0, 2, 1e-5)["epsilon"]  # the budget holds exactly two rounds
    res = _run(_cfg(rounds=6, dp="central", noise_multiplier=1.0, target_epsilon=one * 1.001), tmp_path / "r")
    assert [r["round"] for r in res.records] == [1, 2]
    assert res.records[-1]["privacy"]["epsilon"] <= one * 1.001
    assert res.records[-1]["test_acc"] is not None  # the last round within budget is evaluated
    status = read_json(tmp_path / "r" / "status.json")
    assert status["phase"] == "done" and status["round"] == 2
    assert "privacy budget: round 3 would take ε to" in status["state"]["stopped_early"]
    assert (tmp_path / "r" / "model_final.pt").is_file()


def test_a_local_runs_epsilon_is_the_worst_clients_and_dp_sgd_changes_the_model(tmp_path: Path) -> None:
    plain = _run(_cfg(), tmp_path / "plain")
    res = _run(_cfg(dp="local", noise_multiplier=1.0, clip_norm=0.5), tmp_path / "local")
    released = [r["clients"] for r in res.records]
    joined = {c: sum(c in cids for cids in released) for c in range(10)}
    want = accountant.local_report([12] * 10, joined, batch_size=4, epochs=1, noise_multiplier=1.0, delta=1e-5)
    assert res.records[-1]["privacy"]["epsilon"] == pytest.approx(want["epsilon"], rel=1e-12)
    assert res.records[-1]["privacy"]["client"] == max(joined, key=lambda c: (joined[c], -c))
    assert _gap(res.params, plain.params) > 0.05


def test_skipped_rounds_release_nothing_and_the_clip_norm_resumes_from_the_log() -> None:
    recs = [{"round": 0, "clients": [1, 2], "diagnostics": {}, "privacy": {"next_clip_norm": 0.7}},
            {"round": 1, "clients": [3, 4], "diagnostics": {"skipped": "1/2 updates accepted"}, "privacy": {}}]
    assert released_rounds(recs) == [[1, 2]]
    priv = RunPrivacy(_cfg(dp="central", adaptive_clip=True, clip_norm=2.0))
    assert priv.clip_norm(recs) == 0.7 and priv.clip_norm([]) == 2.0
    assert RunPrivacy(_cfg()).report([[1]], [12] * 10) is None


def test_adaptive_clipping_carries_each_rounds_norm_into_the_next(tmp_path: Path) -> None:
    res = _run(_cfg(dp="central", noise_multiplier=0.5, clip_norm=0.01, adaptive_clip=True, clip_learning_rate=0.5),
               tmp_path / "r")
    norms = [(r["privacy"]["clip_norm"], r["privacy"]["next_clip_norm"]) for r in res.records]
    assert norms[0][0] == 0.01
    assert all(nxt == pytest.approx(cur) for (_, nxt), (cur, _) in zip(norms, norms[1:], strict=False))
    assert norms[-1][1] > 0.01  # every update is far above 0.01: the norm grows toward the median


class _Median(FedAvg):
    """A robust rule's stand-in (coordinate-wise median of the uploads), to show where it sits under central DP."""

    def aggregate(self, rnd: int, global_params: Sequence[torch.Tensor],
                  updates: Sequence[ClientUpdate]) -> AggregateResult:
        return AggregateResult([torch.stack([u.params[i] for u in updates]).median(0).values
                                for i in range(len(global_params))])


def test_under_central_dp_a_robust_rule_sees_only_the_release_and_leaves_it_as_it_is(tmp_path: Path) -> None:
    cfg = _cfg(dp="central", noise_multiplier=1.0, clip_norm=0.5)
    mean = _run(cfg, tmp_path / "mean")
    median = run_simulation(cfg, tmp_path / "median", progress=False, inputs=tiny_inputs(10), plots=False,
                            strategy=_Median())
    assert _gap(mean.params, median.params) < 1e-6  # m copies of one release: the median is the release
    plain_median = run_simulation(_cfg(), tmp_path / "plain", progress=False, inputs=tiny_inputs(10), plots=False,
                                  strategy=_Median())
    assert _gap(plain_median.params, median.params) > 1e-2  # without DP the rule acts on the raw uploads


def test_central_dp_is_the_same_on_the_vectorised_executor(tmp_path: Path) -> None:
    """Central DP happens in the engine, after whichever executor trained the clients."""
    seq = _run(_cfg(dp="central", noise_multiplier=1.0, clip_norm=0.5), tmp_path / "seq")
    cfg = _cfg(dp="central", noise_multiplier=1.0, clip_norm=0.5)
    vec = _run(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, executor="vectorised")), tmp_path / "v")
    assert read_json(tmp_path / "v" / "status.json")["state"]["executor"] == "vectorised"
    assert _gap(seq.params, vec.params) < 1e-5


@pytest.mark.parametrize(("algorithm", "executor", "privacy"), [
    ("fedavg", "sequential", {"dp": "central", "noise_multiplier": 0.8, "clip_norm": 0.05, "adaptive_clip": True,
                              "clip_learning_rate": 0.5}),
    ("feddyn", "vectorised", {"dp": "local", "noise_multiplier": 1.0, "clip_norm": 0.5}),
], ids=["central-adaptive", "local-vectorised"])
def test_a_run_stopped_after_k_rounds_and_resumed_gives_the_uninterrupted_model_and_epsilon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str, executor: ExecutorName,
        privacy: dict[str, Any]) -> None:
    """Stopped (as SIGTERM stops it) right after round 2's checkpoint of 4, then resumed: the accountant's ledger
    (the released rounds and who joined them), central DP's adaptive clip norm and (local DP, FedDyn) the clients'
    λ all come back, so the final model, every round's ε and the clip norms are the uninterrupted run's."""
    from fedent.rounds import RoundPolicy, resume

    cfg = _cfg(algorithm, rounds=4, **privacy)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, executor=executor))
    policy = RoundPolicy(checkpoint_keep=2)

    def sim(where: Path, **kw: Any) -> SimResult:
        return run_simulation(cfg, where, progress=False, inputs=tiny_inputs(10), plots=False, policy=policy, **kw)

    whole = sim(tmp_path / "whole")
    save = resume.save

    def save_then_stop(run: Any, rnd: int, keep: int = 3) -> None:
        save(run, rnd, keep)
        if rnd == 1:
            raise KeyboardInterrupt("stopped by SIGTERM")

    monkeypatch.setattr(resume, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        sim(tmp_path / "cut")
    monkeypatch.undo()
    assert read_json(tmp_path / "cut" / "status.json")["phase"] == "stopped"
    resumed = sim(tmp_path / "cut", resume=True)
    assert [r["round"] for r in resumed.records] == [1, 2, 3, 4]
    assert _gap(resumed.params, whole.params) < 1e-5
    eps = [r["privacy"]["epsilon"] for r in whole.records]
    assert [r["privacy"]["epsilon"] for r in resumed.records] == pytest.approx(eps, rel=1e-12)
    assert eps == sorted(eps) and eps[3] > eps[0]  # the ledger grew (local: the worst client's ε, non-decreasing)
    if privacy["dp"] == "central":
        norms = [r["privacy"]["clip_norm"] for r in whole.records]
        assert [r["privacy"]["clip_norm"] for r in resumed.records] == pytest.approx(norms, rel=1e-12)
        assert norms[3] > norms[0]  # the clip norm moved: a resume from the configured one would differ


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x.double() - y.double()).norm() ** 2) for x, y in zip(a, b, strict=True)) ** 0.5
    return num / sum(float(y.double().norm() ** 2) for y in b) ** 0.5


@pytest.mark.parametrize("executor", ["sequential", "vectorised"])
def test_local_dp_under_secure_aggregation_gives_the_local_dp_model_and_logs_epsilon(
        tmp_path: Path, executor: ExecutorName) -> None:
    """The simulator with local DP and SecAgg+: the clients' noised models are masked in the ring and only the sum
    is unmasked, so the model is local DP's without it within the fixed-point resolution (2^-24), and the ε is the
    same (secure aggregation neither adds nor spends privacy budget)."""
    def cfg(secure: bool, dp: str = "local") -> ExperimentConfig:
        c = _cfg(rounds=2, dp=dp, noise_multiplier=1.0, clip_norm=0.5, secure_aggregation=secure)
        return dataclasses.replace(c, train=dataclasses.replace(c.train, executor=executor))

    local = _run(cfg(False), tmp_path / "local")
    secure = _run(cfg(True), tmp_path / "secure")
    err = _rel(secure.params, local.params)
    assert 0 < err <= 1e-4  # > 0: the fixed-point masked path really ran
    for a, b in zip(secure.records, local.records, strict=True):
        assert a["privacy"]["epsilon"] == pytest.approx(b["privacy"]["epsilon"], rel=1e-12)
        assert a["privacy"]["dp"] == "local" and a["privacy"]["epsilon"] > 0
    plain_secure = _run(cfg(True, dp="none"), tmp_path / "plain")
    assert _rel(secure.params, plain_secure.params) > 1e-2  # the clients' DP-SGD noise is in the secure sum


def test_robust_aggregation_under_dp_central_leaves_the_release_and_local_is_post_processing(tmp_path: Path) -> None:
    """``robust.aggregator: median`` (the real rule, fedent.rounds.robust) under each mode. Central: it runs on m
    copies of the one release, so the model is the mean's and ε unchanged. Local: every upload is already a DP
    release, so the median acts on the noised uploads (a different model) at the same ε."""
    from fedent.config import RobustConfig

    def cfg(dp: str, aggregator: str) -> ExperimentConfig:
        c = _cfg(rounds=2, dp=dp, noise_multiplier=1.0, clip_norm=0.5)
        return dataclasses.replace(c, robust=RobustConfig(aggregator=aggregator))  # type: ignore[arg-type]

    for dp, same in (("central", True), ("local", False)):
        mean, median = _run(cfg(dp, "mean"), tmp_path / f"{dp}-mean"), _run(cfg(dp, "median"), tmp_path / f"{dp}-med")
        assert (_gap(mean.params, median.params) < 1e-6) is same, dp
        assert median.records[-1]["privacy"]["epsilon"] == pytest.approx(mean.records[-1]["privacy"]["epsilon"],
                                                                         rel=1e-12)
        assert median.records[-1]["privacy"]["epsilon"] > 0
