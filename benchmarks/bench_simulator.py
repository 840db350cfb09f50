"""The simulator's round time against a bare PyTorch loop doing the same client training in this process.

Workload (issue 4): MNIST-CNN on Fashion-MNIST (system copy), pathological partition, 100 clients,
20 per round, 1 local epoch, batch 32. The bare loop copies the global weights into the model, trains
the round's clients one after another on the same batches (the same fedent.rng generators, the same
order) and takes the sample-weighted average; it writes no files and keeps no logs. The simulator
runs the full protocol (sampling, strategy calls, client state, metrics.jsonl, status.json,
clients.json, estimator.json for FedEnt). FedEnt's ratio is against the same bare FedAvg loop, so its
probe gradient and the online mean-field estimator count as overhead ("estimator included").

A round's time is the difference of consecutive ``elapsed_s`` in metrics.jsonl, so the bookkeeping
after a round's log line is charged too. Round 0 (warm-up) and the last round (the only evaluation)
are excluded; the same rounds are timed in the bare loop. Runs alternate bare/simulator; medians of
both wall time and process CPU time are reported. On a shared machine wall time drifts with other
processes' load, so the CPU-time ratio (with --threads 1) is the trustworthy one there; CPU time does
not count waiting for fsync, which the wall-time ratio on a quiet machine does.

    python benchmarks/bench_simulator.py                      # full data (600 samples per client)
    python benchmarks/bench_simulator.py --quick --rounds 2   # 12,000 samples, for CI-size machines
    python benchmarks/bench_simulator.py --device cuda --executors sequential,vectorised   # issue 16's ratios
    python benchmarks/bench_simulator.py --algorithms fedavg --perf none,channels_last   # a train.perf lever on/off

``--perf`` names lever sets (``none``, or levers joined by ``+``: ``channels_last``, ``autocast_bf16``,
``eval_batched``, ``cudnn_benchmark``, ``compile``), each timed as its own simulator contender in the same
alternation, with its model's largest difference from the lever-free simulator's after the timed rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedent import runlog
from fedent.config import DataConfig, ExperimentConfig, config_from_dict
from fedent.data import load_dataset, make_partition
from fedent.inputs import RunInputs
from fedent.models import build_model
from fedent.perf import levers_named
from fedent.rng import sample_clients, torch_generator
from fedent.sim import run_simulation

NUM_CLIENTS, FRACTION, EPOCHS, BATCH, LR, SEED = 100, 0.2, 1, 32, 0.01, 0


@dataclass(frozen=True)
class Timing:
    wall: float  # perf_counter seconds: what a user waits, but it drifts with other processes' load
    cpu: float  # this process's CPU seconds: robust to a busy machine when torch uses one thread


def make_inputs(max_train: int | None, root: str | None = None) -> RunInputs:
    dcfg = DataConfig(name="fashion-mnist", root=root, num_clients=NUM_CLIENTS, partition="pathological",
                      max_train_samples=max_train, max_test_samples=1000)
    data = load_dataset(dcfg, SEED)
    part = make_partition(data.y_train.numpy(), dcfg, SEED)

    def make_model() -> torch.nn.Module:
        return build_model("mnist-cnn", data.num_classes, data.in_channels, data.image_size, 0.0, SEED)

    return RunInputs(data=data, client_indices=tuple(part.client_indices), make_model=make_model,
                     partition_info={"md5": part.md5()})


def perf_options(levers: str) -> dict[str, Any]:
    """``train.perf`` for a ``--perf`` entry: ``none``, or lever names joined by ``+``."""
    try:
        return dataclasses.asdict(levers_named(levers.split("+")))
    except ValueError as e:
        raise SystemExit(f"--perf: {e}") from None


def config(algorithm: str, rounds: int, device: str, executor: str = "sequential",
           perf: Mapping[str, Any] | None = None) -> ExperimentConfig:
    return config_from_dict({
        "name": "bench", "data": {"name": "fashion-mnist", "num_clients": NUM_CLIENTS, "partition": "pathological"},
        "train": {"rounds": rounds, "fraction": FRACTION, "local_epochs": EPOCHS, "batch_size": BATCH, "lr": LR,
                  "eval_every": 10_000, "seed": SEED, "device": device, "executor": executor,
                  "perf": dict(perf or {})},
        "algorithm": {"name": algorithm},
    })


def bare_loop(inputs: RunInputs, rounds: int, device: torch.device) -> tuple[list[Timing], list[Tensor]]:
    """Plain PyTorch FedAvg: per-round (wall, cpu) seconds and the final model (rounds 0..rounds-2, no eval)."""
    model = inputs.make_model().to(device)
    params = list(model.parameters())
    x, y = inputs.data.x_train.to(device), inputs.data.y_train.to(device)
    idx = [torch.tensor(np.asarray(ix), dtype=torch.int64) for ix in inputs.client_indices]
    glob = [p.detach().clone() for p in params]
    times = []
    for t in range(rounds - 1):
        t0, c0 = time.perf_counter(), time.process_time()
        chosen = sample_clients(SEED, t, NUM_CLIENTS, FRACTION)
        total = float(sum(idx[c].numel() for c in chosen))
        new = [torch.zeros_like(p) for p in params]
        for cid in chosen:
            with torch.no_grad():
                torch._foreach_copy_(params, glob)
            gen = torch_generator(SEED, "train", t, cid)
            for _ in range(EPOCHS):
                order = idx[cid][torch.randperm(idx[cid].numel(), generator=gen)].to(device)
                for b in torch.split(order, BATCH):
                    loss = F.cross_entropy(model(x[b]), y[b])
                    grads = torch.autograd.grad(loss, params)
                    with torch.no_grad():
                        torch._foreach_add_(params, list(grads), alpha=-LR)
            with torch.no_grad():
                torch._foreach_add_(new, params, alpha=idx[cid].numel() / total)
        glob = new
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(Timing(time.perf_counter() - t0, time.process_time() - c0))
    return times, glob


class _StampedLog(runlog.MetricsLog):
    """metrics.jsonl writer that also notes (wall, cpu) clocks at each round's line (benchmark only)."""

    stamps: list[Timing] = []

    def append(self, record: Mapping[str, Any]) -> None:
        super().append(record)
        _StampedLog.stamps.append(Timing(time.perf_counter(), time.process_time()))


