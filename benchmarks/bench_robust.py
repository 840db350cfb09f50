"""Cost of the robust aggregation rules (fedent.rounds.robust) against the plain weighted mean, in one process.

Two measurements, each rule alternated with the mean in the same run (ratios, docs/security.md):

1. the server step alone: ``robust.apply`` + FedAvg's ``aggregate`` on m uploads of the model's size (seeded
   random updates), median of ``--repeats`` timings;
2. whole simulator rounds: FedAvg on the built-in seeded synthetic dataset (28x28, 10 classes) with the model, 20
   clients, 50% a round, 1 local epoch, batch 32, CPU: the median of the per-round wall times after round 0, over
   ``--reps`` runs of every rule taking turns, and the time spent in the engine's robust step inside those rounds
   (its share of a round: on a loaded machine the round times of different runs drift by more than the rule costs).

``--model``: mnist-cnn (1.66 M parameters, the default) or lenet5 (61,706: the robust profile's model).

    .venv/bin/python benchmarks/bench_robust.py [--model mnist-cnn --clients 20 --repeats 5 --rounds 3 --reps 2
                                                 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fedent.config import RobustConfig, config_from_dict
from fedent.models import build_model
from fedent.rounds import robust
from fedent.sim.simulator import run_simulation
from fedent.strategies.base import ClientUpdate
from fedent.strategies.fedavg import FedAvg

RULES: dict[str, dict[str, Any]] = {
    "mean": {},
    "median": {"aggregator": "median"},
    "trimmed-mean": {"aggregator": "trimmed-mean"},
    "krum": {"aggregator": "krum"},
    "multi-krum": {"aggregator": "multi-krum"},
    "clip": {"clip_norm": 1.0},
}


def server_step(clients: int, repeats: int, model: str = "mnist-cnn") -> dict[str, float]:
    """Median seconds of one server step per rule (robust pre-step + FedAvg's weighted mean)."""
    torch.manual_seed(0)
    w = [p.detach().clone() for p in build_model(model, 10, 1, 28, seed=0).parameters()]
    ups = [ClientUpdate(c, [p + 0.01 * torch.randn_like(p) for p in w], 30 + c, 0.1) for c in range(clients)]
    strategy = FedAvg()
    times: dict[str, list[float]] = {k: [] for k in RULES}
    for _ in range(repeats + 1):  # the first pass warms up and is dropped
        for name, opts in RULES.items():
            cfg = RobustConfig(**opts)
            t0 = time.perf_counter()
            got, _ = robust.apply(cfg, w, ups)
            strategy.aggregate(0, w, got)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def rounds(n_rounds: int, model: str = "mnist-cnn", reps: int = 2) -> dict[str, dict[str, float]]:
    """Per rule, over ``reps`` runs of every rule (taking turns, the order reversed every other repetition, so a
    load that drifts on a shared machine falls on all of them alike): ``round_s``, the median seconds per simulator
    round after each run's round 0, and ``step_s``, the seconds a round spends in the engine's ``robust.apply``
    (timed inside those same rounds): the rule's own share of a round, which the load cannot fake."""
    walls: dict[str, list[float]] = {k: [] for k in RULES}
    steps: dict[str, list[float]] = {k: [] for k in RULES}
    inner = robust.apply
    spent: list[float] = []

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent.append(time.perf_counter() - t0)

    robust.apply = timed  # type: ignore[assignment]  # the engine calls robust.apply through the module
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(reps):
                for name in (list(RULES) if rep % 2 == 0 else list(reversed(RULES))):
                    cfg = config_from_dict({
                        "name": f"bench-{name}", "model": {"name": model},
                        "data": {"name": "synthetic", "num_clients": 20, "partition": "iid", "synthetic_train": 2000,
                                 "synthetic_test": 200},
                        "train": {"rounds": n_rounds, "fraction": 0.5, "local_epochs": 1, "batch_size": 32,
                                  "lr": 0.01, "device": "cpu", "seed": 0},
                        "algorithm": {"name": "fedavg"}, "robust": RULES[name]})
                    spent.clear()
                    res = run_simulation(cfg, Path(tmp) / f"{name}-{rep}", progress=False, plots=False)
                    walls[name] += [float(r["wall_s"]) for r in (res.records[1:] or res.records)]
                    steps[name] += spent[1:] or spent
    finally:
        robust.apply = inner  # type: ignore[assignment]
    return {k: {"round_s": statistics.median(walls[k]), "step_s": statistics.median(steps[k]) if steps[k] else 0.0}
            for k in RULES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mnist-cnn", choices=("mnist-cnn", "lenet5"))
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2, help="runs of every rule for the round times, taking turns")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    step = server_step(args.clients, args.repeats, args.model)
    per_round = rounds(args.rounds, args.model, args.reps)
    print(f"server step, {args.clients} {args.model} uploads (median of {args.repeats}); simulator round (20 clients, "
          f"10 a round, median after round 0 of {args.rounds}, {args.reps} runs each, taking turns) and the robust "
          "step inside it:")
    print(f"{'rule':<14}{'step ms':>10}{'x mean':>8}{'round s':>10}{'x mean':>8}{'in-round step s':>17}{'share':>8}")
    base = per_round["mean"]["round_s"]
    for k in RULES:
        r = per_round[k]
        print(f"{k:<14}{1e3 * step[k]:>10.2f}{step[k] / step['mean']:>8.2f}{r['round_s']:>10.3f}"
              f"{r['round_s'] / base:>8.2f}{r['step_s']:>17.3f}{r['step_s'] / r['round_s']:>8.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "server_step_s": step, "round_s": per_round},
                                              indent=1))


if __name__ == "__main__":
    main()
