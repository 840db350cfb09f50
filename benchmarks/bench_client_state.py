"""Client state written in the background against written in the round (issue 28: host work off the critical path).

A run that checkpoints (every ``fedent reproduce``, ``compare`` and ``tune`` run) keeps each client's state on disk
(FedDyn's λ_i, SCAFFOLD's c_i: a model's size per client), so a resumed run gets the state its clients had. Each
fitted client's state is encoded and written with an fsync; in the round, that is 20 files of a model's size a
round. ``ClientStateStore(background=True)`` (what the simulator uses) copies the state and leaves the encoding and
writing to a writer thread, flushed before each checkpoint. Workload: ``--algorithm`` (default FedDyn) on
MNIST-CNN, the seeded synthetic set, ``--clients`` clients of ``--samples`` samples, ``--fraction`` a round, one
local epoch at batch 32, ``--executor``, checkpoints kept 2, evaluation in the last round only. Both sides run
``run_simulation`` in this process, alternately, ``--repeats`` times; a side's time is the median round wall of
rounds 2.. (round 1 warms up); the final models must be equal (max |difference| printed).

    python benchmarks/bench_client_state.py
    python benchmarks/bench_client_state.py --device cuda --executor vectorised --samples 600
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import fedent.client_store as client_store
from fedent.config import config_from_dict
from fedent.inputs import load_inputs
from fedent.rounds import RoundPolicy
from fedent.sim.simulator import run_simulation


class SyncStore(client_store.ClientStateStore):
    """The store as it was: every save encoded and written in the round."""

    def __init__(self, directory: Any, keep: int = 3, background: bool = False) -> None:
        super().__init__(directory, keep, background=False)


def config(args: argparse.Namespace) -> Any:
    return config_from_dict({
        "name": "bench-client-state", "algorithm": {"name": args.algorithm},
        "data": {"name": "synthetic", "num_clients": args.clients, "partition": "iid",
                 "synthetic_train": args.clients * args.samples, "synthetic_test": 500},
        "model": {"name": "mnist-cnn"},
        "train": {"rounds": args.rounds, "fraction": args.fraction, "local_epochs": 1, "batch_size": 32, "lr": 0.05,
                  "eval_every": args.rounds, "seed": 0, "device": args.device, "executor": args.executor}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="feddyn")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--executor", default="sequential", choices=["sequential", "vectorised"])
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    cfg = config(args)
    inputs = load_inputs(cfg)
    real = client_store.ClientStateStore
    rounds: dict[str, list[float]] = {"in the round": [], "background": []}
    finals: dict[str, list[torch.Tensor]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for side in rounds:
                client_store.ClientStateStore = SyncStore if side == "in the round" else real  # type: ignore[misc]
                try:
                    res = run_simulation(cfg, Path(tmp) / f"{rep}-{side.replace(' ', '-')}", inputs=inputs,
                                         progress=False, plots=False, policy=RoundPolicy(checkpoint_keep=2))
                finally:
                    client_store.ClientStateStore = real  # type: ignore[misc]
                walls = [r["wall_s"] for r in res.records[1:]]
                rounds[side] += walls
                finals[side] = res.params
                print(f"repeat {rep} {side}: rounds 2.. median {statistics.median(walls):.3f} s", file=sys.stderr)
    diff = max(float((a - b).abs().max()) for a, b in zip(finals["in the round"], finals["background"], strict=True))
    base = statistics.median(rounds["in the round"])
    print(f"{args.algorithm}, {args.clients} clients x {args.samples} samples, fraction {args.fraction}, device "
          f"{args.device}, executor {args.executor}, {args.rounds} rounds, repeats {args.repeats}")
    print("| client state | round (s, median of rounds 2..) | speed-up |")
    print("| --- | ---: | ---: |")
    for side, walls in rounds.items():
        m = statistics.median(walls)
        print(f"| {side} | {m:.3f} | {base / m:.2f}x |")
    print(f"max |background - in the round| over the final models: {diff:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds, "max_abs_diff": diff}, indent=1))


if __name__ == "__main__":
    main()
