"""A report's header credits each run to the recorded call that started it, not to the out dir's latest call."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from conftest import tiny_inputs

from fedent.experiments import call_records
from fedent.experiments.plan import build_plan
from fedent.experiments.profiles import Profile, Row, Section, Setting
from fedent.experiments.reproduce import run_plan
from fedent.experiments.reproduce_report import render_markdown, write_report

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _call(argv: str, started: float, ended: float | None = None, **more: object) -> dict[str, object]:
    return {"argv": ["fedent", "reproduce", *argv.split()], "started": started, "ended": ended, "workers": 2,
            "threads": 1, "commit": "c0ffee", "machine": {"cpu": "Test CPU", "cores": 2}, **more}


def _run(key: str, *starts: float | None) -> dict[str, object]:
    procs = [{"started_at": t} for t in starts]
    prov = {**procs[-1], "earlier": procs[:-1]} if procs else None
    return {"key": key, "provenance": prov}


def test_the_selection_reads_both_flag_forms_and_leaves_absent_flags_open() -> None:
    assert call_records.selection(["fedent", "reproduce", "--rows", "a,b", "--seeds=0,2", "--out", "x"]) == {
        "--settings": None, "--rows": {"a", "b"}, "--seeds": {"0", "2"}}
    assert call_records.selection(["--settings"]) == {"--settings": set(), "--rows": None, "--seeds": None}


def test_a_run_goes_to_the_call_whose_window_and_selection_both_hold_it() -> None:
    calls = [_call("--settings p --rows fedavg --seeds 0", 100, 200),
             _call("--settings p --rows fedavg --seeds 1,2", 150, 300),  # overlaps the first in time
             _call("--settings q", 400)]  # never ended (stopped hard): open to the end
    runs = [_run("p/fedavg-s0", 160),  # inside both windows, but only the first selects seed 0
            _run("p/fedavg-s2", 250),
            _run("p/fedavg-s1", 120, 500),  # started before the second call, resumed later by none that selects it
            _run("q/fedent-s0", 1e9),
            _run("p/fedent-s0", 160),  # started in two windows, selected by neither (--rows fedavg)
            _run("p/fedavg-s3", 50)]  # before every call
    got = call_records.credit(calls, runs)
    assert [c["runs"] for c in got["calls"]] == [["p/fedavg-s0"], ["p/fedavg-s2"], ["q/fedent-s0"]]
    assert got["unrecorded"] == ["p/fedavg-s1", "p/fedent-s0", "p/fedavg-s3"]
    assert got["calls"][0]["argv"][-1] == "0" and got["calls"][0]["commit"] == "c0ffee"


def test_a_resumed_run_goes_to_each_call_that_ran_one_of_its_processes_and_an_undated_run_to_every_selector() -> None:
    calls = [_call("--rows fedavg", 100, 200), _call("--rows fedent", 300, 400), _call("--rows fedavg", 500, 600)]
    got = call_records.credit(calls, [_run("p/fedavg-s0", 110, 550), _run("p/fedent-s0"), _run("p/fedent-s1", None)])
    assert [c["runs"] for c in got["calls"]] == [["p/fedavg-s0"], ["p/fedent-s0", "p/fedent-s1"], ["p/fedavg-s0"]]
    assert got["unrecorded"] == []
    # a call that started none of the runs shown is left out
    assert [c["runs"] for c in call_records.credit(calls, [_run("p/fedent-s0", 350)])["calls"]] == [["p/fedent-s0"]]


def test_the_history_is_read_before_the_latest_call(tmp_path: Path) -> None:
    assert call_records.read_calls(tmp_path) == []
    (tmp_path / "command.json").write_text(json.dumps(_call("--seeds 2", 5)))
    assert [c["argv"][-1] for c in call_records.read_calls(tmp_path)] == ["2"]
    (tmp_path / "commands.jsonl").write_text("".join(json.dumps(_call(f"--seeds {s}", s)) + "\n" for s in (0, 1)))
    assert [c["argv"][-1] for c in call_records.read_calls(tmp_path)] == ["0", "1"]


def test_the_report_names_each_call_with_its_runs(tmp_path: Path) -> None:
    base = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
            "train": {"rounds": 1, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "device": "cpu"}}
    prof = Profile("tiny", "test", (Setting("plain", "no DP", base),),
                   (Row("fedavg", "fedavg"), Row("fedent", "fedent")),
                   (Section("main", "Main", ("plain",), ("fedavg", "fedent")),))
    out = tmp_path / "out"
    plan = build_plan(prof, [0], out, CONFIGS)
    calls = []
    for row in ("fedavg", "fedent"):  # two calls, one row each, as rows added to an out dir later
        began = time.time()
        one = replace(plan, runs=tuple(s for s in plan.runs if s.row == row))
        assert [o.status for o in run_plan(one, 1, 1, lambda cfg: tiny_inputs(4, 12, cfg.train.seed))] == ["done"]
        calls.append(_call(f"--rows {row}", began, time.time(), commit=f"commit-{row}",
                           machine={"cpu": f"CPU-{row}", "cores": 2}))
    (out / "commands.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    (out / "command.json").write_text(json.dumps(calls[-1]))
    report = write_report(plan, out, {**calls[-1], "report_commit": "r1"}).read_text()
    assert ("  - `fedent reproduce --rows fedavg` (workers 2, torch threads per worker 1; git commit commit-fedavg; "
            "trained on: CPU-fedavg, 2 cores, python None, torch None): plain/fedavg (seed 0)") in report
    assert ("git commit commit-fedent; trained on: CPU-fedent, 2 cores, python None, torch None): "
            "plain/fedent (seed 0)") in report
    assert "by no call recorded there" not in report
    assert "- tables and figures: generated from the run logs (report written at r1)" in report
    # the fedavg call's record lost: its run is said to come from no recorded call, not credited to the other
    (out / "commands.jsonl").write_text(json.dumps(calls[1]) + "\n")
    report = write_report(plan, out, {**calls[-1], "report_commit": "r1"}).read_text()
    assert "commit-fedavg" not in report
    assert "  - by no call recorded there (their run provenance below says where they trained): plain/fedavg (seed 0)" \
        in report


def test_a_summary_from_before_the_record_shows_the_latest_call(tmp_path: Path) -> None:
    data = {"meta": {"argv": ["fedent", "reproduce", "--seeds", "0"], "workers": 1, "threads": 2, "commit": "abc",
                     "machine": {"cpu": "Old CPU", "cores": 4}, "report_commit": "r"},
            "profile": {"name": "tiny", "description": "d", "reductions": []}, "seeds": [0], "settings": {},
            "sections": [], "runs": [], "tuned": {}}
    text = render_markdown(data, "figures")
    assert ("- command: `fedent reproduce --seeds 0` (workers 1, torch threads per worker 2); git commit abc; "
            "trained on: Old CPU, 4 cores, python None, torch None") in text


def test_a_call_keeps_the_runs_it_started_and_its_record_outranks_the_inference(tmp_path: Path) -> None:
    from fedent.cli import main

    out = tmp_path / "out"
    argv = ["reproduce", "--profile", "cpu", "--only", "main", "--settings", "pathological", "--rows", "fedavg",
            "--seeds", "0", "--rounds", "1", "--out", str(out), "--workers", "1"]
    assert main(argv) == 0
    assert main(argv) == 0  # everything complete: skipped, so this call started nothing
    history = call_records.read_calls(out)
    assert [h["started_runs"] for h in history] == [["pathological/fedavg-s0"], []]
    report = (out / "report.md").read_text()
    # in process the argv is not sys.argv: one call line, the first call's, not the second's
    assert report.count("  - `fedent reproduce` (workers 1") == 1 and "by no call recorded there" not in report
    # a recorded list wins over the selection: a replay row's call also trains the row it replays
    calls = [_call("--rows fedavg-replay-mean", 100, 200, started_runs=["p/fedent-s0"])]
    got = call_records.credit(calls, [_run("p/fedent-s0", 1e9), _run("p/fedavg-replay-mean-s0", 150)])
    assert [c["runs"] for c in got["calls"]] == [["p/fedent-s0"]] and got["unrecorded"] == ["p/fedavg-replay-mean-s0"]
