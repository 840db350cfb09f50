"""`fedent reproduce`: a tiny plan runs, resumes and reports; CLI errors; a killed reproduce takes its workers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_inputs

from fedent import provenance, runlog
from fedent.cli import main
from fedent.config import ConfigError
from fedent.experiments.plan import build_plan, read_tuned
from fedent.experiments.profiles import Profile, Row, Section, Setting
from fedent.experiments.reproduce import diverged, is_complete, run_plan, same_config
from fedent.experiments.reproduce_report import BEGIN, END, _provenance_lines, publish, write_report

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


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

    # a log cut behind its checkpoints cannot be trusted: the run is redone; complete ones are skipped
    metrics = plan.runs[1].run_dir / "metrics.jsonl"
    full = metrics.read_text().splitlines()
    metrics.write_text(full[0] + "\n")
    again = list(run_plan(plan, workers=1, threads=1, inputs_for=inputs_for))
    assert [o.status for o in again] == ["skipped", "done"]
    assert len(runlog.read_metrics(metrics)) == 3
    # interrupted as a kill leaves it (round 3 not logged, the last checkpoint that of round 2): it resumes
    # from round 3 and ends as the uninterrupted run did, instead of starting over
    metrics.write_text("".join(line + "\n" for line in full[:2]))
    ckpts = sorted((plan.runs[1].run_dir / "checkpoint").iterdir())
    ckpts[-1].unlink()  # round-00000002.ckpt (loop index 2 = round 3)
    (plan.runs[1].run_dir / "model_final.pt").unlink()  # written only at the end
    stamp = (plan.runs[1].run_dir / "config.yaml").stat().st_mtime_ns
    again = list(run_plan(plan, workers=1, threads=1, inputs_for=inputs_for))
    assert [o.status for o in again] == ["skipped", "done"]
    assert metrics.read_text().splitlines()[:2] == full[:2]  # rounds 1-2 kept, not run again
    assert runlog.read_metrics(metrics)[2]["test_acc"] == json.loads(full[2])["test_acc"]
    assert (plan.runs[1].run_dir / "config.yaml").stat().st_mtime_ns >= stamp  # same directory, continued
    # a complete run from a different config (e.g. a changed profile) is redone, not reused
    changed = build_plan(_tiny_profile(), [0], out, CONFIGS)
    changed.runs[0].config["train"]["lr"] = 0.05
    assert [o.status for o in run_plan(changed, 1, 1, inputs_for)] == ["done", "skipped"]
    assert [o.status for o in run_plan(plan, 1, 1, inputs_for)] == ["done", "skipped"]
    # ... and the finished runs it replaced were moved aside, whole, never deleted
    first, second = (plan.runs[0].run_dir.with_name(f"fedavg-s0.superseded-{n}") for n in (1, 2))
    assert same_config(first, plan.runs[0].config) and same_config(second, changed.runs[0].config)
    assert is_complete(first, 3) and is_complete(second, 3) and same_config(plan.runs[0].run_dir, plan.runs[0].config)
    assert "held a finished run of another config; moved to fedavg-s0.superseded-2" in capsys.readouterr().err

    report = write_report(plan, out, {"argv": ["fedent", "reproduce"], "machine": {}, "commit": "abc"})
    text = report.read_text()
    summary = json.loads((out / "summary.json").read_text())
    table = summary["tables"]["main/pathological"]
    assert table["seeds"] == [0] and table["same_sampling"] is True
    want = runlog.final_accuracy(runlog.read_metrics(plan.runs[0].run_dir / "metrics.jsonl"))
    assert table["rows"][0]["final_acc"]["mean"] == pytest.approx(want)
    assert f"| fedavg | {100 * want:.2f} (n = 1) |" in text and "± 0.00" not in text  # one seed: no spread
    # paired against FedEnt over the one seed: the difference of the last-5-round means, and no interval
    def end(i: int) -> float:
        accs = [r["test_acc"] for r in runlog.read_metrics(plan.runs[i].run_dir / "metrics.jsonl")
                if r.get("test_acc") is not None][-5:]
        return sum(accs) / len(accs)
    vs = table["paired"]["fedavg"]["vs_ref_end"]
    assert table["reference"] == "fedent" and vs["n"] == 1 and vs["lo"] is None
    assert vs["mean"] == pytest.approx(end(0) - end(1))
    assert f"| fedavg | {100 * end(0):.2f} (n = 1) | {100 * (end(0) - end(1)):+.2f} (n = 1, no interval) |" in text
    assert "- run provenance (provenance.json): commit " in text and "CPUs); GPU " in text
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
    assert main(["reproduce", "--stack", "0", "--dry-run", "--out", str(tmp_path)]) == 2
    assert main(["reproduce", "--stack", "2", "--scheduler", "ray", "--seeds", "0", "--only", "beta",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    err = [line for line in err if not line.startswith("fedent reproduce: 4 runs")]  # the start line of the ray call
    # flag mistakes are not labelled "config error"
    assert len(err) == 5 and "--stack works with the process pool only" in err[-1], err
    assert all(line.startswith("fedent reproduce: --") for line in err), err
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


@pytest.mark.parametrize(("error", "settled"), [
    ("round 7 missed its quorum: the local model of client(s) [3] is not finite: local training diverged", True),
    ("round 7 missed its quorum: client 3: rejected: probe of client 3: scalar a=6.08e+25 is outside its range "
     "[-1e+15, 1e+15]", True),
    ("round 2 missed its quorum: client 3: no live worker", False),
])
def test_a_run_whose_model_blew_past_every_range_has_diverged(tmp_path: Path, error: str, settled: bool) -> None:
    runlog.atomic_write_json(runlog.RunPaths(tmp_path).status, {"phase": "failed", "state": {"error": error}})
    assert diverged(tmp_path) == (error if settled else None)
    runlog.atomic_write_json(runlog.RunPaths(tmp_path).status, {"phase": "running", "state": {"error": error}})
    assert diverged(tmp_path) is None


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


def test_pool_workers_outlive_the_thread_that_started_them() -> None:
    """`fedent tune --workers` submits from one thread per algorithm: the workers those threads started keep
    serving once the threads end (they were killed with them, and a pool killed mid-task hung CI's run)."""
    import os
    import threading

    from fedent.experiments.reproduce import process_pool

    with process_pool(2, 1) as pool:
        started: list[int] = []
        t = threading.Thread(target=lambda: started.extend(f.result() for f in [pool.submit(os.getpid)
                                                                                   for _ in range(2)]))
        t.start()
        t.join()
        time.sleep(2)  # a worker signalled at the thread's end is gone by now
        assert started and all(p.exitcode is None for p in pool._processes.values())
        assert pool.submit(os.getpid).result(timeout=60) in pool._processes


def _tuned_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "validation_fraction": 0.25, "algorithms": {
        "fedavg": {"chosen": {"train.lr": 0.3}},
        "fedent": {"chosen": {"train.lr": 0.02, "algorithm.beta": 0.9}}}}))
    return path


