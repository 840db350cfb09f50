"""Worker-local data with real processes on loopback (issue 14).

The simulator's partition is written to per-client files; a cluster whose workers read only those files
(``fedent cluster up --worker-data DIR``, ``data.placement: workers``; the aggregator reads no training data)
reproduces the simulation to 1e-5 for FedAvg and FedEnt, with server-side and federated evaluation. A worker
whose local data does not fit the model is refused with one line while the run goes on with the others.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedent.config import load_config
from fedent.data.local import export_partition
from fedent.inputs import load_inputs
from fedent.model_file import load_model_file
from fedent.runlog import read_json, read_metrics
from fedent.sim.simulator import run_simulation

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
CONFIG = """\
name: local
data: {{name: synthetic, num_clients: 4, partition: dirichlet, dirichlet_flavour: class, alpha: 0.5, min_samples: 10,
        synthetic_train: 160, synthetic_test: 60}}
model: {{name: mnist-cnn}}
train: {{rounds: 3, fraction: 0.5, local_epochs: 1, batch_size: 20, lr: 0.05, seed: 7, device: cpu,
         evaluation: {evaluation}}}
algorithm: {{name: {algorithm}}}
"""


def _max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)) / max(float(y.abs().max()) for y in b)


def _export(cfg_path: Path, out: Path) -> list[int]:
    cfg = load_config(cfg_path)
    inputs = load_inputs(cfg)
    d = inputs.data
    export_partition(d.x_train, d.y_train, d.x_test, d.y_test, inputs.client_indices, cfg.train.seed, out)
    return inputs.client_sizes()


@pytest.mark.parametrize(("algorithm", "evaluation"), [("fedavg", "federated"), ("fedent", "server")])
def test_cluster_on_worker_files_equals_simulation(tmp_path: Path, algorithm: str, evaluation: str) -> None:
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG.format(algorithm=algorithm, evaluation=evaluation))
    sizes = _export(cfg_path, tmp_path / "clients")
    assert len(set(sizes)) > 1, "unequal client sizes, so θ_i must come from the reported counts"
    out = tmp_path / "cluster"
    proc = subprocess.run(
        [sys.executable, "-m", "fedent.cli", "cluster", "up", "--config", str(cfg_path), "--set",
         "data.placement=workers", "--worker-data", str(tmp_path / "clients"), "--workers", "2", "--out", str(out),
         "--exit-when-done", "--no-dashboard", "--insecure", "--register-timeout", "60", "--round-deadline", "60"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sim = run_simulation(load_config(cfg_path), tmp_path / "sim", progress=False, plots=False)
    assert _max_rel(load_model_file(out / "model_final.pt").params, sim.params) <= 1e-5
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["clients"] for r in recs] == [r["clients"] for r in sim.records]
    assert recs[-1]["test_acc"] == pytest.approx(sim.records[-1]["test_acc"], abs=1e-9)
    assert recs[-1]["diagnostics"]["evaluation"]["mode"] == evaluation
    assert sim.records[-1]["diagnostics"]["evaluation"]["mode"] == evaluation
    assert read_json(out / "status.json")["state"]["evaluation"] == evaluation
    part = read_json(out / "partition.json")
    assert part["scheme"] == "worker-local" and part["sizes"] == sizes
    rows = read_json(out / "clients.json")["clients"]
    assert [r["samples"] for r in rows] == sizes
    assert all(r["data_source"].endswith(f"client-{r['cid']}/train.npz") for r in rows)
    assert [sum(r["label_counts"]) for r in rows] == sizes


def test_bad_local_data_is_refused_and_the_run_goes_on(tmp_path: Path) -> None:
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(CONFIG.format(algorithm="fedavg", evaluation="federated")
                        .replace("rounds: 3", "rounds: 1").replace("fraction: 0.5", "fraction: 1.0")
                        + "out_dir: runs\n")
    _export(cfg_path, tmp_path / "good")
    bad = tmp_path / "bad"
    for cid in (2, 3):  # 8x8 images for a model that takes 1x28x28
        (bad / f"client-{cid}").mkdir(parents=True)
        np.savez(bad / f"client-{cid}" / "train.npz", x=np.zeros((5, 1, 8, 8), np.float32), y=np.zeros(5, np.int64))
    out, port_file = tmp_path / "run", tmp_path / "port"
    agg = subprocess.Popen(
        [sys.executable, "-m", "server", "--config", str(cfg_path), "--set", "data.placement=workers", "--insecure",
         "--port", "0", "--port-file", str(port_file), "--out", str(out), "--register-timeout", "120",
         "--round-deadline", "60", "--heartbeat", "0.5"],
        cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = [agg]
    try:
        import time

        end = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < end and agg.poll() is None, "the aggregator did not start"
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text().strip()}"

        def worker(clients: str, data: Path) -> subprocess.Popen[str]:
            p = subprocess.Popen([sys.executable, "-m", "client", "--aggregator", address, "--clients", clients,
                                  "--insecure", "--device", "cpu", "--data", str(data), "--log-level", "WARNING"],
                                 cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            started.append(p)
            return p

        good = worker("0-1", tmp_path / "good")
        refused = worker("2-3", bad)
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 2
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "local data refused" in lines[0] and "(1, 28, 28)" in lines[0], err
        assert agg.poll() is None, "the aggregator must keep running"
        rows = {r["cid"]: r for r in read_json(out / "clients.json")["clients"]}
        assert rows[2]["state"] == "refused" and "model takes" in rows[2]["data_source"]
        fixed = worker("2-3", tmp_path / "good")
        assert agg.wait(timeout=180) == 0, agg.stderr.read()[-2000:] if agg.stderr else ""
        assert good.wait(timeout=30) == 0 and fixed.wait(timeout=30) == 0
        assert read_json(out / "status.json")["phase"] == "done"
        assert read_metrics(out / "metrics.jsonl")[0]["num_clients"] == 4
    finally:
        for p in started:  # only the processes this test started
            if p.poll() is None:
                p.kill()
            p.wait(10)
