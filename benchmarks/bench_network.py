"""The cluster over capped links: time per round and to a target accuracy for each transfer encoding.

On loopback bandwidth is free; across a network the bytes decide a round's time. This runs the aggregator
and two workers in their own network namespaces (tests/netns.py: veth + bridge, mutual TLS, a ``tc tbf`` cap
on both directions of each worker's link) for each encoding the aggregator offers (``--wire-dtype``
native|float16|bfloat16, ``--compression zlib``, and the run's ``train.upload_encoding`` int8 / topk) at each
bandwidth, and reports per run: the median round
time, the bytes up and down per round (metrics.jsonl ``diagnostics.transfer``), the time until the test
accuracy first reached ``--target``, and the final accuracy against the native encoding's (the accuracy cost
of a lossy encoding). Beside them, the loopback codec figures: encode + decode time of one model in this
process (no network), the part of a round an encoding adds in CPU.

No delay is emulated (``netem`` is not available on these kernels): only bandwidth. Root only.

    sudo .venv/bin/python benchmarks/bench_network.py                       # 100 and 10 Mbit/s, 4 encodings
    sudo .venv/bin/python benchmarks/bench_network.py --mbit 10 --rounds 3 --encodings native,float16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import netns  # noqa: E402
from procs import stop_all, wait_for  # noqa: E402

from fedent import compress  # noqa: E402
from fedent.config import load_config  # noqa: E402
from fedent.inputs import model_factory  # noqa: E402
from fedent.runlog import read_json, read_metrics  # noqa: E402
from fedentrpc import codec  # noqa: E402

# encoding -> the aggregator's flags: its transfer settings (both directions) or the run's upload encoding
# (train.upload_encoding, fedent.compress: uploads only, the simulator applies it too)
ENCODINGS: dict[str, tuple[str, ...]] = {
    "native": (), "float16": ("--wire-dtype", "float16"), "bfloat16": ("--wire-dtype", "bfloat16"),
    "zlib": ("--compression", "zlib"), "int8": ("--set", "train.upload_encoding=int8"),
    "topk1%": ("--set", "train.upload_encoding=topk", "--set", "train.topk_fraction=0.01"),
    "int8+float16": ("--set", "train.upload_encoding=int8", "--wire-dtype", "float16")}
CONFIG = """\
name: netbench
data: {{name: synthetic, num_clients: 2, partition: iid, synthetic_train: 400, synthetic_test: 200}}
model: {{name: mnist-cnn}}
train: {{rounds: {rounds}, fraction: 1.0, local_epochs: 1, batch_size: 20, lr: 0.05, seed: 5, device: cpu}}
algorithm: {{name: fedavg}}
"""


def codec_figures(config: str, tmp: Path) -> dict[str, dict[str, float]]:
    """Per encoding: encode + decode of the run's model (or of a delta's codes, for the upload encodings) in this
    process, no network, best of 5, and the bytes it puts on the wire."""
    (tmp / "codec.yaml").write_text(config)
    params = [p.detach() for p in model_factory(load_config(tmp / "codec.yaml"))().parameters()]
    out = {}
    delta = [p * 0.01 for p in params]
    for name in ENCODINGS:
        spec = codec.TransferSpec(wire_dtype="float16" if "float16" in name else "bfloat16" if "bfloat16" in name
                                  else "native", compression="zlib" if name == "zlib" else "none")
        kind = "int8" if name.startswith("int8") else "topk" if name.startswith("topk") else None
        best, wire = float("inf"), 0
        for _ in range(5):
            t = time.perf_counter()
            bundle = {"params": params} if kind is None else compress.encode(delta, kind, 0, 0, 0, 0.01)[0]
            enc = codec.encode_tensors(bundle, spec)
            got = codec.decode_tensors(enc.chunks)
            if kind is not None:
                compress.decode(params, got)
            best, wire = min(best, time.perf_counter() - t), enc.wire_bytes
        out[name] = {"codec_ms": best * 1e3, "model_wire_bytes": wire}
    return out


def run_one(tmp: Path, config: str, mbit: float, encoding: str, target: float, rounds: int) -> dict[str, float]:
    net = netns.Network()
    procs = []
    try:
        procs, out = netns.start_cluster(net, tmp, config, mbit, server_flags=ENCODINGS[encoding])
        wait_for(lambda: (read_json(out / "status.json", {}) or {}).get("phase") in ("done", "failed"),
                 "the run", 120 + rounds * 60)
    finally:
        stop_all(procs)
        net.close()
    recs = read_metrics(out / "metrics.jsonl")
    reached = [r["elapsed_s"] for r in recs if r["test_acc"] is not None and r["test_acc"] >= target]
    per_round = [r["diagnostics"].get("transfer", {}) for r in recs]
    return {"round_s": statistics.median(r["wall_s"] for r in recs),
            "up_mb": statistics.median(t.get("bytes_up", 0) for t in per_round) / 1e6,
            "down_mb": statistics.median(t.get("bytes_down", 0) for t in per_round) / 1e6,
            "to_target_s": reached[0] if reached else float("nan"), "final_acc": recs[-1]["test_acc"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mbit", default="100,10", help="per-worker link caps (Mbit/s), comma-separated")
    p.add_argument("--encodings", default=",".join(ENCODINGS), help=f"of {', '.join(ENCODINGS)}")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--target", type=float, default=0.5, help="test accuracy whose first round is timed")
    p.add_argument("--json", default=None, help="write the table here too")
    args = p.parse_args()
    why = netns.unavailable()
    if why is not None:
        print(f"bench_network: skipped: {why}")
        return 0
    config = CONFIG.format(rounds=args.rounds)
    encodings = args.encodings.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        figures = codec_figures(config, Path(d))
        for mbit in (float(m) for m in args.mbit.split(",")):
            base_acc = None
            for enc in encodings:
                got = run_one(Path(d) / f"{mbit:g}-{enc}", config, mbit, enc, args.target, args.rounds)
                base_acc = got["final_acc"] if enc == "native" else base_acc
                row = {"mbit": mbit, "encoding": enc, **got, **figures[enc],
                       "acc_cost": (base_acc - got["final_acc"]) if base_acc is not None else float("nan")}
                rows.append(row)
                print(f"{mbit:>5g} Mbit/s {enc:>9}: round {got['round_s']:6.2f}s  up {got['up_mb']:6.2f} MB  "
                      f"down {got['down_mb']:6.2f} MB  to acc {args.target:g}: {got['to_target_s']:6.1f}s  "
                      f"final acc {got['final_acc']:.4f} (cost {row['acc_cost']:+.4f})  "
                      f"codec {figures[enc]['codec_ms']:6.1f} ms on loopback", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
