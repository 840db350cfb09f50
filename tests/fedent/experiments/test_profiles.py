"""The paper's protocol as data: each profile's settings and rows are Table IV's and the paper's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.config import ConfigError
from fedent.experiments.plan import build_plan
from fedent.experiments.profiles import get_profile

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_rows_share_everything_but_the_algorithm_and_use_paper_options(tmp_path: Path) -> None:
    plan = build_plan(get_profile("cpu"), [3], tmp_path, CONFIGS, only=["main"])
    runs = [s for s in plan.runs if s.setting == "dir0.5"]
    base = {k: v for k, v in runs[0].config.items() if k not in ("algorithm", "name")}
    for s in runs:
        assert {k: v for k, v in s.config.items() if k not in ("algorithm", "name")} == base
        assert s.config["train"]["seed"] == 3
        opts = {k: v for k, v in s.config["algorithm"].items() if k != "name"}
        if s.config["algorithm"]["name"] != "fedent":
            assert opts == {}  # the strategies' defaults are the paper's values: nothing tuned per algorithm
            assert s.config["train"]["lr"] == 0.01
        else:
            assert set(opts) <= {"variant", "estimator", "max_sweeps"}
    assert base["data"]["alpha"] == 0.5 and base["data"]["partition"] == "dirichlet"
    assert base["train"]["lr"] == 0.01 and base["train"]["batch_size"] == 32 and base["train"]["local_epochs"] == 3


def test_controls_sweep_the_rate_replay_fedent_and_keep_the_first_readings(tmp_path: Path) -> None:
    plan = build_plan(get_profile("cpu"), [0], tmp_path, CONFIGS, only=["controls"])
    by = {s.row: s for s in plan.runs}
    base_lr = by["fedavg"].config["train"]["lr"]
    for k in (2, 5, 10):
        assert by[f"fedavg-lr{k}"].config["train"]["lr"] == pytest.approx(k * base_lr)
        assert by[f"fedavg-lr{k}"].config["algorithm"] == {"name": "fedavg"}
    order = [s.key for s in plan.runs]
    for row, mode in (("fedavg-replay", "per_client"), ("fedavg-replay-mean", "round_mean")):
        spec = by[row]
        assert spec.after == (by["fedent"].key,) and order.index(by["fedent"].key) < order.index(spec.key)
        assert spec.config["algorithm"]["replay_rates"] == str(by["fedent"].run_dir / "metrics.jsonl")
        assert spec.config["algorithm"]["replay"] == mode
    assert by["fedent"].config["algorithm"] == {"name": "fedent"}  # the revised readings are the defaults
    first = by["fedent-first"].config["algorithm"]
    assert first["eta_max"] is None and first["phi2_rate"] == "star"
    off = by["fedent-offline-first"].config["algorithm"]
    assert off["offline_clients"] == "population" and off["estimator"] == "offline"


def test_medium_profile_is_the_full_data_controls_on_one_setting(tmp_path: Path) -> None:
    plan = build_plan(get_profile("medium"), [0], tmp_path, CONFIGS)
    cfg = plan.runs[0].config
    assert cfg["data"]["max_train_samples"] is None and cfg["data"]["num_clients"] == 100
    assert {s.row for s in plan.runs} >= {"fedavg", "fedavg-lr10", "fedent", "fedent-first", "fedavg-replay-mean"}


def test_paper_profile_keeps_table_iv(tmp_path: Path) -> None:
    plan = build_plan(get_profile("paper"), [0], tmp_path, CONFIGS, only=["main"])
    cfg = {s.setting: s.config for s in plan.runs}
    assert cfg["pathological"]["train"]["rounds"] == 50 and cfg["pathological"]["data"]["max_train_samples"] is None
    assert cfg["dir1.0"]["train"]["lr"] == 0.1 and cfg["dir1.0"]["train"]["rounds"] == 100
    assert cfg["cifar100-dir0.5"]["train"]["rounds"] == 110
    with pytest.raises(ConfigError, match="--only"):
        build_plan(get_profile("paper"), [0], tmp_path, CONFIGS, only=["nope"])


def test_robust_profile_learns_clean_and_crosses_every_attack_with_the_coordinate_wise_defences(tmp_path: Path) -> None:
    """The setting the clean runs learn in (120 images a client, 8 local steps a round at lr 0.1: the first
    version's 3 steps at lr 0.01 never left chance); every attack x {mean, median, trimmed-mean}, the other
    defences clean and under scale; FedAvg and FedEnt on identical configs otherwise."""
    plan = build_plan(get_profile("robust"), [0], tmp_path, CONFIGS)
    assert {s.row for s in plan.runs} == {"fedavg", "fedent"} and len(plan.runs) == 54
    by = {(s.setting, s.row): s.config for s in plan.runs}
    clean = by[("none-mean", "fedavg")]
    assert clean["data"]["partition"] == "dirichlet" and clean["data"]["alpha"] == 1.0
    assert clean["data"]["num_clients"] == 100 and clean["data"]["max_train_samples"] == 12000
    assert (clean["train"]["lr"], clean["train"]["local_epochs"], clean["train"]["batch_size"],
            clean["train"]["rounds"], clean["train"]["fraction"]) == (0.1, 2, 32, 10, 0.2)
    assert clean["model"]["name"] == "lenet5" and clean["adversary"]["attack"] == "none"
    for attack in ("sign-flip", "scale", "gaussian", "label-flip", "alie", "inflate-count"):
        for defence in ("mean", "median", "trimmed-mean"):
            cfg = by[(f"{attack}-{defence}", "fedent")]
            assert (cfg["adversary"]["attack"], cfg["robust"]["aggregator"]) == (attack, defence)
            assert cfg["adversary"]["fraction"] == 0.2 and cfg["robust"]["max_weight_share"] == 0.25
    assert by[("scale-clip", "fedavg")]["robust"]["clip_norm"] == 1.0
    assert by[("none-krum", "fedavg")]["robust"]["aggregator"] == "krum"
    assert ("gaussian-krum", "fedavg") not in by
    rest = {k: v for k, v in by[("scale-median", "fedent")].items() if k not in ("adversary", "robust", "algorithm",
                                                                                    "name")}
    assert rest == {k: v for k, v in clean.items() if k not in ("adversary", "robust", "algorithm", "name")}


def test_issue_29_rate_controls_vary_one_thing_each() -> None:
    from fedent.experiments.profiles import RATE_CONTROL_ROWS, get_profile

    prof = get_profile("full")
    base = prof.row("fedent")
    assert set(RATE_CONTROL_ROWS) <= set(prof.section("main").rows)
    changed = {r: prof.row(r).options_dict() for r in RATE_CONTROL_ROWS}
    assert changed == {"fedent-shuffled": {"rates": "shuffled"}, "fedent-fixed": {"rates": "fixed"},
                       "fedent-cap-none": {"eta_max": None}, "fedent-cap2": {"eta_max": 2.0}}
    assert base.options_dict() == {} and all(prof.row(r).lr_scale == 1.0 for r in RATE_CONTROL_ROWS)


def test_the_emnist_twins_tuned_fedent_row_runs_at_twice_the_base_rate_on_that_twin_only(tmp_path: Path) -> None:
    """docs/full-cpu/tuning.md: on the EMNIST-L twin FedAvg's and FedEnt's searches both chose 0.2 = 2 × Table IV's
    0.1. FedEnt's row at that base rate (β, γ as the search held them) is planned on that setting and no other, and
    FedAvg's is the rate sweep's fedavg-lr2, on the same partition."""
    plan = build_plan(get_profile("full"), [0], tmp_path, CONFIGS, rows=["fedent-lr2", "fedavg-lr2", "fedent"])
    where = {s.setting for s in plan.runs if s.row == "fedent-lr2"}
    assert where == {"emnist-dir1.0"}
    by = {s.key: s.config for s in plan.runs}
    tuned, paper, avg = (by[f"emnist-dir1.0/{r}-s0"] for r in ("fedent-lr2", "fedent", "fedavg-lr2"))
    assert tuned["train"]["lr"] == 0.2 == avg["train"]["lr"] and paper["train"]["lr"] == 0.1
    assert tuned["algorithm"] == paper["algorithm"] and tuned["algorithm"]["name"] == "fedent"
    assert {k: v for k, v in tuned["train"].items() if k != "lr"} == {k: v for k, v in paper["train"].items()
                                                                        if k != "lr"}
    assert tuned["data"] == paper["data"] == avg["data"]
