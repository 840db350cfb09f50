"""``fedent tune --workers 2`` and ``fedent compare --workers 2`` stopped by SIGTERM: real subprocesses whose runs
train in spawned pool workers (``fedent reproduce --workers`` uses the same pool).

Before, the signal reached only the parent, which then waited for the running runs to train their last round
(hours at Table IV's scale) before exiting. Now it stops them: the command exits at once with 128 + SIGTERM, each
run's status.json says ``stopped`` and keeps its checkpoints, so the same command resumes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedent.config import config_from_dict
from fedent.experiments.reproduce import prepare_run_dir

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 5000  # far more than a run trains before the signal

COMMANDS = {  # the command's arguments after --config, and the two run directories it trains at once
    "tune": (["--algorithms", "fedavg", "--grid", "train.lr=0.01,0.03"], ["runs/fedavg/lr0.01-s0",
                                                                         "runs/fedavg/lr0.03-s0"]),
    "compare": (["--algorithms", "fedavg,fedprox", "--seeds", "0"], ["runs/fedavg-s0",
                                                                                     "runs/fedprox-s0"]),
}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_sigterm_stops_a_pooled_command_at_once_and_its_runs_resume(tmp_path: Path, command: str) -> None:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("name: tiny\ndata: {name: synthetic, num_clients: 10, synthetic_train: 400, synthetic_test: 100}\n"
                   f"train: {{rounds: {ROUNDS}, fraction: 0.3, local_epochs: 1, batch_size: 16, lr: 0.05, "
                   "device: cpu}\nalgorithm: {name: fedavg}\n")
    out = tmp_path / command
    args, dirs = COMMANDS[command]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fedent.cli", command, "--config", str(cfg), *args,
                             "--workers", "2", "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = [out / d for d in dirs]
    try:
        deadline = time.monotonic() + 300
        while not all(_lines(r / "metrics.jsonl") >= 2 for r in runs):  # both runs training in their workers
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)  # before: it waited for 5,000 rounds of each run
    finally:
        proc.kill()  # its workers end with it (fedent.experiments.reproduce._die_with_parent)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-3000:])
    assert "stopped by SIGTERM" in err, err[-3000:]
    for run in runs:
        status = json.loads((run / "status.json").read_text())
        assert status["phase"] == "stopped" and status["state"]["reason"].startswith("stopped by"), status
        assert 2 <= _lines(run / "metrics.jsonl") < ROUNDS
        written = config_from_dict(yaml.safe_load((run / "config.yaml").read_text()))
        assert prepare_run_dir(run, written, run.name) is True  # the same command goes on from its checkpoint


def test_a_task_already_queued_for_a_worker_does_not_start_after_sigterm(tmp_path: Path) -> None:
    """A process pool hands its workers one task more than they run, which ``cancel_futures`` cannot recall; it
    used to start once the worker's run had stopped, creating its run directory and taking its lock until the kill
    after the grace time (seen: `fedent reproduce` stopped by SIGTERM began seed 2's runs). Now it never starts."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("name: tiny\ndata: {name: synthetic, num_clients: 10, synthetic_train: 400, synthetic_test: 100}\n"
                   f"train: {{rounds: {ROUNDS}, fraction: 0.3, local_epochs: 1, batch_size: 16, lr: 0.05, "
                   "device: cpu}\nalgorithm: {name: fedavg}\n")
    out = tmp_path / "compare"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fedent.cli", "compare", "--config", str(cfg), "--algorithms",
                             "fedavg,fedprox,feddyn", "--seeds", "0", "--workers", "2", "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first, queued = [out / "runs" / "fedavg-s0", out / "runs" / "fedprox-s0"], out / "runs" / "feddyn-s0"
    try:
        deadline = time.monotonic() + 300
        while not all(_lines(r / "metrics.jsonl") >= 2 for r in first):  # both workers training
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-3000:])
    assert all(json.loads((r / "status.json").read_text())["phase"] == "stopped" for r in first)
    assert not queued.exists(), sorted(p.name for p in queued.iterdir())
