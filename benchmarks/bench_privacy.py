"""The per-round cost of differential privacy: central DP and local DP-SGD against the same run without DP.

Workload: bench_simulator.py's (MNIST-CNN on Fashion-MNIST from the system copy, pathological partition, 100
clients, 20 per round, 1 local epoch, batch 32, CPU), FedAvg, in the simulator. Four configs differ only in
``privacy`` and the executor: none; ``dp: central`` (clip each update, noise on the sum: server-side work on 20
model-sized vectors, plus the accountant); ``dp: local`` (DP-SGD: per-sample gradients by vmap(grad), clipping
and noise in every step on every client) on the sequential executor, and the same on the vectorised executor
(``local-vec``: the round's clients' DP-SGD steps in one vmap over clients of the per-sample vmap). They
alternate in one process, ``--repeats`` times, timed by bench_simulator's ``sim_round_times`` (the difference of
the clocks at consecutive metrics.jsonl lines); round 0 (warm-up: for central DP it also computes the
sampled-without-replacement RDP curve once, ~1 s) and the last round (the only evaluation) are not timed.
Medians of process CPU time and wall time, the ratios to the plain run, and local-vec's ratio to local, are
printed.

    python benchmarks/bench_privacy.py --quick --rounds 3 --threads 1
    python benchmarks/bench_privacy.py --quick --rounds 2 --threads 1 --modes local,local-vec
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import torch
from bench_simulator import BATCH, EPOCHS, FRACTION, LR, NUM_CLIENTS, SEED, Timing, make_inputs, sim_round_times

from fedent.config import ExperimentConfig, config_from_dict
from fedent.inputs import RunInputs

LOCAL = {"dp": "local", "noise_multiplier": 1.0, "clip_norm": 1.0}
MODES: dict[str, dict[str, Any]] = {  # mode -> its privacy section, and the executor it runs on
    "plain": {},
    "central": {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0},
    "local": LOCAL,
    "local-vec": LOCAL,  # local DP on the vectorised executor (all 20 clients' DP-SGD steps in one vmapped step)
}
EXECUTOR = {"local-vec": "vectorised"}


def config(mode: str, rounds: int, device: str) -> ExperimentConfig:
    raw: dict[str, Any] = {
        "name": "bench-privacy", "data": {"name": "fashion-mnist", "num_clients": NUM_CLIENTS,
                                          "partition": "pathological"},
        "train": {"rounds": rounds, "fraction": FRACTION, "local_epochs": EPOCHS, "batch_size": BATCH, "lr": LR,
                  "eval_every": 10_000, "seed": SEED, "device": device,
                  "executor": EXECUTOR.get(mode, "sequential")},
        "algorithm": {"name": "fedavg"},
    }
    if MODES[mode]:
        raw["privacy"] = MODES[mode]
    return config_from_dict(raw)


def round_times(inputs: RunInputs, mode: str, rounds: int, device: str) -> list[Timing]:
    """Per-round (wall, cpu) seconds of rounds 1..rounds-2: bench_simulator's harness, round 0 (warm-up) dropped."""
    times, _ = sim_round_times(inputs, "fedavg", rounds, device, cfg=config(mode, rounds, device))
    return times[1:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (plus one warm-up and one eval round)")
    ap.add_argument("--quick", action="store_true", help="12,000 training samples instead of 60,000")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--modes", default=",".join(MODES),
                    help="which of plain,central,local,local-vec (plain always runs)")
    args = ap.parse_args(argv)
    modes = ["plain", *(m for m in args.modes.split(",") if m in MODES and m != "plain")]
    if args.threads:
        torch.set_num_threads(args.threads)
    inputs = make_inputs(12_000 if args.quick else None, args.data_root)
    per: dict[str, list[Timing]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:  # alternating: the machine's drift hits all of them alike
            per[mode] += round_times(inputs, mode, args.rounds + 2, args.device)
    med = {m: Timing(statistics.median(t.wall for t in ts), statistics.median(t.cpu for t in ts))
           for m, ts in per.items()}
    print(f"per-round medians over {args.rounds} timed rounds x {args.repeats} repeats "
          f"({'12,000' if args.quick else '60,000'} samples, {torch.get_num_threads()} threads, {args.device}):")
    for m, t in med.items():
        print(f"  {m:8s} wall {t.wall:7.3f} s  cpu {t.cpu:7.3f} s  ratio to plain: wall "
              f"{t.wall / med['plain'].wall:5.2f}x  cpu {t.cpu / med['plain'].cpu:5.2f}x")
    if "local" in med and "local-vec" in med:
        vec, seq = med["local-vec"], med["local"]
        print(f"  local DP, vectorised / sequential executor: wall {vec.wall / seq.wall:5.2f}x  "
              f"cpu {vec.cpu / seq.cpu:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
