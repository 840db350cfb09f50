"""Cost of Algorithm 1 (offline mean-field fixed point) relative to one round of local training.

Same model and clients for both: MNIST-CNN (fedent.models.build_model, else a small CNN) on seeded
synthetic 28x28 tensors, 20 clients, batch 32, 1 local epoch. Also times the vectorised Prop. 1 solver
and the online fixed point on 10,000 clients. Runs in well under 2 minutes on 2 CPU cores:

    .venv/bin/python benchmarks/bench_fixed_point.py [--rounds 3 --max-sweeps 5 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from fedent.meanfield.fixed_point import solve_fixed_point
from fedent.meanfield.lr import solve_eta
from fedent.meanfield.oracle import TrainerOracle
from fedent.meanfield.scalar_fixed_point import solve_online
from fedent.params import clone
from fedent.rng import torch_generator
from fedent.trainer import LocalTrainer


def _model(seed: int) -> tuple[nn.Module, str]:
    try:
        from fedent.models import build_model

        return build_model("mnist-cnn", 10, 1, 28, seed=seed), "mnist-cnn (fedent.models)"
    except (ImportError, ValueError, TypeError):
        torch.manual_seed(seed)
        small = nn.Sequential(
            nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10),
        )
        return small, "small CNN fallback"


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--samples-per-client", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="horizon T of Algorithm 1")
    ap.add_argument("--max-sweeps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    n, per = args.clients, args.samples_per_client
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n * per, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (n * per,), generator=gen)
    model, model_name = _model(0)
    trainer = LocalTrainer(model, x, y, args.batch_size, torch.device("cpu"))
    indices = [torch.arange(i * per, (i + 1) * per) for i in range(n)]
    w0 = clone(trainer.params)

    # One round of local training: every client, E epochs at a fixed rate (what FedAvg/FedEnt do per round).
    t0 = time.perf_counter()
    for cid in range(n):
        trainer.load(w0)
        trainer.train(indices[cid], 0.01, args.epochs, torch_generator(0, "train", 0, cid))
    round_s = time.perf_counter() - t0

    oracle = TrainerOracle(trainer, indices, seed=0, batch_size=args.batch_size)
    t0 = time.perf_counter()
    res = solve_fixed_point(oracle, w0, list(range(n)), [1.0 / n] * n, args.rounds, 0.99, max_sweeps=args.max_sweeps)
    fp_s = time.perf_counter() - t0
    rep = res.report

    rng = np.random.default_rng(0)
    big = 10_000
    w = rng.normal(size=50)
    g = rng.normal(size=(big, 50)) * rng.uniform(0.01, 10, size=(big, 1))
    a, b, c = g @ w, (g * g).sum(1), float(w @ w)
    th = rng.dirichlet(np.ones(big))
    lr_s = _median_time(lambda: solve_eta(a, b, c, th, 0.8 * c, 0.99), 20)
    online_s = _median_time(lambda: solve_online(c, th, a, b, 0.99), 5)
    online = solve_online(c, th, a, b, 0.99)

    out = {
        "model": model_name,
        "clients": n,
        "samples_per_client": per,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "threads": args.threads,
        "round_training_s": round_s,
        "fixed_point_s": fp_s,
        "fixed_point_over_round": fp_s / round_s,
        "horizon_T": args.rounds,
        "sweeps": rep.sweeps,
        "stop_reason": rep.stop_reason,
        "gradient_evaluations": rep.gradient_evaluations,
        "eta_star_positive": int(np.count_nonzero(res.eta_star)),
        "eta_star_total": int(res.eta_star.size),
        "per_sweep_over_round": fp_s / rep.sweeps / round_s,
        "lr_solve_10k_ms": lr_s * 1e3,
        "online_fixed_point_10k_ms": online_s * 1e3,
        "online_G_evaluations": online.iterations,
    }
    print(f"model: {model_name}; {n} clients x {per} samples, batch {args.batch_size}, {args.epochs} epoch(s)")
    print(f"one round of local training:         {round_s:8.3f} s")
    print(f"Algorithm 1 (T={args.rounds}, {rep.sweeps} sweeps, {rep.stop_reason}, "
          f"{rep.gradient_evaluations} grads): {fp_s:8.3f} s")
    print(f"clients x steps with eta* > 0 in the last sweep: {out['eta_star_positive']} of {out['eta_star_total']}")
    print(f"ratio fixed point / round:           {fp_s / round_s:8.3f}  (per sweep: {out['per_sweep_over_round']:.3f})")
    print(f"Prop. 1 solver, 10,000 clients:      {lr_s * 1e3:8.3f} ms (median of 20)")
    print(f"online fixed point, 10,000 clients:  {online_s * 1e3:8.3f} ms ({online.iterations} G evaluations)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
