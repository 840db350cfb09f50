"""A round of 100 clients over P processes (``fedent simulate --procs P``) against the same round in one process.

Issue 28's goal: P processes scale at least 0.8·P (speed-up of the round time over P = 1). Workload: MNIST-CNN
on the seeded synthetic set (MNIST-shaped), ``--clients`` clients all sampled every round (fraction 1), each
with ``--samples`` samples, one local epoch at batch 32, sequential host, evaluation only in the last round,
FedAvg (``--algorithm``: another strategy, e.g. fedent, whose probes are gathered each round too).
Each side is a real ``fedent simulate`` command (P = 1: one process, ``--threads T``; P > 1: ``--procs P``, each
rank ``--threads T``), so process start-up, the all-gathers of the updates and rank 0's files all count. A round's
time is metrics.jsonl's ``wall_s``; round 0 (warm-up) and the last round (evaluation) are not timed. The sides
alternate ``--repeats`` times; medians are reported, with the largest |difference| between the final models
(the runs must agree within 1e-5), and the share of rank 0's run time spent in the all-gathers (status.json's
``gather_s``: moving the updates, and waiting for the slower rank; ``gather_cpu_s``, where the code reports it:
rank 0's CPU time in them). ``cpu`` is the CPU time of the whole command, every rank included (on a loaded
machine it moves less with other processes' load than the wall time). ``--baseline-code DIR`` also runs every
P on another checkout (e.g. main's), alternating with this one in the same run, for a before/after table.
``--gather-only`` times one round's all-gather of the updates alone, nothing else running: 2 gloo ranks on this
host, each holding ``--clients``/2 MNIST-CNN uploads, gather them as ``all_gather_object`` pickles (how every
update travelled before) and as flat tensors (``fedent.rounds.flatgather``; fresh byte buffers each time, and
buffers kept from one gather to the next) and, as a reduced round combines them (``--reduce sum``), as their
sample-weighted float64 sum all-reduced (one model's worth of traffic instead of every upload), alternately, after
a barrier (waiting for a slower rank is not counted); wall and CPU time per gather, rank 0 and rank 1.
``--reduce gather,sum`` runs every P > 1 both ways (``fedent simulate --reduce``), alternately in the same run.

    python benchmarks/bench_distributed.py                      # P = 1 vs P = 2 on the CPU
    python benchmarks/bench_distributed.py --procs 1,2,4 --device cuda   # on a machine with several GPUs
    python benchmarks/bench_distributed.py --procs 1,2 --rounds 3 --baseline-code ../main   # before/after
    python benchmarks/bench_distributed.py --procs 1,2 --reduce gather,sum    # all-gather vs all-reduce rounds
    python benchmarks/bench_distributed.py --gather-only --repeats 5     # the all-gather alone, pickled vs flat
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedent.model_file import load_model_file

ROOT = Path(__file__).resolve().parents[1]


def config(path: Path, clients: int, samples: int, rounds: int, device: str, algorithm: str = "fedavg") -> Path:
    path.write_text(
        "name: bench-distributed\n"
        f"data: {{name: synthetic, num_clients: {clients}, partition: iid, synthetic_train: {clients * samples}, "
        "synthetic_test: 500}\n"
        "model: {name: mnist-cnn}\n"
        f"train: {{rounds: {rounds}, fraction: 1.0, local_epochs: 1, batch_size: 32, lr: 0.05, "
        f"eval_every: {rounds}, seed: 0, device: {device}, executor: sequential}}\n"
        f"algorithm: {{name: {algorithm}}}\n")
    return path


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run(cfg: Path, out: Path, run_id: str, procs: int, threads: int, code: Path = ROOT,
        reduce: str | None = None) -> tuple[list[float], list[torch.Tensor], float, float, float]:
    """One command on the checkout ``code``: its timed rounds' wall times, final model, rank 0's share of its run
    in the all-gathers (wall, and CPU where reported) and the command's CPU time (every rank)."""
    cmd = [sys.executable, "-m", "fedent", "simulate", "--config", str(cfg), "--out", str(out), "--run-id", run_id,
           "--threads", str(threads), "--no-plots", "--no-progress", "--checkpoint-keep", "0"]
    if procs > 1:
        cmd += ["--procs", str(procs)]
    if reduce is not None:
        cmd += ["--reduce", reduce]
    cpu0 = _children_cpu()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=code, env={**os.environ, "PYTHONPATH": str(code)})
    cpu = _children_cpu() - cpu0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    recs = [json.loads(ln) for ln in (out / run_id / "metrics.jsonl").read_text().splitlines()]
    state = json.loads((out / run_id / "status.json").read_text())["state"]
    total = max(sum(r["wall_s"] for r in recs), 1e-9)
    gather_share = float(state.get("gather_s", 0.0)) / total
    gather_cpu_share = float(state.get("gather_cpu_s", float("nan"))) / total
    return ([r["wall_s"] for r in recs[1:-1]], load_model_file(out / run_id / "model_final.pt").params, gather_share,
            gather_cpu_share, cpu)


