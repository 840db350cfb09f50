"""Load: 200 clients on 40 workers register at once, 20 rounds of FedAvg on a linear model over real gRPC.

Checks that no update is lost (every sampled client of every round is aggregated, the clients' participation
counts add up) and that the process's memory does not grow with the rounds: the model (2048x64 floats,
0.5 MB) is large enough that keeping one round's blobs or updates alive (~10 MB per round) would break the
bound between round 5 and the end, while allocator noise stays far below it. The aggregator runs in this
process (its RSS is what is measured, together with the in-thread workers'), the workers in threads.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import numpy as np
import torch
from conftest import TinyData, tiny_config
from torch import nn

from client.settings import WorkerSettings
from client.worker import Worker
from fedent.inputs import RunInputs
from fedent.rng import sample_clients
from fedent.runlog import read_json, read_metrics
from server.app import start_aggregator
from server.settings import AggregatorSettings

CLIENTS, PER_WORKER, ROUNDS, FEATURES = 200, 5, 20, 2048
LEAK_BOUND_MB = 60.0  # a leak of one round's 20 updates is ~10 MB per round, 150 MB over 15 rounds


def wide_inputs(num_clients: int, per_client: int = 4, features: int = FEATURES) -> RunInputs:
    g = torch.Generator().manual_seed(5)
    n = num_clients * per_client
    x = torch.randn(n + 20, features, generator=g)
    y = torch.randint(0, 64, (n + 20,), generator=g)
    idx = [np.arange(c * per_client, (c + 1) * per_client, dtype=np.int64) for c in range(num_clients)]
    md5 = hashlib.md5(b"".join(i.tobytes() for i in idx)).hexdigest()

    def make_model() -> nn.Module:
        m = nn.Linear(features, 64)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(6)) * 0.01)
        return m

    return RunInputs(data=TinyData(x[:n], y[:n], x[n:], y[n:], 64), client_indices=tuple(idx),
                     make_model=make_model, partition_info={"md5": md5, "num_clients": num_clients})


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_200_clients_20_rounds_no_lost_updates_and_bounded_memory(tmp_path: Path) -> None:
    inputs = wide_inputs(CLIENTS)
    cfg = tiny_config("fedavg", num_clients=CLIENTS, rounds=ROUNDS, fraction=0.1, batch_size=4, eval_every=100)
    settings = AggregatorSettings(register_timeout_s=60, round_deadline_s=60, quorum=1.0, checkpoint_keep=0)
    h = start_aggregator(cfg, settings, tmp_path / "run", inputs=inputs)
    try:
        groups = [tuple(range(i, i + PER_WORKER)) for i in range(0, CLIENTS, PER_WORKER)]
        workers = [Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=g, device="cpu",
                                         connect_timeout_s=30, name=f"load{g[0]}"), inputs=inputs) for g in groups]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        t0 = time.monotonic()
        for t in threads:  # all at once
            t.start()
        metrics = tmp_path / "run" / "metrics.jsonl"
        rss_at_5 = None
        while not h.run.finished.is_set():
            if rss_at_5 is None and metrics.exists() and len(read_metrics(metrics)) >= 5:
                rss_at_5 = rss_mb()
            time.sleep(0.005)
        assert h.wait(1) and h.run.error is None, h.run.error
        rss_end = rss_mb()
        elapsed = time.monotonic() - t0
        for t in threads:
            t.join(10)
    finally:
        h.stop(grace_s=0.5)
    recs = read_metrics(metrics)
    assert [r["round"] for r in recs] == list(range(1, ROUNDS + 1))
    for r in recs:  # every sampled client's update was aggregated, in every round
        assert r["clients"] == sample_clients(cfg.train.seed, r["round"] - 1, CLIENTS, 0.1)  # rounds are 1..R
        assert r["num_clients"] == 20 and "skipped" not in r["diagnostics"] and "failed_clients" not in r["diagnostics"]
    clients = read_json(tmp_path / "run" / "clients.json")["clients"]
    assert sum(c["participation"] for c in clients) == 20 * ROUNDS
    assert sum(w.tasks_done for w in workers) >= ROUNDS  # fits really ran on the workers
    assert rss_at_5 is not None
    growth = rss_end - rss_at_5
    print(f"load: {CLIENTS} clients, {ROUNDS} rounds in {elapsed:.1f}s; RSS {rss_at_5:.0f} MB after round 5, "
          f"{rss_end:.0f} MB at the end (+{growth:.1f} MB)")
    assert growth < LEAK_BOUND_MB, f"RSS grew {growth:.1f} MB from round 5 to round {ROUNDS}"