def test_tuned_values_reach_each_rows_config_change_the_cache_key_and_the_report_says_which(tmp_path: Path) -> None:
    """``--tuned DIR``: the pathological setting has DIR/pathological/tuned.json, the iid one has none."""
    import hashlib

    import yaml

    tiny = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
            "train": {"rounds": 1, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "device": "cpu"}}
    rows = (Row("fedavg", "fedavg"), Row("fedavg-lr2", "fedavg", lr_scale=2.0), Row("fedent", "fedent"),
            Row("fedent-beta0.5", "fedent", (("beta", 0.5),)), Row("fedcos", "fedcos"))
    labels = tuple(r.label for r in rows)
    prof = Profile("tiny", "test", (Setting("pathological", "tiny", tiny), Setting("iid", "tiny iid", tiny)), rows,
                   (Section("main", "Table", ("pathological", "iid"), labels),))
    out = tmp_path / "out"
    tuned_json = _tuned_file(tmp_path / "tune" / "pathological" / "tuned.json")
    sha = hashlib.sha256(tuned_json.read_bytes()).hexdigest()

    def inputs_for(cfg):  # type: ignore[no-untyped-def]
        return tiny_inputs(4, 12, cfg.train.seed)

    untuned = build_plan(prof, [0], out, CONFIGS)
    assert [o.status for o in run_plan(untuned, 1, 1, inputs_for)] == ["done"] * 10
    tuned = read_tuned([str(tmp_path / "tune")], prof)
    assert set(tuned) == {"pathological"} and tuned["pathological"].sha256 == sha
    plan = build_plan(prof, [0], out, CONFIGS, tuned=tuned)
    # the cache key is the config: the pathological runs are not the untuned ones any more, the iid ones are
    assert [same_config(s.run_dir, s.config) for s in plan.runs] == [False] * 5 + [True] * 5
    outcomes = list(run_plan(plan, 1, 1, inputs_for))
    assert [o.status for o in outcomes] == ["done"] * 5 + ["skipped"] * 5

    def written(setting: str, row: str) -> dict:  # type: ignore[type-arg]
        return yaml.safe_load((out / "runs" / setting / f"{row}-s0" / "config.yaml").read_text())

    lr = {r: written("pathological", r)["train"]["lr"] for r in labels}
    assert lr == {"fedavg": 0.3, "fedavg-lr2": 0.6, "fedent": 0.02, "fedent-beta0.5": 0.02, "fedcos": 0.1}
    assert written("pathological", "fedent")["algorithm"]["beta"] == 0.9
    assert written("pathological", "fedent-beta0.5")["algorithm"]["beta"] == 0.5  # the row's own option wins
    for r in labels:  # every row of the tuned setting on the tuning's training part, the file's hash recorded
        w = written("pathological", r)
        assert w["data"]["validation_fraction"] == 0.25 and w["name"].endswith(f"-tuned-{sha[:12]}"), r
        assert "validation_fraction" not in written("iid", r)["data"] and "-tuned-" not in written("iid", r)["name"]
    assert {r: written("iid", r)["train"]["lr"] for r in labels} == {**dict.fromkeys(labels, 0.1), "fedavg-lr2": 0.2}
    # an untuned plan again: its runs are redone, not read back from the tuned ones
    assert not any(same_config(s.run_dir, s.config) for s in untuned.runs[:5])

    write_report(plan, out, {"argv": ["fedent", "reproduce"], "machine": {}, "commit": "abc"})
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tuned"]["iid"] is None and summary["tuned"]["pathological"]["sha256"] == sha
    text = (out / "report.md").read_text()
    assert "- iid: **untuned** (no tuned entry for this setting)" in text
    assert f"- pathological: `{tuned_json}` (sha256 {sha})" in text
    assert "  - fedavg-lr2: train.lr 0.3 (x 2)\n" in text and "  - fedent: train.lr 0.02, algorithm.beta 0.9\n" in text
    assert "  - fedent-beta0.5: train.lr 0.02\n" in text  # its β is its own, not the tuned one
    assert "  - fedcos: untuned (its algorithm has no tuned entry)\n" in text


