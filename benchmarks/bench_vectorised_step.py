"""Client SGD steps per second of the vectorised trainer, by convolution path and precision, in one process.

The full reproduce profile is bounded by this rate (51.6 M client steps; issue 17). Workload: MNIST-CNN
(1.66 M parameters) on 28x28 inputs, ``--clients`` clients of ``--samples`` samples each training one local
epoch at batch ``--batch`` together (one vmapped step per batch), as a round of the Table IV MNIST row does.
Every contender trains the same clients from the same start on the same batches; the first call of each
(warm-up, CUDA graph capture) is not timed, then ``--repeats`` calls alternate between the contenders and the
median is reported. Beside each rate: the largest parameter difference from the first contender after one
call (direct float32 is exact float32; TF32 rounds convolution and matmul inputs to 10 mantissa bits).

    python benchmarks/bench_vectorised_step.py --device cuda        # direct/looped x float32/tf32
    python benchmarks/bench_vectorised_step.py --device cpu --clients 4 --repeats 1

The last line is ``BEST {json}``: the fastest contender at ``--prefer`` precision for the first ``--clients``
count (a round's participants: 20 in Table IV), for a script to read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedent import looped_conv  # noqa: E402
from fedent.config import CONV_PATHS  # noqa: E402
from fedent.models import build_model  # noqa: E402
from fedent.trainer import LocalTrainer, set_precision  # noqa: E402
from fedent.vectorised_trainer import ClientRun, VectorisedTrainer  # noqa: E402

STREAMS = looped_conv.STREAMS  # the default


def contenders(spec: str) -> list[tuple[str, str]]:
    """CONV/PRECISION items; CONV may be looped:K, the looped form over K CUDA streams (fedent.looped_conv.STREAMS)."""
    out = []
    for item in spec.split(","):
        conv, _, precision = item.partition("/")
        path, _, streams = conv.partition(":")
        if (path not in CONV_PATHS or precision not in ("float32", "tf32")
                or (streams and (path != "looped" or not streams.isdigit() or int(streams) < 1))):
            raise SystemExit(f"--contenders: {item!r} is not CONV/PRECISION ({'|'.join(CONV_PATHS)}|looped:K / "
                             "float32|tf32)")
        out.append((conv, precision))
    return out


def use(conv: str) -> str:
    """The train.conv path of a contender, its stream count set for the looped form."""
    path, _, streams = conv.partition(":")
    looped_conv.STREAMS = int(streams) if streams else STREAMS
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--clients", default="20,60", help="comma-separated client counts per step")
    ap.add_argument("--samples", type=int, default=600, help="samples per client (600: Table IV's MNIST row)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--contenders", default="direct/float32,direct/tf32,looped/float32,looped/tf32,looped:1/tf32",
                    help="CONV/PRECISION items, CONV one of direct, unfold, looped or looped:K (K CUDA streams; "
                         f"looped alone: {STREAMS}); unfold lost 3.5-4x on an H100 and is no longer a default")
    ap.add_argument("--prefer", default="tf32", choices=["float32", "tf32"], help="precision for the BEST line")
    args = ap.parse_args()
    dev = torch.device(args.device)
    todo = contenders(args.contenders)
    counts = [int(c) for c in args.clients.split(",")]
    torch.manual_seed(0)
    n = max(counts) * args.samples
    x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    model = build_model("mnist-cnn", 10, 1, 28)
    start = [p.detach().clone().to(dev) for p in model.parameters()]
    if dev.type == "cuda":
        print(torch.cuda.get_device_name(dev), "torch", torch.__version__, file=sys.stderr)
    best: dict[str, object] = {}
    for c in counts:
        trainers: dict[tuple[str, str], tuple[LocalTrainer, VectorisedTrainer]] = {}
        for conv, precision in todo:
            tr = LocalTrainer(build_model("mnist-cnn", 10, 1, 28), x, y, args.batch, dev, precision)
            trainers[(conv, precision)] = (tr, VectorisedTrainer(tr, conv.partition(":")[0]))

        def call(key: tuple[str, str], c: int = c,
                 trainers: dict[tuple[str, str], tuple[LocalTrainer, VectorisedTrainer]] = trainers
                 ) -> tuple[float, list[torch.Tensor]]:
            tr, vt = trainers[key]
            set_precision(dev, key[1])  # the TF32 flags are per process: this contender's, before it runs
            use(key[0])  # and the looped form's streams (its CUDA graph is captured on its first call)
            runs = [ClientRun(torch.arange(k * args.samples, (k + 1) * args.samples),
                              torch.Generator().manual_seed(k), 0.01) for k in range(c)]
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            out = vt.train(start, runs, 1)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return time.perf_counter() - t0, out[0][0]

        ref: list[torch.Tensor] | None = None
        diffs: dict[tuple[str, str], float] = {}
        for key in todo:  # warm-up and the difference from the first contender
            _, params = call(key)
            ref = ref or params
            diffs[key] = max(float((a - b).abs().max()) for a, b in zip(ref, params, strict=True))
        times: dict[tuple[str, str], list[float]] = {k: [] for k in todo}
        for _ in range(args.repeats):
            for key in todo:
                times[key].append(call(key)[0])
        steps = c * -(-args.samples // args.batch)
        for key in todo:
            rate = steps / statistics.median(times[key])
            print(f"clients {c:4d}  conv {key[0]:8s}  {key[1]:7s}  {rate:10.0f} client steps/s  "
                  f"max |dw| vs {todo[0][0]}/{todo[0][1]} {diffs[key]:.1e}")
            if c == counts[0] and key[1] == args.prefer and rate > float(best.get("steps_per_s", 0.0)):  # type: ignore[arg-type]
                best = {"conv": key[0].partition(":")[0], "precision": key[1], "clients": c, "steps_per_s": round(rate)}
    print("BEST " + json.dumps(best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
