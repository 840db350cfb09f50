"""End to end with real processes on loopback: ``fedent cluster up`` equals the in-process simulation.

For the same config and seed, the global model after a 3-round cluster run (aggregator + estimator
service where FedEnt uses one + 2 worker processes that load the data themselves) matches
``fedent.sim.run_simulation`` to 1e-5 relative, for FedAvg, FedEnt and FedDyn, and for SCAFFOLD on
vectorised workers against the vectorised simulator.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedent.config import load_config
from fedent.model_file import load_model_file
from fedent.runlog import read_json, read_metrics
from fedent.sim.simulator import run_simulation

REPO = Path(__file__).resolve().parents[2]

CONFIG = """\
name: e2e
data: {{name: synthetic, num_clients: 4, partition: iid, synthetic_train: 160, synthetic_test: 60}}
model: {{name: mnist-cnn}}
train: {{rounds: 3, fraction: 0.5, local_epochs: 1, batch_size: 20, lr: 0.05, seed: 7, device: cpu,
         executor: {executor}}}
algorithm: {{name: {algorithm}}}
"""


def _max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
    den = max(float(y.abs().max()) for y in b)
    return num / den


@pytest.mark.parametrize(("algorithm", "workers", "executor"), [
    ("fedavg", 2, "auto"), ("fedent", 2, "auto"), ("feddyn", 1, "auto"), ("scaffold", 2, "vectorised")])
def test_cluster_run_equals_simulation(tmp_path: Path, algorithm: str, workers: int, executor: str) -> None:
    """``train.executor`` reaches every worker (``python -m client --executor``): vectorised workers equal the
    vectorised simulator, SCAFFOLD's client state persisted in their state directories between rounds."""
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG.format(algorithm=algorithm, executor=executor))
    out = tmp_path / "cluster"
    proc = subprocess.run(
        [sys.executable, "-m", "fedent.cli", "cluster", "up", "--config", str(cfg_path), "--workers", str(workers),
         "--out", str(out), "--exit-when-done", "--no-dashboard", "--register-timeout", "60",
         "--round-deadline", "60"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_json(out / "status.json")["phase"] == "done"
    if executor != "auto":
        assert f"with the {executor} executor" in proc.stderr + proc.stdout  # each worker says how it trains
    cluster_model = load_model_file(out / "model_final.pt").params
    sim = run_simulation(load_config(cfg_path), tmp_path / "sim", progress=False, plots=False)
    assert _max_rel(cluster_model, sim.params) <= 1e-5
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["clients"] for r in recs] == [r["clients"] for r in sim.records]
    assert recs[-1]["test_acc"] == pytest.approx(sim.records[-1]["test_acc"], abs=1e-9)
    clients = read_json(out / "clients.json")["clients"]
    assert sum(c["participation"] for c in clients) == sum(r["num_clients"] for r in recs)


def test_cluster_up_reports_a_bad_config_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {rounds: 0}\n")
    proc = subprocess.run([sys.executable, "-m", "fedent.cli", "cluster", "up", "--config", str(bad),
                           "--exit-when-done"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "train.rounds" in proc.stderr and "Traceback" not in proc.stderr


def _procs_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (Linux /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(d.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the children")
def test_sigterm_stops_the_cluster_and_its_children(tmp_path: Path) -> None:
    import re
    import signal
    import time

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG.format(algorithm="fedavg", executor="auto").replace("rounds: 3", "rounds: 500"))
    out = tmp_path / "cluster"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedent.cli", "cluster", "up", "--config", str(cfg_path), "--workers", "2",
         "--out", str(out), "--no-dashboard", "--insecure"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        port = None
        for line in proc.stdout:
            m = re.search(r"aggregator on 127\.0\.0\.1:(\d+)", line)
            if m:
                port = m.group(1)
                break
        assert port is not None, "the launcher did not announce the aggregator"
        deadline = time.monotonic() + 120
        while (read_json(out / "status.json", {}) or {}).get("phase") != "training":
            assert time.monotonic() < deadline and proc.poll() is None, "the run never started training"
            time.sleep(0.2)
        assert len(_procs_mentioning(f"--aggregator 127.0.0.1:{port}")) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
        assert _procs_mentioning(f"--aggregator 127.0.0.1:{port}") == [], "workers outlived the launcher"
        status = read_json(out / "status.json")  # a signal stops the run (resumable), it does not fail it
        assert (status["phase"], status["state"]["reason"]) == ("stopped", "stopped by SIGTERM"), status
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