def test_tuned_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    prof = _tiny_profile()
    one = _tuned_file(tmp_path / "t.json")
    assert set(read_tuned([str(one)], prof)) == {"pathological"}  # one setting: a bare file is unambiguous
    assert set(read_tuned([f"pathological={one}"], prof)) == {"pathological"}
    with pytest.raises(ConfigError, match="no setting 'dir0.5'"):
        read_tuned([f"dir0.5={one}"], prof)
    with pytest.raises(ConfigError, match="no <setting>/tuned.json"):
        read_tuned([str(tmp_path)], prof)
    with pytest.raises(ConfigError, match="cannot read"):
        read_tuned([f"pathological={tmp_path / 'missing.json'}"], prof)
    # the cpu profile has several settings: a bare file does not say which
    assert main(["reproduce", "--dry-run", "--tuned", str(one), "--out", str(tmp_path / "o")]) == 2
    assert "expected SETTING=FILE" in capsys.readouterr().err
    assert main(["reproduce", "--dry-run", "--seeds", "0", "--only", "beta", "--tuned", f"pathological={one}",
                 "--out", str(tmp_path / "o")]) == 0
    # a report of tuned runs without their tuned files would describe runs that are not there
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "command.json").write_text(json.dumps({"tuned": {"pathological": {"file": "x.json",
                                                                                        "sha256": "ab"}}}))
    assert main(["reproduce", "--report-only", "--seeds", "0", "--only", "beta", "--out", str(tmp_path / "o")]) == 2
    assert "trained with --tuned pathological=x.json" in capsys.readouterr().err
    # ... but only for the settings of the sections reported (the beta section has the pathological one only)
    (tmp_path / "o" / "command.json").write_text(json.dumps({"tuned": {"dir1.0": {"file": "x.json", "sha256": "ab"}}}))
    assert main(["reproduce", "--report-only", "--seeds", "0", "--only", "beta", "--out", str(tmp_path / "o")]) == 0