def sim_round_times(inputs: RunInputs, algorithm: str, rounds: int, device: str,
                    executor: str = "sequential", cfg: ExperimentConfig | None = None
                    ) -> tuple[list[Timing], list[Tensor]]:
    """Per-round (wall, cpu) seconds of the simulator: differences of the clocks at consecutive log lines,
    so the bookkeeping after a line (clients.json, estimator.json, status.json) is charged to the next
    round. The last round (the only evaluation) is left out. ``cfg`` replaces this benchmark's config (other
    benchmarks time their own variants of it with the same harness)."""
    _StampedLog.stamps = []
    original = runlog.MetricsLog
    runlog.MetricsLog = _StampedLog  # type: ignore[misc]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = Timing(time.perf_counter(), time.process_time())
            res = run_simulation(cfg or config(algorithm, rounds, device, executor), Path(tmp) / "run",
                                 progress=False, inputs=inputs, plots=False)
    finally:
        runlog.MetricsLog = original  # type: ignore[misc]
    marks = [t0, *_StampedLog.stamps]
    times = [Timing(b.wall - a.wall, b.cpu - a.cpu) for a, b in zip(marks, marks[1:], strict=False)]
    return times[:-1], res.params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (plus one warm-up and one eval round)")
    ap.add_argument("--quick", action="store_true", help="12,000 training samples instead of 60,000")
    ap.add_argument("--repeats", type=int, default=2, help="alternating bare/simulator repetitions")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (same for both)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--algorithms", default="fedavg,fedent")
    ap.add_argument("--data-root", default=None, help="Fashion-MNIST files here (default: the system copy)")
    ap.add_argument("--executors", default="sequential",
                    help="comma-separated simulator executors to time (sequential, vectorised)")
    ap.add_argument("--perf", default="none",
                    help="comma-separated train.perf lever sets to time, each 'none' or levers joined by '+' "
                         "(channels_last, autocast_bf16, eval_batched, cudnn_benchmark, compile)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # as LocalTrainer sets it: every contender computes in float32
    inputs = make_inputs(12_000 if args.quick else None, args.data_root)
    rounds = args.rounds + 2
    sizes = inputs.client_sizes()
    print(f"fashion-mnist pathological, {NUM_CLIENTS} clients x ~{int(np.mean(sizes))} samples, "
          f"{int(FRACTION * NUM_CLIENTS)} per round, {EPOCHS} epoch, batch {BATCH}, mnist-cnn, device {dev}, "
          f"threads {torch.get_num_threads()}, {args.rounds} timed rounds x {args.repeats} repeats")
    algos = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    execs = [e.strip() for e in args.executors.split(",") if e.strip()]
    levers = [s.strip() for s in args.perf.split(",") if s.strip()] or ["none"]
    perfs = {s: perf_options(s) for s in levers}
    bare: list[Timing] = []
    keys = [(a, e, s) for a in algos for e in execs for s in levers]
    sims: dict[tuple[str, str, str], list[Timing]] = {k: [] for k in keys}
    finals: dict[tuple[str, str, str], list[Tensor]] = {}
    for _ in range(args.repeats):
        times, _ = bare_loop(inputs, rounds, dev)
        bare += times[1:]  # round 0 warms up
        for a, e, s in keys:
            cfg = config(a, rounds, args.device, e, perfs[s])
            stimes, finals[a, e, s] = sim_round_times(inputs, a, rounds, args.device, e, cfg)
            sims[a, e, s] += stimes[1:]
    for clock in ("cpu", "wall"):
        b = statistics.median(getattr(t, clock) for t in bare)
        print(f"[{clock} time] bare loop                  : median {b:.3f} s/round (of {len(bare)} rounds)")
        for a, e, s in keys:
            m = statistics.median(getattr(t, clock) for t in sims[a, e, s])
            tag = "" if len(levers) == 1 else f" {s:<14}"
            print(f"[{clock} time] simulator {a:<7} {e:<10}{tag}: median {m:.3f} s/round  ->  ratio {m / b:.3f}x "
                  f"of bare, speed-up {b / m:.2f}x")
    for a, e, s in keys:
        ref = finals.get((a, e, "none"))
        if s != "none" and ref is not None:
            diff = max(float((x.cpu() - y.cpu()).abs().max()) for x, y in zip(ref, finals[a, e, s], strict=True))
            print(f"levers {s} ({a}, {e}): max |w - w(no levers)| after {rounds - 1} rounds = {diff:.2e}")
    for e in execs:
        check_same_model(inputs, dev, args.device, e)
    return 0


def check_same_model(inputs: RunInputs, dev: torch.device, device: str, executor: str = "sequential") -> None:
    """Sanity: after 2 rounds the simulator's FedAvg model equals the bare loop's (same batches, same order)."""
    _, bare_params = bare_loop(inputs, 3, dev)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config("fedavg", 2, device, executor)
        res = run_simulation(cfg, Path(tmp) / "r", progress=False, inputs=inputs, plots=False)
    diff = max(float((a.cpu() - b.cpu()).abs().max()) for a, b in zip(bare_params, res.params, strict=True))
    print(f"same training check ({executor}): max |bare - simulator| after 2 rounds = {diff:.2e}")


if __name__ == "__main__":
    sys.exit(main())
