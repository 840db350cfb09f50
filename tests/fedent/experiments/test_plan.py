"""A profile's plan: every run once, in the order that leaves whole tables, sized and trimmed to a budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.config import ConfigError
from fedent.experiments.plan import build_plan, client_steps, drop_order, effective_overrides, trim_plan
from fedent.experiments.profiles import get_profile

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SEVEN = {"fedavg", "fedadam", "fedprox", "feddyn", "fedcos", "fednorm", "fedent"}


def test_cpu_plan_has_every_paper_run_once_in_seed_order(tmp_path: Path) -> None:
    plan = build_plan(get_profile("cpu"), [0, 1], tmp_path, CONFIGS)
    keys = [s.key for s in plan.runs]
    assert len(keys) == len(set(keys))
    assert len({s.run_dir for s in plan.runs}) == len(keys)
    # order: seed 0 of the cheap analyses, the main table's seed 1, participation's seed 0, then the rest
    part = {"full100", "p20of200"}
    first_part = next(i for i, s in enumerate(plan.runs) if s.setting in part)
    assert all(s.seed == 0 or s.setting in ("pathological", "dir1.0", "dir0.5") for s in plan.runs[:first_part])
    assert {s.seed for s in plan.runs[:first_part]} == {0, 1}
    assert all(s.setting in part and s.seed == 0 for s in plan.runs[first_part:first_part + 10])
    # then (no third main seed here) the extra scale check's first seed, then the analyses' second seed
    assert all(s.setting == "pathological-x4" and s.seed == 0 for s in plan.runs[first_part + 10:first_part + 18])
    # then the controls' first seed (issue 17; the rows not already run by the main table), then the second seeds
    first = [s for s in plan.runs[first_part + 18:] if s.seed == 0]
    ctrl = [s for s in first if s.setting == "pathological"]
    assert {s.row for s in ctrl} == {"fedavg-lr2", "fedavg-lr5", "fedavg-lr10", "fedavg-replay",
                                     "fedavg-replay-mean", "fedent-first", "fedent-offline-first"}
    # then the privacy table's first seed (issue 26: FedAvg and FedEnt at each noise level; no DP is the main run)
    assert first == ctrl + [s for s in first if s.setting.startswith("dp-")]
    assert {(s.setting, s.row) for s in first[len(ctrl):]} == {
        (k, r) for k in ("dp-central-z0.3", "dp-central-z1", "dp-local-z1") for r in ("fedavg", "fedent")}
    assert all(s.seed == 1 for s in plan.runs[first_part + 18 + len(first):])
    by = {(s.setting, s.row, s.seed): s for s in plan.runs}
    for setting in ("pathological", "dir1.0", "dir0.5"):
        rows = {r for (st, r, sd) in by if st == setting and sd == 0}
        assert SEVEN | {"fedent-paper"} <= rows
        # Algorithm 1 (offline) rows cost ~3 runs each on a CPU: the cpu profile has them on pathological only
        assert ({"fedent-offline", "fedent-offline-paper"} <= rows) == (setting == "pathological")
    # the sweep's β = γ = 0.99 point is the Table III FedEnt run, not a second run
    assert ("pathological", "fedent-beta0.99", 0) not in by
    assert {r for (st, r, sd) in by if r.startswith("fedent-beta")} == {"fedent-beta0.5", "fedent-beta0.9",
                                                                         "fedent-beta0.95"}
    assert by[("full100", "fedavg", 0)].config["train"]["fraction"] == 1.0
    assert by[("p20of200", "fedavg", 0)].config["data"]["num_clients"] == 200
    assert by[("iid", "fedcos", 1)].config["data"]["partition"] == "iid"


def test_full_profile_sizes_and_drops_in_the_documented_order(tmp_path: Path) -> None:
    plan = build_plan(get_profile("full"), [0, 1, 2], tmp_path, CONFIGS)
    rows = {s.row for s in plan.runs}
    assert SEVEN | {"fedavg-lr10", "fedavg-replay", "fedavg-replay-mean", "fedent-first"} <= rows
    assert {s.setting for s in plan.runs} == {"pathological", "dir1.0", "dir0.5", "emnist-dir1.0", "emnist-dir0.5",
                                              "cifar100-dir1.0", "cifar100-dir0.5"}
    path = next(s for s in plan.runs if s.key == "pathological/fedavg-s0")
    # Table IV's MNIST row: 50 rounds x 20 clients x 3 epochs x ceil(600/32) = 19 batches
    assert client_steps(path.config) == 50 * 20 * 3 * 19
    units = drop_order(plan)
    assert units[0][1] == 2 and all(sd == 2 for _, sd in units[:7])  # the third seed goes first
    assert ("pathological", 0) not in units
    total = sum(client_steps(s.config) for s in plan.runs)
    kept, dropped = trim_plan(plan, total // 3)
    assert dropped == units[: len(dropped)] and sum(client_steps(s.config) for s in kept.runs) <= total // 3
    assert all((s.setting, s.seed) not in dropped for s in kept.runs)
    same, none = trim_plan(plan, total)
    assert none == [] and same.runs == plan.runs


def test_rows_filter_keeps_a_replays_source_and_rounds_override(tmp_path: Path) -> None:
    plan = build_plan(get_profile("cpu"), [0], tmp_path, CONFIGS, only=["controls"],
                      rows=["fedavg", "fedavg-replay-mean"], rounds=2)
    assert [s.row for s in plan.runs] == ["fedavg", "fedent", "fedavg-replay-mean"] or \
        {s.row for s in plan.runs} == {"fedavg", "fedent", "fedavg-replay-mean"}
    assert all(s.rounds == 2 for s in plan.runs)
    order = [s.row for s in plan.runs]
    assert order.index("fedent") < order.index("fedavg-replay-mean")
    with pytest.raises(ConfigError, match="unknown row"):
        build_plan(get_profile("cpu"), [0], tmp_path, CONFIGS, only=["controls"], rows=["nope"])
    with pytest.raises(ConfigError, match="--rows"):
        build_plan(get_profile("cpu"), [0], tmp_path, CONFIGS, only=["beta"], rows=["fedavg"])


def test_settings_filter_keeps_only_the_chosen_settings_of_every_section(tmp_path: Path) -> None:
    everywhere = build_plan(get_profile("cpu"), [0], tmp_path, CONFIGS, only=["main", "controls"], rows=["fedavg"])
    assert {s.setting for s in everywhere.runs} == {"pathological", "dir1.0", "dir0.5"}
    plan = build_plan(get_profile("cpu"), [0, 1], tmp_path, CONFIGS, only=["main", "controls"], rows=["fedavg"],
                      settings=["dir1.0"])
    assert [(s.setting, s.row, s.seed) for s in plan.runs] == [("dir1.0", "fedavg", 0), ("dir1.0", "fedavg", 1)]
    assert all(sec.settings == ("dir1.0",) for sec in plan.sections) and plan.sections
    with pytest.raises(ConfigError, match="unknown setting"):
        build_plan(get_profile("cpu"), [0], tmp_path, CONFIGS, only=["controls"], settings=["nope"])
    with pytest.raises(ConfigError, match="--settings"):
        build_plan(get_profile("cpu"), [0], tmp_path, CONFIGS, only=["controls"], settings=["dir1.0"])


def test_set_overrides_every_setting_but_never_the_rows(tmp_path: Path) -> None:
    plan = build_plan(get_profile("full"), [0], tmp_path, CONFIGS, only=["main"], rows=["fedavg"],
                      overrides=["train.conv=unfold", "train.max_parallel_clients=7"])
    assert len(plan.runs) == 7
    assert all(s.config["train"]["conv"] == "unfold" and s.config["train"]["max_parallel_clients"] == 7
               for s in plan.runs)
    assert all(s.config["train"]["precision"] == "tf32" for s in plan.runs)  # the full profile's own choice
    for bad, why in (("algorithm.name=fedavg", "rows set the algorithm"), ("train.seed=3", "seeds the seed"),
                     ("train.conv=fft", "train.conv: must be one of direct, unfold, looped")):
        with pytest.raises(ConfigError, match=why):
            build_plan(get_profile("full"), [0], tmp_path, CONFIGS, only=["main"], overrides=[bad])


def test_the_plan_keeps_its_set_overrides_and_a_later_value_of_a_key_replaces_the_earlier_in_place(
        tmp_path: Path) -> None:
    """What the report names as a setting's overrides: its own, then --set's, each key once with its last value."""
    plan = build_plan(get_profile("full"), [0, 1], tmp_path, CONFIGS, only=["main"], rows=["fedavg"],
                      settings=["pathological"], overrides=["train.local_eval=0", "train.conv=unfold"])
    assert plan.overrides == ("train.local_eval=0", "train.conv=unfold")
    assert all(s.config["train"]["local_eval"] == 0 for s in plan.runs)  # the profile's own value is 5
    setting = get_profile("full").setting("pathological")
    assert "train.local_eval=5" in setting.overrides
    assert effective_overrides(setting.overrides, plan.overrides) == [
        o.replace("local_eval=5", "local_eval=0") for o in setting.overrides] + ["train.conv=unfold"]
    trimmed, dropped = trim_plan(plan, int(1.5 * client_steps(plan.runs[0].config)))
    assert dropped and trimmed.overrides == plan.overrides


def test_mnist_profile_is_the_papers_data_and_model_with_the_rate_controls(tmp_path: Path) -> None:
    plan = build_plan(get_profile("mnist"), [0, 1, 2], tmp_path, CONFIGS)
    assert len(plan.runs) == 66 and {s.seed for s in plan.runs} == {0, 1, 2}
    assert {s.row for s in plan.runs} == SEVEN | {"fedent-shuffled", "fedent-fixed", "fedent-cap-none",
                                                 "fedavg-replay-mean", "fedavg-replay", "fedavg-lr9", "fedent-lr9",
                                                 "fedadam-lr3", "feddyn-lr9-alpha0.01", "fedprox-lr9-mu0.0001",
                                                 "fedcos-lr9", "fednorm-lr9", "fedadam-lr9", "fedent-lr9-gamma0.999",
                                                 "fedadam-lr9-tau0.0001"}
    dyn = next(s for s in plan.runs if s.key == "mnist-pathological/feddyn-lr9-alpha0.01-s2").config
    plain_dyn = next(s for s in plan.runs if s.key == "mnist-pathological/feddyn-s2").config
    assert (dyn["train"]["lr"], dyn["algorithm"]) == (pytest.approx(0.09), {**plain_dyn["algorithm"], "alpha": 0.01})
    prox = next(s for s in plan.runs if s.key == "mnist-pathological/fedprox-lr9-mu0.0001-s0").config
    plain_prox = next(s for s in plan.runs if s.key == "mnist-pathological/fedprox-s0").config
    assert (prox["train"]["lr"], prox["algorithm"]) == (pytest.approx(0.09), {**plain_prox["algorithm"], "mu": 0.0001})
    cos = next(s for s in plan.runs if s.key == "mnist-pathological/fedcos-lr9-s1").config
    plain_cos = next(s for s in plan.runs if s.key == "mnist-pathological/fedcos-s1").config
    assert (cos["train"]["lr"], cos["algorithm"]) == (pytest.approx(0.09), plain_cos["algorithm"])
    norm = next(s for s in plan.runs if s.key == "mnist-pathological/fednorm-lr9-s2").config
    plain_norm = next(s for s in plan.runs if s.key == "mnist-pathological/fednorm-s2").config
    assert (norm["train"]["lr"], norm["algorithm"]) == (pytest.approx(0.09), plain_norm["algorithm"])
    adam = next(s for s in plan.runs if s.key == "mnist-pathological/fedadam-lr3-s1").config
    plain_adam = next(s for s in plan.runs if s.key == "mnist-pathological/fedadam-s1").config
    assert adam["train"]["lr"] == 0.03 and adam["algorithm"] == plain_adam["algorithm"]  # server rate: the paper's
    adam9 = next(s for s in plan.runs if s.key == "mnist-pathological/fedadam-lr9-s2").config  # the two-seed point
    assert (adam9["train"]["lr"], adam9["algorithm"]) == (pytest.approx(0.09), plain_adam["algorithm"])
    tau = next(s for s in plan.runs if s.key == "mnist-pathological/fedadam-lr9-tau0.0001-s0").config
    assert tau["train"] == {**adam9["train"], "seed": 0}  # fedadam-lr9's rate and server rate, τ searched after
    assert tau["algorithm"] == {**plain_adam["algorithm"], "tau": 1e-4}
    for algorithm in ("fedavg", "fedent"):  # the validation-tuned rates (FedEnt's: its base rate η_i(−1))
        tuned = next(s for s in plan.runs if s.key == f"mnist-pathological/{algorithm}-lr9-s2")
        assert (tuned.config["algorithm"]["name"], tuned.config["train"]["lr"]) == (algorithm, 0.09)
    plain = next(s for s in plan.runs if s.key == "mnist-pathological/fedent-s0").config
    tuned_fedent = next(s for s in plan.runs if s.key == "mnist-pathological/fedent-lr9-s0").config
    assert tuned_fedent["algorithm"] == plain["algorithm"] == {"name": "fedent"}  # β, γ: the paper's (untuned)
    assert {**tuned_fedent["train"], "lr": 0.01} == plain["train"]  # the base rate is all that differs
    gamma = next(s for s in plan.runs if s.key == "mnist-pathological/fedent-lr9-gamma0.999-s1").config
    assert gamma["train"] == tuned_fedent["train"] | {"seed": 1}  # fedent-lr9's base rate, seed 1
    assert gamma["algorithm"] == {"name": "fedent", "gamma": 0.999}  # β the paper's, as fedent-lr9's
    for replay in (s for s in plan.runs if s.row.startswith("fedavg-replay")):  # FedEnt's rates, same seed
        assert replay.after == (f"mnist-pathological/fedent-s{replay.seed}",)
        assert replay.config["algorithm"]["replay"] == ("round_mean" if replay.row.endswith("mean") else "per_client")
        assert replay.config["algorithm"]["replay_rates"].endswith(f"fedent-s{replay.seed}/metrics.jsonl")
    run = next(s for s in plan.runs if s.key == "mnist-pathological/fedent-shuffled-s1")
    data, train = run.config["data"], run.config["train"]
    assert (data["name"], data["partition"], run.config["model"]["name"]) == ("mnist", "pathological", "mnist-cnn")
    assert (train["rounds"], train["local_epochs"], train["lr"], train["precision"]) == (50, 3, 0.01, "tf32")
    assert run.config["algorithm"]["rates"] == "shuffled"
    assert [s.seed for s in plan.runs] == sorted(s.seed for s in plan.runs)  # seed-major: a cut leaves whole seeds
