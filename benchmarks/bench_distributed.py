"""A round of 100 clients over P processes (``fedent simulate --procs P``) against the same round in one process.

Issue 28's goal: P processes scale at least 0.8·P (speed-up of the round time over P = 1). Workload: MNIST-CNN
on the seeded synthetic set (MNIST-shaped), ``--clients`` clients all sampled every round (fraction 1), each
with ``--samples`` samples, one local epoch at batch 32, sequential host, evaluation only in the last round.
Each side is a real ``fedent simulate`` command (P = 1: one process, ``--threads T``; P > 1: ``--procs P``, each
rank ``--threads T``), so process start-up, the all-gathers of the updates and rank 0's files all count. A round's
time is metrics.jsonl's ``wall_s``; round 0 (warm-up) and the last round (evaluation) are not timed. The sides
alternate ``--repeats`` times; medians are reported, with the largest |difference| between the final models
(the runs must agree within 1e-5), and the share of rank 0's run time spent in the all-gathers (status.json's
``gather_s``: moving the updates, and waiting for the slower rank).

    python benchmarks/bench_distributed.py                      # P = 1 vs P = 2 on the CPU
    python benchmarks/bench_distributed.py --procs 1,2,4 --device cuda   # on a machine with several GPUs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from fedent.model_file import load_model_file

ROOT = Path(__file__).resolve().parents[1]


def config(path: Path, clients: int, samples: int, rounds: int, device: str) -> Path:
    path.write_text(
        "name: bench-distributed\n"
        f"data: {{name: synthetic, num_clients: {clients}, partition: iid, synthetic_train: {clients * samples}, "
        "synthetic_test: 500}\n"
        "model: {name: mnist-cnn}\n"
        f"train: {{rounds: {rounds}, fraction: 1.0, local_epochs: 1, batch_size: 32, lr: 0.05, "
        f"eval_every: {rounds}, seed: 0, device: {device}, executor: sequential}}\n"
        "algorithm: {name: fedavg}\n")
    return path


def run(cfg: Path, out: Path, run_id: str, procs: int,
        threads: int) -> tuple[list[float], list[torch.Tensor], float]:
    cmd = [sys.executable, "-m", "fedent", "simulate", "--config", str(cfg), "--out", str(out), "--run-id", run_id,
           "--threads", str(threads), "--no-plots", "--no-progress", "--checkpoint-keep", "0"]
    if procs > 1:
        cmd += ["--procs", str(procs)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    recs = [json.loads(ln) for ln in (out / run_id / "metrics.jsonl").read_text().splitlines()]
    state = json.loads((out / run_id / "status.json").read_text())["state"]
    gather_share = float(state.get("gather_s", 0.0)) / max(sum(r["wall_s"] for r in recs), 1e-9)
    return [r["wall_s"] for r in recs[1:-1]], load_model_file(out / run_id / "model_final.pt").params, gather_share


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", default="1,2", help="comma-separated process counts; the first is the baseline")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--samples", type=int, default=60, help="samples per client")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run (the first and last are not timed)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    counts = [int(p) for p in args.procs.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as tmp:
        out = Path(tmp)
        cfg = config(out / "c.yaml", args.clients, args.samples, args.rounds, args.device)
        times: dict[int, list[float]] = {p: [] for p in counts}
        models: dict[int, list[torch.Tensor]] = {}
        gathers: dict[int, list[float]] = {p: [] for p in counts}
        for rep in range(args.repeats):
            for p in counts:
                t, models[p], g = run(cfg, out, f"p{p}-r{rep}", p, args.threads)
                times[p] += t
                gathers[p].append(g)
                print(f"repeat {rep}: P={p} rounds {', '.join(f'{x:.2f}' for x in t)} s", flush=True)
    base = statistics.median(times[counts[0]])
    rows = []
    print(f"\n{args.clients} clients x {args.samples} samples, MNIST-CNN, {args.device}, {args.threads} thread(s) "
          f"per process, {torch.get_num_threads()} here")
    print(f"| P | round (s, median) | speed-up | speed-up / P | rank 0 in all-gathers | max abs diff vs P={counts[0]} "
          "|")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in counts:
        med = statistics.median(times[p])
        diff = max(float((a - b).abs().max()) for a, b in zip(models[counts[0]], models[p], strict=True))
        share = statistics.median(gathers[p])
        rows.append({"procs": p, "round_s": med, "speedup": base / med, "efficiency": base / med / p * counts[0],
                     "gather_share": share, "max_abs_diff": diff})
        print(f"| {p} | {med:.2f} | {base / med:.2f}x | {base / med / p * counts[0]:.2f} | {100 * share:.0f}% | "
              f"{diff:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
