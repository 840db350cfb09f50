"""Where the vectorised step's time goes: torch.profiler over a few local epochs of ``--clients`` clients.

Workload as bench_vectorised_step.py (MNIST-CNN, 28x28, ``--samples`` samples per client, batch 32, one vmapped
step per batch). After a warm-up call (CUDA graph capture, autotuning, compilation), ``--calls`` calls of
``VectorisedTrainer.train`` are profiled. The summary table (markdown, also ``--out``) lists the top operators
and kernels by self time on the device that computes (CUDA kernels on a GPU, CPU operators on the CPU), each
one's share of the total, calls and self memory allocated; below it, the host gaps: on a GPU the time the
device sat idle between kernels within the profiled span (launch-bound work shows here), on the CPU the wall
time outside every operator (Python, the framework's dispatch). ``--perf`` turns on ``train.perf`` levers
(comma-separated: channels_last, autocast_bf16, compile, cudnn_benchmark) so each can be profiled on and off.

    python benchmarks/profile_step.py --device cuda --clients 20 --out profile-cuda.md
    python benchmarks/profile_step.py --device cpu --clients 4 --samples 64 --calls 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedent.config import CONV_PATHS, PerfOptions  # noqa: E402
from fedent.models import build_model  # noqa: E402
from fedent.perf import apply_host, apply_trainer, levers_named  # noqa: E402
from fedent.trainer import LocalTrainer  # noqa: E402
from fedent.vectorised_trainer import ClientRun, VectorisedTrainer  # noqa: E402


def perf_options(spec: str) -> PerfOptions:
    try:
        return levers_named(spec.split(","))
    except ValueError as e:
        raise SystemExit(f"--perf: {e}") from None


def device_gaps(prof: profile) -> tuple[float, float]:
    """(idle µs between consecutive kernels, span µs from the first kernel's start to the last one's end)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    if not spans:
        return 0.0, 0.0
    idle, end = 0.0, spans[0][1]
    for s, e in spans[1:]:
        idle += max(0.0, s - end)
        end = max(end, e)
    return idle, end - spans[0][0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--calls", type=int, default=3, help="profiled calls (one local epoch each)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--precision", default="float32", choices=["float32", "tf32"])
    ap.add_argument("--conv", default="direct", choices=list(CONV_PATHS))
    ap.add_argument("--perf", default="", help="train.perf levers: channels_last,autocast_bf16,compile,cudnn_benchmark")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="also write the markdown table here (and .json beside it)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    n = args.clients * args.samples
    x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    tr = LocalTrainer(build_model("mnist-cnn", 10, 1, 28), x, y, args.batch, dev, args.precision)
    perf = perf_options(args.perf)
    applied = apply_trainer(perf, tr)
    vt = VectorisedTrainer(tr, args.conv)
    applied += apply_host(perf, type("Host", (), {"vtrainer": vt})())
    start = [p.detach().clone() for p in tr.params]

    def call() -> None:
        runs = [ClientRun(torch.arange(k * args.samples, (k + 1) * args.samples), torch.Generator().manual_seed(k),
                          0.01) for k in range(args.clients)]
        vt.train(start, runs, 1)
        if cuda:
            torch.cuda.synchronize(dev)

    call()  # warm-up: graph capture, autotuning, compilation
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities, profile_memory=True, record_shapes=False) as prof:
        for _ in range(args.calls):
            call()
    wall_us = (time.perf_counter() - t0) * 1e6
    steps = args.calls * args.clients * -(-args.samples // args.batch)
    avg = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"

    def self_time(e: object) -> float:
        return float(getattr(e, key, 0.0) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)

    rows = sorted(avg, key=self_time, reverse=True)
    total = sum(self_time(e) for e in avg) or 1.0
    mem_key = "self_device_memory_usage" if cuda else "self_cpu_memory_usage"
    name = torch.cuda.get_device_name(dev) if cuda else f"CPU ({torch.get_num_threads()} threads)"
    lines = [f"**{name}**, torch {torch.__version__}: {args.clients} clients x {args.samples} samples, batch "
             f"{args.batch}, conv {args.conv}, {args.precision}, levers: {', '.join(applied) or 'none'}; "
             f"{args.calls} profiled calls, {steps} client steps in {wall_us / 1e6:.2f} s "
             f"({steps / (wall_us / 1e6):.0f} client steps/s under the profiler)", "",
             f"| {'kernel' if cuda else 'operator'} | calls | self time (ms) | share | self memory (MB) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    table = []
    for e in rows[:args.top]:
        t = self_time(e)
        mem = float(getattr(e, mem_key, 0) or 0) / 2**20
        lines.append(f"| `{e.key[:70]}` | {e.count} | {t / 1e3:.1f} | {100 * t / total:.1f}% | {mem:.1f} |")
        table.append({"name": e.key, "calls": e.count, "self_ms": t / 1e3, "share": t / total, "self_mb": mem})
    if cuda:
        idle, span = device_gaps(prof)
        gaps = {"device_idle_ms": idle / 1e3, "device_span_ms": span / 1e3, "idle_share": idle / span if span else 0.0}
        lines += ["", f"Host gaps: the GPU sat idle {idle / 1e3:.1f} ms of the {span / 1e3:.1f} ms from its first "
                      f"kernel to its last ({100 * gaps['idle_share']:.1f}%); kernels' self time {total / 1e3:.1f} ms."]
    else:
        outside = max(0.0, wall_us - total)
        gaps = {"wall_ms": wall_us / 1e3, "ops_self_ms": total / 1e3, "outside_ops_share": outside / wall_us}
        lines += ["", f"Host gaps: {outside / 1e3:.1f} ms of the {wall_us / 1e3:.1f} ms wall time "
                      f"({100 * outside / wall_us:.1f}%) ran outside every operator (Python, dispatch, the profiler)."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps(
            {"device": name, "torch": torch.__version__, "args": vars(args), "levers": applied,
             "steps_per_s_profiled": steps / (wall_us / 1e6), "top": table, "gaps": gaps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