def test_a_tuned_file_of_another_problem_is_refused(tmp_path: Path) -> None:
    """Values tuned on one problem (dataset, split, clients, participation, model) say nothing about another:
    pointing a setting at another setting's tuned.json is an error; other rounds or subsamples are not."""
    prof = _tiny_profile()
    raw = json.loads(_tuned_file(tmp_path / "t.json").read_text())
    same = {"data": {"name": "synthetic", "num_clients": 4, "partition": "iid", "max_train_samples": 40},
            "train": {"fraction": 0.5, "rounds": 9}, "model": {"name": "mnist-cnn"}}
    (tmp_path / "same.json").write_text(json.dumps({**raw, "config": same}))
    plan = build_plan(prof, [0], tmp_path / "o", CONFIGS, tuned=read_tuned([str(tmp_path / "same.json")], prof))
    assert plan.runs[0].config["train"]["lr"] == 0.3
    other = {**same, "data": {**same["data"], "num_clients": 100}}
    (tmp_path / "other.json").write_text(json.dumps({**raw, "config": other}))
    with pytest.raises(ConfigError, match=r"setting pathological is another problem: data.num_clients 4 \(tuned on "
                                          r"100\)"):
        build_plan(prof, [0], tmp_path / "o", CONFIGS, tuned=read_tuned([str(tmp_path / "other.json")], prof))


def test_stacked_runs_of_a_plan_give_the_runs_it_gives_one_by_one(tmp_path: Path) -> None:
    """``stack=3``: the first run and the later runs of its setting whose prerequisites ended train side by side
    (the replay waits for the FedEnt run it reads); every run's log equals the one-by-one run's."""
    prof = _tiny_profile()
    prof = Profile("tiny", "test", prof.settings,
                   (*prof.rows, Row("fedavg-replay", "fedavg", (("replay", "per_client"),), replay_of="fedent")),
                   (Section("controls", "Controls", ("pathological",), ("fedavg-replay", "fedavg")),))

    def inputs_for(cfg):  # type: ignore[no-untyped-def]
        return tiny_inputs(4, 12, 0)

    logs = {}
    for stack in (1, 3):
        plan = build_plan(prof, [0, 1], tmp_path / f"out{stack}", CONFIGS, overrides=["train.executor=vectorised"])
        outcomes = list(run_plan(plan, workers=1, threads=1, inputs_for=inputs_for, stack=stack))
        assert {o.status for o in outcomes} == {"done"}
        logs[stack] = {s.key: runlog.read_metrics(s.run_dir / "metrics.jsonl") for s in plan.runs}
        stacked = {s.key: runlog.read_json(s.run_dir / "status.json")["state"].get("stacked_runs")
                   for s in plan.runs}
        if stack == 1:
            assert set(stacked.values()) == {None}
        else:
            assert [o.key for o in outcomes][:3] == ["pathological/fedent-s0", "pathological/fedavg-s0",
                                                     "pathological/fedent-s1"]
            assert stacked["pathological/fedent-s0"] == stacked["pathological/fedent-s1"] == 3
    for key, recs in logs[1].items():
        assert [r["test_acc"] for r in logs[3][key]] == pytest.approx([r["test_acc"] for r in recs], abs=1e-6), key
        assert [r["train_loss"] for r in logs[3][key]] == pytest.approx([r["train_loss"] for r in recs], rel=1e-5)
    with pytest.raises(ConfigError, match="--stack"):
        list(run_plan(plan, workers=1, stack=0))


