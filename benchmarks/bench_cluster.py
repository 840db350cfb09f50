"""The cluster's round time as a ratio to the in-process simulator on the same workload (goal <= 1.15x).

Both run the same config and seed: the simulator in this process, the cluster as ``fedent cluster up``
would (aggregator in this process, N worker processes on loopback). The round time is the median of
the metrics' ``wall_s`` over rounds 1..T-1 (round 0 pays one-off warm-up costs in both). The final
models are compared too, so a fast but wrong cluster cannot pass.

    .venv/bin/python benchmarks/bench_cluster.py --rounds 6 --workers 2
    .venv/bin/python benchmarks/bench_cluster.py --executor vectorised --device cuda   # GPU workers, vmapped

``--executor`` is ``train.executor``: the simulator runs it, and ``fedent cluster up`` hands it to every
worker (``python -m client --executor``), so the two sides run the same client code either way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fedent.config import config_from_dict  # noqa: E402
from fedent.model_file import load_model_file  # noqa: E402
from fedent.runlog import read_metrics  # noqa: E402
from fedent.sim.simulator import run_simulation  # noqa: E402
from server.launcher import Cluster, LaunchSettings  # noqa: E402
from server.settings import AggregatorSettings  # noqa: E402


def workload(args: argparse.Namespace) -> dict[str, object]:
    return {
        "name": "bench-cluster",
        "data": {"name": args.dataset, "num_clients": args.clients, "partition": "iid",
                 "synthetic_train": args.train_samples, "synthetic_test": 500,
                 "max_train_samples": args.train_samples if args.dataset != "synthetic" else None,
                 "max_test_samples": 500 if args.dataset != "synthetic" else None},
        "model": {"name": "mnist-cnn"},
        "train": {"rounds": args.rounds, "fraction": args.fraction, "local_epochs": args.epochs, "batch_size": 32,
                  "lr": 0.05, "seed": 0, "device": args.device, "executor": args.executor},
        "algorithm": {"name": args.algorithm},
    }


def median_round(run_dir: Path) -> float:
    walls = [r["wall_s"] for r in read_metrics(run_dir / "metrics.jsonl")]
    return statistics.median(walls[1:] if len(walls) > 1 else walls)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", default="fedavg")
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--train-samples", type=int, default=3000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--executor", choices=("auto", "sequential", "vectorised"), default="auto",
                   help="how the simulator and every worker train a round's clients (train.executor)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the simulator and for each worker (default: torch's default for the "
                        "simulator, cores / workers for each worker); equal threads isolate the protocol overhead")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the worker processes
    cfg = config_from_dict(workload(args))
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        t0 = time.perf_counter()
        sim = run_simulation(cfg, Path(tmp) / "sim", progress=False, plots=False)
        sim_total = time.perf_counter() - t0
        cluster = Cluster(cfg, Path(tmp) / "cluster", LaunchSettings(workers=args.workers, device=args.device,
                                                                      dashboard=False, quiet_children=True))
        t0 = time.perf_counter()
        cluster.start(AggregatorSettings(register_timeout_s=300, round_deadline_s=600))
        try:
            if not cluster.wait():
                print(f"cluster run failed: {cluster.aggregator.run.error if cluster.aggregator else '?'}")
                return 1
        finally:
            run_dir = cluster.run_dir
            cluster.stop()
        cluster_total = time.perf_counter() - t0
        sim_round, cl_round = median_round(Path(tmp) / "sim"), median_round(run_dir)
        got = load_model_file(run_dir / "model_final.pt").params
        rel = max(float((a - b).abs().max()) for a, b in zip(got, sim.params, strict=True)) / max(
            float(b.abs().max()) for b in sim.params)
    result = {
        "algorithm": args.algorithm, "clients": args.clients, "fraction": args.fraction, "workers": args.workers,
        "rounds": args.rounds, "device": args.device, "executor": args.executor,
        "threads": args.threads or "default",
        "sim_round_s": round(sim_round, 4),
        "cluster_round_s": round(cl_round, 4), "ratio": round(cl_round / sim_round, 3),
        "sim_total_s": round(sim_total, 2), "cluster_total_s": round(cluster_total, 2),
        "max_rel_diff_final_model": rel,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
