"""The time budget of ``fedent reproduce --budget-s``: trimmed at the estimate, re-trimmed at the measured rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_inputs

from fedent.cli import main
from fedent.experiments.budget import TimeBudget
from fedent.experiments.plan import build_plan, client_steps, drop_order
from fedent.experiments.profiles import Profile, Row, Section, Setting, get_profile
from fedent.experiments.reproduce import run_plan

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_trim_follows_the_measured_rate_both_ways(tmp_path: Path) -> None:
    plan = build_plan(get_profile("full"), [0, 1], tmp_path, CONFIGS, only=["main"])
    total = sum(client_steps(s.config) for s in plan.runs)
    clock = Clock()
    # the estimate holds a quarter of the plan in 100 s
    tb = TimeBudget(plan, 100.0, total / 400, workers=4, clock=clock)
    units = drop_order(plan)
    assert tb.dropped == units[: len(tb.dropped)] and 0 < len(tb.dropped) < len(units)
    kept = next(s for s in plan.runs if (s.setting, s.seed) not in tb.dropped)
    gone = next(s for s in plan.runs if (s.setting, s.seed) in tb.dropped)
    assert tb.admit(kept) is None
    assert "dropped to fit --budget-s 100" in str(tb.admit(gone))
    # past the warm-up the machine proves 10x faster than estimated: dropped units come back
    clock.t = 61.0
    tb.done_steps = int(10 * total / 400 * 61)
    assert tb.rate() == pytest.approx(10 * total / 400, rel=1e-3)
    assert tb.admit(gone) is None and tb.dropped == []
    # ... and 10x slower than estimated: units go again, in the documented order, and a long run waits
    tb.done_steps = int(total / 4000 * 61)
    why = tb.admit(gone)
    order = [u for u in units if u not in tb.started_units]  # the units already started stay
    assert why is not None and len(tb.dropped) > 0 and tb.dropped == order[: len(tb.dropped)]
    assert (gone.setting, gone.seed) in tb.started_units and (gone.setting, gone.seed) not in tb.dropped


def test_a_run_that_cannot_finish_in_the_time_left_is_not_started(tmp_path: Path) -> None:
    plan = build_plan(get_profile("full"), [0], tmp_path, CONFIGS, only=["main"], rows=["fedavg"])
    first = plan.runs[0]
    steps = client_steps(first.config)
    clock = Clock()
    tb = TimeBudget(plan, 100.0, steps / 10, workers=1, clock=clock)  # a run takes 10 s
    assert tb.admit(first) is None
    clock.t = 95.0
    assert "would not finish within --budget-s 100" in str(tb.admit(first))
    with pytest.raises(ValueError):
        TimeBudget(plan, 0.0, 1.0, 1)


def _tiny(tmp_path: Path) -> Profile:
    base = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
            "train": {"rounds": 2, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "device": "cpu"}}
    return Profile("tiny", "test", (Setting("pathological", "tiny", base),),
                   (Row("fedavg", "fedavg"), Row("fedavg-lr2", "fedavg", lr_scale=2.0)),
                   (Section("main", "Table", ("pathological",), ("fedavg", "fedavg-lr2")),))


def test_run_plan_asks_the_budget_and_reports_what_it_refused(tmp_path: Path) -> None:
    plan = build_plan(_tiny(tmp_path), [0, 1], tmp_path / "out", CONFIGS)
    clock = Clock()
    per_run = client_steps(plan.runs[0].config)
    # the estimate holds the kept unit's two runs and nothing more; seed 1 is dropped
    tb = TimeBudget(plan, 10.0, 2 * per_run / 10.0, workers=1, clock=clock)
    assert tb.dropped == [("pathological", 1)]
    got = list(run_plan(plan, 1, 1, lambda cfg: tiny_inputs(4, 12, cfg.train.seed), budget=tb))
    assert [(o.key, o.status) for o in got] == [
        ("pathological/fedavg-s0", "done"), ("pathological/fedavg-lr2-s0", "done"),
        ("pathological/fedavg-s1", "not run"), ("pathological/fedavg-lr2-s1", "not run")]
    assert "seed 1 dropped" in str(got[2].error)
    assert tb.done_steps == 2 * per_run


def test_the_command_reports_a_budget_that_holds_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["reproduce", "--profile", "cpu", "--only", "main", "--rows", "fedavg", "--seeds", "0,1", "--rounds", "1",
            "--out", str(out), "--workers", "1", "--budget-s", "1", "--steps-per-s", "1"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "dropped to fit --budget-s 1 at 1 steps/s: setting dir1.0, seed 1" in text
    assert "--budget-s 1: 0 of 6 runs started" in text
    assert "not run (would not finish in the time left): pathological/fedavg-s0\n" in text
    command = json.loads((out / "command.json").read_text())
    assert {"setting": "pathological", "seed": 1} in command["dropped"]
    assert set(command["not_run"]) == {f"{st}/fedavg-s{sd}" for st in ("pathological", "dir1.0", "dir0.5")
                                       for sd in (0, 1)}
    report = (out / "report.md").read_text()
    assert "Dropped to fit the time budget" in report and "not started" in report
    # where the runs trained is recorded when training starts, and a later --report-only keeps it
    assert command["machine"]["cores"] >= 1 and "- trained by: no call yet (no run shown here has started)" in report
    assert main([*argv, "--report-only"]) == 0
    assert "- trained by: no call yet (no run shown here has started)" in (out / "report.md").read_text()
    # every call that trained is kept in commands.jsonl (a report-only pass is none); command.json is the latest
    history = [json.loads(line) for line in (out / "commands.jsonl").read_text().splitlines()]
    assert len(history) == 1 and history[0]["not_run"] == command["not_run"]
    assert main([*argv[:-4], "--budget-s", "2", "--steps-per-s", "1"]) == 0
    history = [json.loads(line) for line in (out / "commands.jsonl").read_text().splitlines()]
    assert len(history) == 2 and history[0]["started"] < history[1]["started"] <= history[1]["ended"]
    assert history[1]["started"] == json.loads((out / "command.json").read_text())["started"]


def test_runs_still_going_when_the_budget_ends_are_cut_short(tmp_path: Path) -> None:
    """Two worker processes on runs far longer than the budget: both are stopped and reported, none hangs."""
    import time

    prof = _tiny(tmp_path)
    plan = build_plan(prof, [0], tmp_path / "out", CONFIGS, rounds=100_000)
    tb = TimeBudget(plan, 12.0, 1e12, workers=2)  # the estimate admits both; the clock ends them
    t0 = time.monotonic()
    got = list(run_plan(plan, 2, 1, budget=tb))
    assert time.monotonic() - t0 < 60
    assert sorted(o.status for o in got) == ["cut short", "cut short"]
    assert all("the time budget ended it after" in str(o.error) for o in got)


def test_a_started_unit_is_never_dropped_again(tmp_path: Path) -> None:
    plan = build_plan(get_profile("full"), [0, 1], tmp_path, CONFIGS, only=["main"])
    total = sum(client_steps(s.config) for s in plan.runs)
    clock = Clock()
    tb = TimeBudget(plan, 100.0, total / 100, workers=4, clock=clock)  # everything fits at the estimate
    assert tb.dropped == []
    last = drop_order(plan)[0]  # the first unit to go when it does not fit
    spec = next(s for s in plan.runs if (s.setting, s.seed) == last)
    assert tb.admit(spec) is None
    clock.t = 61.0
    tb.done_steps = int(total / 1000 * 61)  # 10x slower than estimated
    other = next(s for s in plan.runs if (s.setting, s.seed) != last)
    tb.admit(other)
    assert last not in tb.dropped and len(tb.dropped) > 0