def test_with_a_budget_a_pool_starts_no_more_groups_than_free_workers(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """workers 2, --stack 2, four ready runs of four settings (four groups of one): only two tasks start at once
    (an admitted run starts now, the budget's estimate counts on it); two runs of one setting share a task."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import fedent.experiments.reproduce as rp
    from fedent.experiments.plan import Plan, RunSpec

    lock, live, peak, tasks = threading.Lock(), [0], [0], []

    def group_task(group: tuple[RunSpec, ...]) -> list[rp.RunOutcome]:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            tasks.append([s.key for s in group])
        time.sleep(0.2)
        with lock:
            live[0] -= 1
        return [rp.RunOutcome(s.key, "done", 0.2, 0.5) for s in group]

    class Admit:
        def admit(self, spec: RunSpec, running: Any = ()) -> str | None:
            return None

        def finished(self, spec: RunSpec, status: str) -> None:
            pass

        def time_left(self) -> float:
            return 100.0

    monkeypatch.setattr(rp, "process_pool", lambda w, t, g: ThreadPoolExecutor(w))
    monkeypatch.setattr(rp, "_execute_group_safely", group_task)
    monkeypatch.setattr(rp, "stackable", lambda s: s.setting)
    settings = ["a", "b", "c", "d", "a"]
    specs = tuple(RunSpec(st, f"row{i}", 0, {"train": {"rounds": 1}}, tmp_path / f"r{i}")
                  for i, st in enumerate(settings))
    outs = list(rp.run_plan(Plan(None, (0,), (), specs), workers=2, budget=Admit(), stack=2))  # type: ignore[arg-type]
    assert sorted(o.key for o in outs) == sorted(s.key for s in specs) and {o.status for o in outs} == {"done"}
    assert peak[0] == 2
    assert tasks[0] == ["a/row0-s0", "a/row4-s0"]  # the later run of setting a joined the first group


def test_runs_from_two_machines_each_get_a_provenance_line_naming_them() -> None:
    gpu = {"commit": "a" * 40, "hostname": "vm", "machine": "x86_64", "cpu_count": 16, "gpu": "H100",
           "python": "3.12", "torch": "2.11", "cuda": "13.0"}
    cpu = {**gpu, "cpu_count": 2, "gpu": None, "cuda": None}
    runs = [{"key": f"m/{row}-s{s}", "provenance": p} for row, p in (("fedent", gpu), ("fedcos", cpu))
            for s in range(3)]
    lines = _provenance_lines(runs)
    assert len(lines) == 2
    assert any("GPU H100" in x and x.endswith(": m/fedent (seeds 0, 1, 2)") for x in lines)
    assert any("GPU None" in x and x.endswith(": m/fedcos (seeds 0, 1, 2)") for x in lines)
    # one machine: the line as before, without run names
    assert _provenance_lines(runs[:3]) == [provenance.describe(gpu)]