def _gather_rank(rank: int, size: int, port: int, clients: int, repeats: int, out: str) -> None:
    """Rank ``rank`` of the ``--gather-only`` pair: its clients' uploads gathered both ways, timed."""
    import time

    import torch.distributed as dist

    from fedent.distributed import World, rank_env
    from fedent.models import build_model
    from fedent.rounds.flatgather import Buffers, all_gather_flat
    from fedent.strategies.base import ClientUpdate

    os.environ.update(rank_env(rank, size, port))
    torch.set_num_threads(1)
    world = World.from_env()
    shapes = [p.shape for p in build_model("mnist-cnn", 10, 1, 28).parameters()]
    g = torch.Generator().manual_seed(rank)
    uploads = {c: ClientUpdate(c, [torch.randn(s, generator=g) for s in shapes], 60, 0.5, scalars={"eta": 0.1})
               for c in world.mine(range(clients))}
    local: tuple[dict[int, ClientUpdate], dict[int, str]] = (uploads, {})
    kept = Buffers()

    def summed(obj: tuple[dict[int, ClientUpdate], dict[int, str]]) -> torch.Tensor:
        """What a reduced round moves: Σ n_i w_i over this rank's uploads in float64, all-reduced."""
        buf = torch.zeros(sum(s.numel() for s in shapes), dtype=torch.float64)
        for u in obj[0].values():
            off = 0
            for p in u.params:
                buf[off:off + p.numel()].add_(p.reshape(-1), alpha=float(u.num_samples))
                off += p.numel()
        return world.all_reduce_sum(buf)

    ways = {"pickled": world.all_gather, "flat": lambda obj: all_gather_flat(world, obj),
            "flat, buffers kept": lambda obj: all_gather_flat(world, obj, kept), "summed (all-reduce)": summed}
    got: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
    first: dict[str, Any] = {}
    for rep in range(repeats + 1):  # the first of each is a warm-up
        for name, gather in ways.items():
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            parts = gather(local)
            if rep:
                got[name].append((time.perf_counter() - t0, time.process_time() - c0))
            first.setdefault(name, parts)
            del parts
    a = first.pop("pickled")
    total = first.pop("summed (all-reduce)")
    same = all(torch.equal(x, y) for w in first for pa, pb in zip(a, first[w], strict=True)
               for c in pa[0] for x, y in zip(pa[0][c].params, pb[0][c].params, strict=True))
    want = torch.zeros_like(total)
    for pa in a:
        for u in pa[0].values():
            want += u.num_samples * torch.cat([p.reshape(-1) for p in u.params]).double()
    same = same and bool(torch.allclose(total, want, rtol=0, atol=1e-9))
    mb = sum(s.numel() for s in shapes) * 4 * clients / 1e6
    Path(out, f"rank{rank}.json").write_text(json.dumps({"times": got, "same": same, "mb": mb}))
    world.close()


