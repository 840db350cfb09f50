"""The per-round cost of differential privacy: central DP and local DP-SGD against the same run without DP.

Workload: bench_simulator.py's (MNIST-CNN on Fashion-MNIST from the system copy, pathological partition, 100
clients, 20 per round, 1 local epoch, batch 32, CPU), FedAvg, in the simulator. Three configs differ only in
``privacy``: none; ``dp: central`` (clip each update, noise on the sum: server-side work on 20 model-sized
vectors, plus the accountant); ``dp: local`` (DP-SGD: per-sample gradients by vmap(grad), clipping and noise
in every step on every client). They alternate in one process, ``--repeats`` times; a round's time is the
difference of the clocks at consecutive metrics.jsonl lines (bench_simulator's ``_StampedLog``), round 0
(warm-up: for central DP it also computes the sampled-without-replacement RDP curve once, ~1 s) and the last
round (the only evaluation) are not timed. Medians of process CPU time and wall time, and the ratios to the
plain run of the same repeat, are printed.

    python benchmarks/bench_privacy.py --quick --rounds 3 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_simulator import BATCH, EPOCHS, FRACTION, LR, NUM_CLIENTS, SEED, Timing, _StampedLog, make_inputs

from fedent import runlog
from fedent.config import ExperimentConfig, config_from_dict
from fedent.inputs import RunInputs
from fedent.sim import run_simulation

MODES = {
    "plain": {},
    "central": {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 1.0},
    "local": {"dp": "local", "noise_multiplier": 1.0, "clip_norm": 1.0},
}


def config(mode: str, rounds: int, device: str) -> ExperimentConfig:
    raw: dict[str, Any] = {
        "name": "bench-privacy", "data": {"name": "fashion-mnist", "num_clients": NUM_CLIENTS,
                                          "partition": "pathological"},
        "train": {"rounds": rounds, "fraction": FRACTION, "local_epochs": EPOCHS, "batch_size": BATCH, "lr": LR,
                  "eval_every": 10_000, "seed": SEED, "device": device, "executor": "sequential"},
        "algorithm": {"name": "fedavg"},
    }
    if MODES[mode]:
        raw["privacy"] = MODES[mode]
    return config_from_dict(raw)


def round_times(inputs: RunInputs, mode: str, rounds: int, device: str) -> list[Timing]:
    """Per-round (wall, cpu) seconds of rounds 1..rounds-2 (bench_simulator's clock-at-each-log-line rule)."""
    _StampedLog.stamps = []
    original = runlog.MetricsLog
    runlog.MetricsLog = _StampedLog  # type: ignore[misc]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = Timing(time.perf_counter(), time.process_time())
            run_simulation(config(mode, rounds, device), Path(tmp) / "run", progress=False, inputs=inputs, plots=False)
    finally:
        runlog.MetricsLog = original  # type: ignore[misc]
    marks = [t0, *_StampedLog.stamps]
    times = [Timing(b.wall - a.wall, b.cpu - a.cpu) for a, b in zip(marks, marks[1:], strict=False)]
    return times[1:-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (plus one warm-up and one eval round)")
    ap.add_argument("--quick", action="store_true", help="12,000 training samples instead of 60,000")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--modes", default=",".join(MODES), help="which of plain,central,local (plain always runs)")
    args = ap.parse_args(argv)
    modes = ["plain", *(m for m in args.modes.split(",") if m in MODES and m != "plain")]
    if args.threads:
        torch.set_num_threads(args.threads)
    inputs = make_inputs(12_000 if args.quick else None, args.data_root)
    per: dict[str, list[Timing]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:  # alternating: the machine's drift hits all three alike
            per[mode] += round_times(inputs, mode, args.rounds + 2, args.device)
    med = {m: Timing(statistics.median(t.wall for t in ts), statistics.median(t.cpu for t in ts))
           for m, ts in per.items()}
    print(f"per-round medians over {args.rounds} timed rounds x {args.repeats} repeats "
          f"({'12,000' if args.quick else '60,000'} samples, {torch.get_num_threads()} threads, {args.device}):")
    for m, t in med.items():
        print(f"  {m:8s} wall {t.wall:7.3f} s  cpu {t.cpu:7.3f} s  ratio to plain: wall "
              f"{t.wall / med['plain'].wall:5.2f}x  cpu {t.cpu / med['plain'].cpu:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
