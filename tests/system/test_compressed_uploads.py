"""Lossy upload encodings across real processes: the cluster equals the simulator under compression.

``train.upload_encoding`` (fedent.compress) is applied by the client half both run (fedent.rounds.host) with the
same seeded rounding, and a worker sends only the codes, which the aggregator decodes against w(t): so a
2-worker loopback cluster's final model equals the in-process simulation (1e-5) for int8 and for top-k with
error feedback, while each round's uploads (metrics.jsonl ``diagnostics.transfer.bytes_up``) are a fraction of
the float32 models'. Both sides run one CPU thread: stochastic rounding turns a last-bit difference between
thread counts into a whole quantisation step now and then, so equality needs the same float results first.
"""

from __future__ import annotations

import os
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
name: squeeze
data: {{name: synthetic, num_clients: 4, partition: iid, synthetic_train: 160, synthetic_test: 60}}
model: {{name: mnist-cnn}}
train: {{rounds: 3, fraction: 0.5, local_epochs: 1, batch_size: 20, lr: 0.05, seed: 7, device: cpu,
         upload_encoding: {encoding}, topk_fraction: 0.05}}
algorithm: {{name: {algorithm}}}
"""


@pytest.mark.parametrize(("encoding", "algorithm", "most"), [("int8", "fedavg", 0.26), ("topk", "fedprox", 0.11)])
def test_a_compressed_cluster_equals_the_simulation(tmp_path: Path, encoding: str, algorithm: str,
                                                    most: float) -> None:
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG.format(encoding=encoding, algorithm=algorithm))
    out = tmp_path / "cluster"
    proc = subprocess.run(
        [sys.executable, "-m", "fedent.cli", "cluster", "up", "--config", str(cfg_path), "--workers", "2",
         "--out", str(out), "--exit-when-done", "--no-dashboard", "--register-timeout", "60",
         "--round-deadline", "60"], cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_json(out / "status.json")["phase"] == "done"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sim = run_simulation(load_config(cfg_path), tmp_path / "sim", progress=False, plots=False)
    finally:
        torch.set_num_threads(threads)
    cluster = load_model_file(out / "model_final.pt").params
    num = max(float((a - b).abs().max()) for a, b in zip(cluster, sim.params, strict=True))
    assert num / max(float(b.abs().max()) for b in sim.params) <= 1e-5
    model_bytes = sum(p.numel() * 4 for p in sim.params)
    for rec in read_metrics(out / "metrics.jsonl"):
        assert "failed_clients" not in rec["diagnostics"]
        assert 0 < rec["diagnostics"]["transfer"]["bytes_up"] <= most * model_bytes * rec["num_clients"]
