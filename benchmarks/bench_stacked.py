"""K runs of one setting stacked in one vectorised step (``fedent reproduce --stack K``) against the same K runs
one after another in the same process.

Issue 28's lever "several runs of one setting stacked in one process": on a GPU one run's round leaves most of
the card idle, so K runs whose clients train in one step should take far less than K times one run. Workload:
MNIST-CNN on the seeded synthetic set (MNIST-shaped), ``--clients`` clients with ``--samples`` samples each,
``--fraction`` of them per round, one local epoch at batch 32, the vectorised executor, evaluation in the last
round only. The K runs are a tuning grid: ``--algorithm`` at K rates (``--lrs``), one seed, so they share the
data (runs of other seeds share it too when the dataset is not subsampled by seed, as in the ``full`` profile).
Both sides call ``fedent.sim.simulator.run_simulation`` in this process (stacked: one thread per run and a
``TrainerStack``), so data loading, model set-up and every round's host work count; round 1 is warm-up (CUDA
graph capture, cuDNN) for both and is reported apart. The sides alternate ``--repeats`` times; the table gives
median wall times, client SGD steps per second and the largest |difference| between a run's stacked and one-by-one
final models (they must agree within 1e-5).

    python benchmarks/bench_stacked.py                                  # CPU, K = 4
    python benchmarks/bench_stacked.py --device cuda --precision tf32 --clients 100 --fraction 0.2 --samples 600 \
        --lrs 0.01,0.02,0.05,0.1,0.2,0.5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from fedent.config import config_from_dict
from fedent.inputs import load_inputs
from fedent.rounds.stacking import TrainerStack
from fedent.sim.simulator import SimResult, run_simulation


def config(args: argparse.Namespace, lr: float) -> Any:
    return config_from_dict({
        "name": "bench-stacked", "algorithm": {"name": args.algorithm},
        "data": {"name": "synthetic", "num_clients": args.clients, "partition": "iid",
                 "synthetic_train": args.clients * args.samples, "synthetic_test": 500},
        "model": {"name": "mnist-cnn"},
        "train": {"rounds": args.rounds, "fraction": args.fraction, "local_epochs": 1, "batch_size": 32, "lr": lr,
                  "eval_every": args.rounds, "seed": 0, "device": args.device, "executor": "vectorised",
                  "precision": args.precision}})


def side(args: argparse.Namespace, lrs: list[float], out: Path, stacked: bool) -> tuple[float, list[SimResult]]:
    """The K runs one by one, or stacked in threads; the wall time of the whole side and each run's result."""
    cfgs = [config(args, lr) for lr in lrs]
    t0 = time.perf_counter()
    if not stacked:
        res = [run_simulation(c, out / f"alone-{k}", inputs=load_inputs(c), progress=False, plots=False)
               for k, c in enumerate(cfgs)]
        return time.perf_counter() - t0, res
    stack = TrainerStack(len(cfgs))
    got: list[Any] = [None] * len(cfgs)

    def one(k: int) -> None:
        seat = stack.seats()[k]
        try:
            got[k] = run_simulation(cfgs[k], out / f"stacked-{k}", inputs=load_inputs(cfgs[k]), progress=False,
                                    plots=False, seat=seat)
        except BaseException as e:  # noqa: BLE001 - reported below
            got[k] = e
            seat.leave()

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(cfgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for g in got:
        if not isinstance(g, SimResult):
            raise SystemExit(f"a stacked run failed: {g!r}")
    print(f"  stack: {stack.merged_calls} calls ran merged, {stack.steps} merged steps", file=sys.stderr)
    return wall, got


def rounds_after_warmup(res: list[SimResult]) -> float:
    """The runs' round walls after round 1, summed over rounds, max over runs (stacked runs overlap in time)."""
    return max(sum(r["wall_s"] for r in x.records[1:]) for x in res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="fedavg")
    ap.add_argument("--lrs", default="0.02,0.05,0.1,0.2", help="one run per rate: K = their number")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="float32", choices=["float32", "tf32"])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lrs = [float(x) for x in args.lrs.split(",")]
    steps_per_run = args.rounds * round(args.clients * args.fraction) * -(-args.samples // 32)
    walls: dict[str, list[float]] = {"one by one": [], "stacked": []}
    timed: dict[str, list[float]] = {"one by one": [], "stacked": []}
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            results = {}
            for name, stacked in (("one by one", False), ("stacked", True)):
                wall, res = side(args, lrs, Path(tmp) / f"{rep}-{name.replace(' ', '')}", stacked)
                walls[name].append(wall)
                timed[name].append(sum(sum(r["wall_s"] for r in x.records[1:]) for x in res) if not stacked
                                   else rounds_after_warmup(res))
                results[name] = res
                print(f"repeat {rep} {name}: {wall:.2f} s", file=sys.stderr)
            for a, b in zip(results["one by one"], results["stacked"], strict=True):
                worst = max(worst, max(float((x - y).abs().max()) for x, y in zip(a.params, b.params, strict=True)))
    rows = []
    for name in walls:
        w, t = statistics.median(walls[name]), statistics.median(timed[name])
        rows.append({"side": name, "runs": len(lrs), "wall_s": w, "rounds_after_first_s": t,
                     "client_steps_per_s": len(lrs) * steps_per_run / w})
    base = rows[0]["wall_s"]
    print(f"device {args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
          + f", {args.algorithm} at {len(lrs)} rates, {args.clients} clients x {args.samples} samples, fraction "
          f"{args.fraction}, {args.rounds} rounds, repeats {args.repeats}")
    print("| side | K | wall (s, median) | rounds 2.. (s) | client steps/s | speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['side']} | {r['runs']} | {r['wall_s']:.2f} | {r['rounds_after_first_s']:.2f} | "
              f"{r['client_steps_per_s']:.0f} | {base / r['wall_s']:.2f}x |")
    print(f"max |stacked - one by one| over the final models: {worst:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "max_abs_diff": worst}, indent=1))


if __name__ == "__main__":
    main()
