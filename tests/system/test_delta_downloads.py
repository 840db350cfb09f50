"""Delta downloads across real processes: ``fedent cluster up --download-encoding delta`` (an aggregator and two
worker processes on loopback) ends with the simulator's model (1e-5; the rebuilt models are bit-identical to full
downloads, so nothing is lost to the delta), every worker's model download after its first is a delta, and each
round's ``diagnostics.transfer.bytes_down`` counts the bytes the deltas really took (fewer than whole models)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from procs import ENV, check_equals_simulation, simulate

from fedent.runlog import read_metrics

REPO = Path(__file__).resolve().parents[2]
CONFIG = """\
name: deltadown
data: {name: synthetic, num_clients: 4, partition: iid, synthetic_train: 120, synthetic_test: 40}
model: {name: mnist-cnn}
train: {rounds: 3, fraction: 1.0, local_epochs: 1, batch_size: 20, lr: 0.05, seed: 3, device: cpu}
algorithm: {name: fedavg}
"""


@pytest.mark.slow  # ~45 s on the shared 2-core box (an MNIST-CNN cluster and a simulation)
def test_a_delta_download_cluster_equals_the_simulation(tmp_path: Path) -> None:
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG)
    out = tmp_path / "cluster"
    proc = subprocess.run(
        [sys.executable, "-m", "fedent.cli", "cluster", "up", "--config", str(cfg_path), "--workers", "2",
         "--out", str(out), "--exit-when-done", "--no-dashboard", "--register-timeout", "60",
         "--round-deadline", "60", "--download-encoding", "delta"], cwd=REPO, capture_output=True, text=True,
        timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reference = simulate(tmp_path / "sim", CONFIG)
    check_equals_simulation(out, reference, rounds=3, clients=4)
    model_bytes = sum(p.numel() * 4 for p in reference)
    transfer = [rec["diagnostics"]["transfer"] for rec in read_metrics(out / "metrics.jsonl")]
    assert (transfer[0]["downloads_full"], transfer[0]["downloads_delta"]) == (2, 0)
    assert transfer[0]["bytes_down"] == 2 * model_bytes  # nothing held yet: two whole float32 models
    for t in transfer[1:]:
        assert (t["downloads_full"], t["downloads_delta"]) == (0, 2)
        assert 0 < t["bytes_down"] < 0.9 * 2 * model_bytes
