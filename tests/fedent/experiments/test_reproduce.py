"""`fedent reproduce`: the protocol builds the paper's runs, and a tiny plan runs, resumes and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_inputs

from fedent import runlog
from fedent.cli import main
from fedent.config import ConfigError
from fedent.experiments.reproduce import Profile, Row, Section, Setting, build_plan, get_profile, is_complete, run_plan
from fedent.experiments.reproduce_report import BEGIN, END, publish, write_report

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
    ctrl = [s for s in plan.runs[first_part + 18:] if s.seed == 0]
    assert {s.row for s in ctrl} == {"fedavg-lr2", "fedavg-lr5", "fedavg-lr10", "fedavg-replay",
                                     "fedavg-replay-mean", "fedent-first", "fedent-offline-first"}
    assert all(s.seed == 1 for s in plan.runs[first_part + 18 + len(ctrl):])
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


def test_full_profile_sizes_and_drops_in_the_documented_order(tmp_path: Path) -> None:
    from fedent.experiments.reproduce import client_steps, drop_order, trim_plan

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


def test_set_overrides_every_setting_but_never_the_rows(tmp_path: Path) -> None:
    plan = build_plan(get_profile("full"), [0], tmp_path, CONFIGS, only=["main"], rows=["fedavg"],
                      overrides=["train.conv=unfold", "train.max_parallel_clients=7"])
    assert len(plan.runs) == 7
    assert all(s.config["train"]["conv"] == "unfold" and s.config["train"]["max_parallel_clients"] == 7
               for s in plan.runs)
    assert all(s.config["train"]["precision"] == "tf32" for s in plan.runs)  # the full profile's own choice
    for bad, why in (("algorithm.name=fedavg", "rows set the algorithm"), ("train.seed=3", "seeds the seed"),
                     ("train.conv=fft", "train.conv: must be one of direct, unfold")):
        with pytest.raises(ConfigError, match=why):
            build_plan(get_profile("full"), [0], tmp_path, CONFIGS, only=["main"], overrides=[bad])


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


def _tiny_profile() -> Profile:
    base = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
            "train": {"rounds": 3, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1,
                      "device": "cpu", "local_eval": 1}}
    return Profile("tiny", "test", (Setting("pathological", "tiny", base, (), "mnist"),),
                   (Row("fedavg", "fedavg"), Row("fedent", "fedent")),
                   (Section("main", "Table", ("pathological",), ("fedavg", "fedent")),
                    Section("deviation", "Deviation", ("pathological",), ("fedavg", "fedent"))))


def test_two_run_plan_runs_resumes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    plan = build_plan(_tiny_profile(), [0], out, CONFIGS)
    assert [s.key for s in plan.runs] == ["pathological/fedavg-s0", "pathological/fedent-s0"]

    def inputs_for(cfg):  # type: ignore[no-untyped-def]
        return tiny_inputs(4, 12, cfg.train.seed)

    outcomes = list(run_plan(plan, workers=1, threads=1, inputs_for=inputs_for))
    assert [o.status for o in outcomes] == ["done", "done"]
    out_lines = capsys.readouterr().out.splitlines()  # stdout is no terminal here: a plain line per round
    assert [ln.split(" acc")[0] for ln in out_lines if ln.startswith("pathological/fedavg-s0: round")] == [
        f"pathological/fedavg-s0: round {i}/3" for i in (1, 2, 3)]
    assert all(is_complete(s.run_dir, 3) for s in plan.runs)

    # an interrupted run (metrics cut short) is redone; complete ones are skipped
    metrics = plan.runs[1].run_dir / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")
    again = list(run_plan(plan, workers=1, threads=1, inputs_for=inputs_for))
    assert [o.status for o in again] == ["skipped", "done"]
    assert len(runlog.read_metrics(metrics)) == 3
    # a complete run from a different config (e.g. a changed profile) is redone, not reused
    changed = build_plan(_tiny_profile(), [0], out, CONFIGS)
    changed.runs[0].config["train"]["lr"] = 0.05
    assert [o.status for o in run_plan(changed, 1, 1, inputs_for)] == ["done", "skipped"]
    assert [o.status for o in run_plan(plan, 1, 1, inputs_for)] == ["done", "skipped"]

    report = write_report(plan, out, {"argv": ["fedent", "reproduce"], "machine": {}, "commit": "abc"})
    text = report.read_text()
    summary = json.loads((out / "summary.json").read_text())
    table = summary["tables"]["main/pathological"]
    assert table["seeds"] == [0] and table["same_sampling"] is True
    want = runlog.final_accuracy(runlog.read_metrics(plan.runs[0].run_dir / "metrics.jsonl"))
    assert table["rows"][0]["final_acc"]["mean"] == pytest.approx(want)
    assert f"| fedavg | {100 * want:.2f} ± 0.00 |" in text
    assert "85.53" in text  # the paper's Table III MNIST number beside our row
    assert summary["tables"]["deviation/pathological"]["rows"][1]["local"] is not None
    assert table["rows"][1]["eta_final_mean"] is not None and table["rows"][0]["eta_final_mean"] is None
    # the mechanism (issue 17): FedEnt's solves are summarised, FedAvg has none; the scale response is there
    assert set(table["mechanism"]) == {"fedent"} and table["mechanism"]["fedent"]["solves"] > 0
    assert [r["s"] for r in table["scale"]["rows"]] == [0.1, 0.5, 1.0, 2.0, 10.0]
    assert "What FedEnt's rate did" in text and "How η* moves with scale" in text
    for name in summary["figures"]["main/pathological"]:
        png = out / "figures" / name
        assert png.stat().st_size < 200_000

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "results.md").write_text(f"# Results\n\nmy discussion\n\n{BEGIN}\nold\n{END}\n\nmore words\n")
    md = publish(out, docs).read_text()
    assert "my discussion" in md and "more words" in md and "old\n" not in md
    assert "](results/main-pathological.png)" in md and (docs / "results" / "main-pathological.png").exists()


def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["reproduce", "--only", "nope", "--dry-run", "--out", str(tmp_path)]) == 2
    assert main(["reproduce", "--seeds", "a", "--dry-run", "--out", str(tmp_path)]) == 2
    assert main(["reproduce", "--profile", "cpu", "--paper-datasets", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # flag mistakes are not labelled "config error"
    assert len(err) == 3 and all(line.startswith("fedent reproduce: --") for line in err), err
    assert main(["reproduce", "--dry-run", "--seeds", "0", "--only", "beta", "--out", str(tmp_path)]) == 0
    assert "4 runs in sections beta" in capsys.readouterr().out


def test_a_replay_row_runs_after_the_fedent_run_it_reads(tmp_path: Path) -> None:
    prof = _tiny_profile()
    prof = Profile("tiny", "test", prof.settings,
                   (*prof.rows, Row("fedavg-replay", "fedavg", (("replay", "per_client"),), replay_of="fedent")),
                   (Section("controls", "Controls", ("pathological",), ("fedavg-replay", "fedavg")),))
    plan = build_plan(prof, [0], tmp_path / "out", CONFIGS)
    assert [s.row for s in plan.runs] == ["fedent", "fedavg-replay", "fedavg"]

    def inputs_for(cfg):  # type: ignore[no-untyped-def]
        return tiny_inputs(4, 12, cfg.train.seed)

    outcomes = list(run_plan(plan, workers=1, threads=1, inputs_for=inputs_for))
    assert [o.status for o in outcomes] == ["done", "done", "done"]
    ent, rep = (runlog.read_metrics(s.run_dir / "metrics.jsonl") for s in plan.runs[:2])
    assert rep[-1]["test_acc"] == pytest.approx(ent[-1]["test_acc"])  # the replay retraced FedEnt


def test_a_diverged_run_is_an_outcome_of_its_row_not_a_lost_seed(tmp_path: Path) -> None:
    """FedAvg at an absurd rate goes non-finite: the report says so in its row and keeps the seed for the others."""
    base = _tiny_profile()
    rows = (Row("fedavg", "fedavg"), Row("fedavg-huge", "fedavg", lr_scale=float("inf")))
    prof = Profile("tiny", "test", base.settings, rows,
                   (Section("main", "Table", ("pathological",), ("fedavg", "fedavg-huge")),))
    out = tmp_path / "out"
    plan = build_plan(prof, [0], out, CONFIGS)
    outcomes = list(run_plan(plan, 1, 1, lambda cfg: tiny_inputs(4, 12, cfg.train.seed)))
    assert [o.status for o in outcomes] == ["done", "diverged"] and "not finite" in str(outcomes[1].error)
    # settled: a resumed plan skips it (the same seed diverges again; the H100 call re-ran two for nothing)
    again = list(run_plan(plan, 1, 1, lambda cfg: tiny_inputs(4, 12, cfg.train.seed)))
    assert [o.status for o in again] == ["skipped", "diverged"] and str(again[1].error).startswith("(before)")
    from fedent.experiments.budget import TimeBudget

    tb = TimeBudget(plan, 10.0, 1.0, 1)
    assert tb.free == {s.key for s in plan.runs} and tb.started_units == {("pathological", 0)}
    write_report(plan, out, {"argv": ["fedent", "reproduce"], "machine": {}, "commit": "abc"})
    summary = json.loads((out / "summary.json").read_text())
    table = summary["tables"]["main/pathological"]
    assert table["seeds"] == [0] and table["missing"] == []
    ok, huge = table["rows"]
    assert ok["diverged"] == 0 and ok["final_acc"] is not None
    assert huge["diverged"] == 1 and huge["final_acc"] is None
    text = (out / "report.md").read_text()
    assert "| fedavg-huge | diverged (1/1 seeds) |" in text
    assert "Diverged (an outcome of the row" in text and "Not complete" not in text


def test_killing_reproduce_ends_its_pool_workers(tmp_path: Path) -> None:
    """SIGKILL of `fedent reproduce` (a timeout, a kill by hand) takes its worker processes with it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fedent.cli", "reproduce", "--profile", "cpu", "--only", "main", "--rows", "fedavg",
           "--seeds", "0", "--rounds", "100000", "--workers", "2", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(CONFIGS.parent)})

    def children() -> list[int]:
        kids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == proc.pid:
                    kids.append(int(d.name))
        return kids

    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("runs/*/*/metrics.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert list(out.glob("runs/*/*/metrics.jsonl")), "no run logged a round within 120 s"
        workers = children()
        assert workers
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and
                 "Z" not in (Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[:1] or ["Z"])]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, f"pool workers {alive} outlived their reproduce"