def gather_only(clients: int, repeats: int) -> int:
    import torch.multiprocessing as mp

    from fedent.distributed import free_port

    with tempfile.TemporaryDirectory(prefix="bench-gather-") as tmp:
        mp.spawn(_gather_rank, args=(2, free_port(), clients, repeats, tmp), nprocs=2, join=True)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    print(f"one all-gather of {clients} MNIST-CNN uploads ({ranks[0]['mb']:.0f} MB of float32) over 2 gloo ranks, "
          f"{repeats} repeats, medians; flat = pickled bit for bit and the all-reduced sum = the gathered uploads' "
          f"sum: {all(r['same'] for r in ranks)}")
    print("| form | rank 0 wall (s) | rank 0 CPU (s) | rank 1 wall (s) | rank 1 CPU (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for way in ranks[0]["times"]:
        cells = [f"{statistics.median(t[i] for t in r['times'][way]):.3f}" for r in ranks for i in (0, 1)]
        print(f"| {way} | {' | '.join(cells)} |")
    return 0


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
    ap.add_argument("--baseline-code", default=None, metavar="DIR",
                    help="another checkout (e.g. main's worktree) run alternately with this one, for before/after")
    ap.add_argument("--algorithm", default="fedavg", help="the strategy every run uses (e.g. fedent: probes too)")
    ap.add_argument("--reduce", default="auto",
                    help="comma-separated fedent simulate --reduce modes run for every P > 1 (auto, gather, sum)")
    ap.add_argument("--gather-only", action="store_true",
                    help="time one round's all-gather alone, pickled vs flat (2 gloo ranks, no training)")
    args = ap.parse_args()
    if args.gather_only:
        return gather_only(args.clients, args.repeats)
    counts = [int(p) for p in args.procs.split(",")]
    codes = {"this": ROOT}
    if args.baseline_code:
        codes = {"baseline": Path(args.baseline_code).resolve(), "this": ROOT}
    modes = [m for m in args.reduce.split(",") if m]
    # (code, P, --reduce): the baseline checkout may predate --reduce; one process has nothing to reduce
    sides = [(c, p, m if c == "this" and p > 1 else None) for p in counts for c in codes
             for m in (modes if c == "this" and p > 1 else [None])]
    Side = tuple[str, int, "str | None"]
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as tmp:
        out = Path(tmp)
        cfg = config(out / "c.yaml", args.clients, args.samples, args.rounds, args.device, args.algorithm)
        times: dict[Side, list[float]] = {s: [] for s in sides}
        models: dict[Side, list[torch.Tensor]] = {}
        gathers: dict[Side, list[float]] = {s: [] for s in sides}
        gathers_cpu: dict[Side, list[float]] = {s: [] for s in sides}
        cpus: dict[Side, list[float]] = {s: [] for s in sides}
        for rep in range(args.repeats):
            for side in sides:
                c, p, m = side
                t, models[side], g, gc, cpu = run(cfg, out, f"{c}-p{p}-{m}-r{rep}", p, args.threads, codes[c], m)
                times[side] += t
                gathers[side].append(g)
                gathers_cpu[side].append(gc)
                cpus[side].append(cpu)
                print(f"repeat {rep}: {c} P={p} reduce {m or '-'} rounds {', '.join(f'{x:.2f}' for x in t)} s, "
                      f"command CPU {cpu:.1f} s", flush=True)
    ref = sides[0]
    base = statistics.median(times[ref])
    rows = []
    print(f"\n{args.algorithm}, {args.clients} clients x {args.samples} samples, MNIST-CNN, {args.device}, "
          f"{args.threads} thread(s) "
          f"per process, {torch.get_num_threads()} here; code: "
          + ", ".join(f"{c} = {path}" for c, path in codes.items()))
    print(f"| code | P | reduce | round (s, median) | speed-up | speed-up / P | rank 0 combining updates (wall) "
          f"| (CPU) | command CPU (s) | max abs diff vs {ref[0]} P={ref[1]} |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for side in sides:
        c, p, m = side
        med = statistics.median(times[side])
        diff = max(float((a - b).abs().max()) for a, b in zip(models[ref], models[side], strict=True))
        share, share_cpu = statistics.median(gathers[side]), statistics.median(gathers_cpu[side])
        cpu = statistics.median(cpus[side])
        rows.append({"code": c, "procs": p, "reduce": m, "round_s": med, "speedup": base / med,
                     "efficiency": base / med / p * counts[0], "gather_share": share, "gather_cpu_share": share_cpu,
                     "command_cpu_s": cpu, "max_abs_diff": diff})
        print(f"| {c} | {p} | {m or '—'} | {med:.2f} | {base / med:.2f}x | {base / med / p * counts[0]:.2f} "
              f"| {100 * share:.0f}% | {100 * share_cpu:.0f}% | {cpu:.1f} | {diff:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
