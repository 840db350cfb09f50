"""tools/device_check.sh, the prepared GPU check, dry-run on the CPU (``DEVICE=cpu QUICK=1``) in a scratch copy of
the layout it expects: a lent GPU gives 15 minutes a task, so a script that breaks there (an unset variable, a
section that writes its archive wrong) costs a whole session's device time. The study section trains into its own
``results/`` and brings back logs and metrics, never model files or checkpoints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from datafiles import write_mnist_like
from vectorised_support import TOL

ROOT = Path(__file__).resolve().parents[2]


def _scratch_repo(tmp_path: Path) -> Path:
    """The layout the script expects, from the repository root: code and configs linked, data/mnist written."""
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("fedent", "tests", "tools", "configs", "benchmarks"):
        (work / name).symlink_to(ROOT / name)
    write_mnist_like(work / "data" / "mnist", n_train=2000, n_test=200)  # the carried .gz files' layout
    return work


def _dry_run(work: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "tools/device_check.sh"], cwd=work, capture_output=True, text=True, timeout=500,
                          env={**os.environ, "OUT": str(out), "PY": sys.executable, "DEVICE": "cpu", "QUICK": "1",
                               "STUDY_WORKERS": "1", "STUDY_RATE": "100", "DEADLINE_S": "400", **env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


@pytest.mark.slow
def test_the_device_check_dry_runs_its_profile_and_study_sections(tmp_path: Path) -> None:
    work, out = _scratch_repo(tmp_path), tmp_path / "out"
    done = _dry_run(work, out, SECTIONS="env profile study", STUDY_ROWS="fedavg,fedent", STUDY_SEEDS="0,1")
    steps = (out / "steps.log").read_text()
    assert "profile rc=0" in steps and "study rc=0" in steps, steps
    assert "unbound variable" not in done.stdout + done.stderr
    # what comes back: the summary files and one archive, which holds the study's run logs and no model file
    assert sorted(p.name for p in out.iterdir()) == ["device-check.tgz", "env.txt", "profile.md", "steps.log"]
    with tarfile.open(out / "device-check.tgz") as outer:
        names = outer.getnames()
        inner = outer.extractfile("./study.tgz")
        assert inner is not None
        with tarfile.open(fileobj=inner) as study:
            kept = study.getnames()
    assert "./profile.log" in names and not any(n.endswith((".pt", ".ckpt", ".state")) for n in names + kept)
    runs = {n.split("/")[-2] for n in kept if n.endswith("metrics.jsonl")}
    assert runs == {"fedavg-s0", "fedent-s0", "fedavg-s1", "fedent-s1"}
    assert (work / "results" / "mnist-quick" / "report.md").is_file()  # a dry run never writes the study's --out
    assert not (work / "results" / "mnist").exists()


@pytest.mark.slow
def test_the_device_check_dry_runs_its_tune_section(tmp_path: Path) -> None:
    """fedent tune with a worker pool on the real-format MNIST, then the tuned rows: tuned.json is made and read
    (STACK=2: both commands with --stack 2, so the tuning's points train two side by side)."""
    work, out = _scratch_repo(tmp_path), tmp_path / "out"
    _dry_run(work, out, SECTIONS="tune", TUNE_ALGOS="fedavg", TUNE_WORKERS="2", STUDY_SEEDS="0", STACK="2")
    steps = (out / "steps.log").read_text()
    assert "tune rc=0" in steps and "tuned-study rc=0" in steps, steps
    tuned = (work / "results" / "mnist-tune-quick" / "tuned.json").read_text()
    assert '"fedavg"' in tuned
    report = (work / "results" / "mnist-tuned-quick" / "report.md").read_text()
    assert "tuned" in report and "mnist-tune-quick/tuned.json" in report
    statuses = [json.loads(p.read_text()) for p in (work / "results" / "mnist-tune-quick").rglob("status.json")]
    stacked = [st["state"].get("stacked_runs") for st in statuses]
    # the grid's three points: two side by side, one alone; an extension past an edge is one point, alone
    assert stacked.count(2) == 2 and len(stacked) >= 3
    with tarfile.open(out / "device-check.tgz") as outer:
        assert {"./tune.tgz", "./tuned-study.tgz", "./tune.log"} <= set(outer.getnames())


@pytest.mark.slow
def test_the_device_check_dry_runs_its_step_and_levers_sections_with_the_looped_convolution(tmp_path: Path) -> None:
    """The next device call measures train.conv looped first: the step benchmark's default contenders (looped
    over streams and on one) and the conv_looped levers, alone and with bf16, each a line of levers.log."""
    work, out = _scratch_repo(tmp_path), tmp_path / "out"
    _dry_run(work, out, SECTIONS="levers step", LEVERS="none conv_looped conv_looped,autocast_bf16")
    steps = (out / "steps.log").read_text()
    for name in ("step", "lever-none", "lever-conv_looped", "lever-conv_looped,autocast_bf16"):
        assert f"{name} rc=0" in steps, steps
    levers = dict(line.split(": ", 1) for line in (out / "levers.log").read_text().splitlines())
    assert "conv direct" in levers["none"] and "levers: none" in levers["none"]
    assert "conv looped" in levers["conv_looped"] and "levers: none" in levers["conv_looped"]
    assert "conv looped" in levers["conv_looped,autocast_bf16"]
    assert "levers: autocast_bf16" in levers["conv_looped,autocast_bf16"]
    with tarfile.open(out / "device-check.tgz") as tar:
        member = tar.extractfile("./step.log")
        assert member is not None
        step = member.read().decode()
    assert {line.split()[3] for line in step.splitlines() if line.startswith("clients")} == {"direct", "looped",
                                                                                          "looped:1"}


@pytest.mark.slow
def test_the_device_check_dry_runs_its_stacked_section(tmp_path: Path) -> None:
    """Stacked runs (fedent reproduce --stack): the benchmark's table, stacked against one by one, and the full
    profile's pipeline with --stack 3; and the client-state benchmark (the state section): each a step that ends
    well. Stacked runs agree with one by one to the stacking tests' tolerance (tests/fedent/rounds/test_stacking.py),
    not bit for bit: a merged step convolves more clients in one grouped call, and on an AVX2 AMD EPYC box oneDNN's
    kernel for it rounds differently (1.5e-8 after the benchmark's rounds), where an Intel box gave 0."""
    work, out = _scratch_repo(tmp_path), tmp_path / "out"
    write_mnist_like(work / "data" / "fashion-mnist", n_train=2000, n_test=200)  # what the pipeline reads
    _dry_run(work, out, SECTIONS="stacked state", PIPELINE_S="40")
    steps = (out / "steps.log").read_text()
    assert "stacked rc=0" in steps and "pipeline-stacked rc=0" in steps and "state rc=0" in steps, steps
    with tarfile.open(out / "device-check.tgz") as tar:
        member = tar.extractfile("./stacked.log")
        assert member is not None
        table = member.read().decode()
        names = tar.getnames()
        state_member = tar.extractfile("./state.log")
        assert state_member is not None
        state_log = state_member.read().decode()
        statuses = [json.load(f) for n in names if n.startswith("./pipeline-stacked/runs/") and
                    n.endswith("/status.json") and (f := tar.extractfile(n)) is not None]
    assert "| one by one | 2 |" in table and "| stacked | 2 |" in table
    worst = re.search(r"max \|stacked - one by one\| over the final models: (\S+)\n", table)
    assert worst is not None, table
    assert float(worst[1]) <= TOL, worst[0]
    assert "| in the round |" in state_log and "| background |" in state_log
    assert "max |background - in the round| over the final models: 0.00e+00" in state_log
    assert "./pipeline-stacked/command.json" in names
    assert any(st["state"].get("stacked_runs") == 3 for st in statuses)  # the pipeline's runs did stack


@pytest.mark.parametrize(("env", "profile", "root"), [
    ({}, "full", "data/fashion-mnist"),
    ({"PIPE_PROFILE": "mnist", "PIPE_DATA": "data/mnist-gz"}, "mnist", "data/mnist-gz"),
])
def test_the_pipeline_sections_run_the_profile_and_data_they_are_given(tmp_path: Path, env: dict[str, str],
                                                                       profile: str, root: str) -> None:
    """The device tool takes 64 MiB with the tracked tree: a call that carries the real MNIST's 11 MB instead of
    Fashion-MNIST's 30 runs the pipeline sections on the `mnist` profile and that data (PIPE_PROFILE, PIPE_DATA);
    unset, they stay the `full` profile on Fashion-MNIST. A stand-in python records each command it is given."""
    work, out = tmp_path / "repo", tmp_path / "out"
    work.mkdir()
    (work / "tools").symlink_to(ROOT / "tools")
    calls = tmp_path / "calls.txt"
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n')
    stub.chmod(0o755)
    done = subprocess.run(["bash", "tools/device_check.sh"], cwd=work, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(out), "PY": str(stub), "SECTIONS": "pipeline stacked",
                               "DEADLINE_S": "1000", **env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    reproduce = [c for c in calls.read_text().splitlines() if " reproduce " in f" {c} "]
    assert len(reproduce) == 2, reproduce  # the pipeline section's, and the stacked section's --stack 3
    for command in reproduce:
        assert f"--profile {profile} " in command and f"--set data.root={root} " in command, command
    assert "--stack 3" in reproduce[1]
