"""``fedent simulate`` stopped by SIGTERM (a batch system's timeout, ``kill``, SLURM, Kubernetes) or SIGINT, then
started again with the same command (issue 27): a real subprocess, signalled after its second logged round.

The stopped run's status.json says ``stopped`` with the signal (not a phase of a live round, which the dashboard
showed as running forever); the same command resumes it from its last checkpoint; the final model equals an
uninterrupted run's (FedDyn, so the clients' λ state must survive the stop too) and every round is logged once.
A finished run started again is reported, not retrained.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datafiles import write_mnist_like

from fedent.checkpoint import load_checkpoint, save_checkpoint
from fedent.model_file import load_model_file
from fedent.rounds.distributed import RANKS_DIR

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_COPY = Path("/usr/share/datasets/fashion-mnist")
ROUNDS = 10


def _argv(tmp_path: Path, run_id: str) -> list[str]:
    data = []
    if not (SYSTEM_COPY / "train-labels-idx1-ubyte.gz").exists():
        root = tmp_path / "data"
        if not root.exists():
            write_mnist_like(root / "fashion-mnist", n_train=2000, n_test=300)
        data = ["--set", f"data.root={root}"]
    return [sys.executable, "-m", "fedent.cli", "simulate", "--config", str(ROOT / "configs" / "demo.yaml"),
            "--set", f"train.rounds={ROUNDS}", "--set", "data.max_train_samples=600",
            "--set", "data.max_test_samples=200", "--set", "algorithm.name=feddyn", *data,
            "--out", str(tmp_path / "runs"), "--run-id", run_id, "--no-plots", "--no-progress", "--threads", "1"]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                OMP_NUM_THREADS="1")


def _rounds(run_dir: Path) -> list[int]:
    return [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_simulation_ends_stopped_and_resumes_to_the_uninterrupted_model(
        tmp_path: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "runs" / "stopped"
    proc = subprocess.Popen(_argv(tmp_path, "stopped"), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while not ((run_dir / "metrics.jsonl").exists() and len(_rounds(run_dir)) >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, (proc.returncode, err[-3000:])
    assert f"stopped by {sig.name}" in err and "the same command resumes it" in err, err
    status = json.loads((run_dir / "status.json").read_text())
    assert status["phase"] == "stopped" and status["state"]["reason"] == f"stopped by {sig.name}", status
    done = len(_rounds(run_dir))
    assert 2 <= done < ROUNDS, "the signal came after the run finished: make its rounds slower"

    resumed = subprocess.run(_argv(tmp_path, "stopped"), env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stderr and "from the checkpoint of round" in resumed.stderr, resumed.stderr
    assert _rounds(run_dir) == list(range(1, ROUNDS + 1)), "every round logged once"
    assert json.loads((run_dir / "status.json").read_text())["phase"] == "done"

    ref = subprocess.run(_argv(tmp_path, "ref"), env=_env(), capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    banner = ref.stdout.splitlines()[0]  # off a terminal: the start banner, then the first round's estimate
    for word in ("fashion-mnist", "dirichlet", "20 clients", "mnist-cnn", "feddyn", "device cpu", "executor",
                 f"{ROUNDS} rounds"):
        assert word in banner, (word, banner)
    assert any(line.startswith("estimated ") and "more round(s) at" in line for line in ref.stdout.splitlines())
    a = load_model_file(run_dir / "model_final.pt").params
    b = load_model_file(tmp_path / "runs" / "ref" / "model_final.pt").params
    scale = max(float(y.abs().max()) for y in b)
    assert max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)) <= 1e-5 * scale

    again = subprocess.run(_argv(tmp_path, "stopped"), env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "finished" in again.stdout and "nothing to do" in again.stdout, again
    assert _rounds(run_dir) == list(range(1, ROUNDS + 1))


@pytest.mark.slow  # four two-process runs of FedDyn (~1 min on a busy 2-core box)
def test_a_two_process_reduced_run_stopped_resumes_to_the_uninterrupted_model(tmp_path: Path) -> None:
    """``--procs 2`` (rounds reduced to sums, FedDyn: the clients' λ and the server's Σλ must survive): SIGTERM to
    the launcher stops both ranks at a checkpoint, the same command resumes them, and the model is the
    uninterrupted two-process run's bit for bit (the same sums in the same order). A copy of the stopped run whose
    rank 1 cannot resume fails on both ranks at once, rank 0 naming rank 1's error."""
    run_dir = tmp_path / "runs" / "stopped"
    argv = [*_argv(tmp_path, "stopped"), "--procs", "2"]
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((run_dir / "metrics.jsonl").exists() and len(_rounds(run_dir)) >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["phase"] == "stopped", err[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["state"]["reduce"] == "sum"
    assert 2 <= len(_rounds(run_dir)) < ROUNDS, "the signal came after the run finished: make its rounds slower"

    # a copy whose rank 1 holds an intact checkpoint of another model (its shapes): rank 1's resume fails after the
    # run directory's checks, every rank stops at once and rank 0's status names rank 1's error (before, rank 0
    # waited in round 1's gather until gloo saw rank 1's process exit, and said only that)
    broken = tmp_path / "runs" / "broken"
    shutil.copytree(run_dir, broken)
    ckpt_dir = broken / RANKS_DIR / "1" / "checkpoint"
    newest = sorted(ckpt_dir.glob("*.ckpt"))[-1]
    ckpt = load_checkpoint(newest)
    save_checkpoint(ckpt_dir, dataclasses.replace(ckpt, global_params=[p.flatten() for p in ckpt.global_params]))
    failed = subprocess.run([*_argv(tmp_path, "broken"), "--procs", "2"], env=_env(), capture_output=True,
                            text=True, timeout=300)
    assert failed.returncode != 0
    status = json.loads((broken / "status.json").read_text())
    assert status["phase"] == "failed", failed.stderr[-3000:]
    assert status["state"]["error"] == ("RanksFailed: rank 1 of 2 failed: ValueError: checkpoint model shapes "
                                        "differ from the configured model"), status

    resumed = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stderr, resumed.stderr[-3000:]
    assert _rounds(run_dir) == list(range(1, ROUNDS + 1)), "every round logged once"
    ref = subprocess.run([*_argv(tmp_path, "ref"), "--procs", "2"], env=_env(), capture_output=True, text=True,
                         timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    a = load_model_file(run_dir / "model_final.pt").params
    b = load_model_file(tmp_path / "runs" / "ref" / "model_final.pt").params
    assert all(bool((x == y).all()) for x, y in zip(a, b, strict=True))
