"""The cluster over capped links: time per round and to a target accuracy for each transfer encoding.

On loopback bandwidth is free; across a network the bytes decide a round's time. This runs the aggregator
and two workers in their own network namespaces (tests/netns.py: veth + bridge, mutual TLS, a ``tc tbf`` cap
on both directions of each worker's link) for each encoding the aggregator offers (``--wire-dtype``
native|float16|bfloat16, ``--compression zlib``, ``--download-encoding delta``, and the run's
``train.upload_encoding`` int8 / topk) at each bandwidth, and reports per run: the median round
time, the bytes up and down per round (metrics.jsonl ``diagnostics.transfer``; "down" is the median, and for the
delta downloads also the first round's, when no worker holds a model yet, and the later rounds' mean), the time
until the test accuracy first reached ``--target``, and the final accuracy against the native encoding's (the
accuracy cost of a lossy encoding). Beside them, the loopback codec figures: encode + decode time of one model
in this process (no network), the part of a round an encoding adds in CPU; for a delta download, of the delta
between the run's last two global models (its checkpoints), whose sizes under every alternative (a float
subtraction, no byte planes, no zlib, the 16-bit wire dtypes) are printed after the run.

No delay is emulated (``netem`` is not available on these kernels): only bandwidth. Root only.

    sudo .venv/bin/python benchmarks/bench_network.py                       # 100 and 10 Mbit/s, 4 encodings
    sudo .venv/bin/python benchmarks/bench_network.py --mbit 10 --rounds 3 --encodings native,float16
    sudo .venv/bin/python benchmarks/bench_network.py --rounds 4 --encodings native,zlib,delta,delta+float16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import netns  # noqa: E402
from procs import stop_all, wait_for  # noqa: E402

from fedent import compress  # noqa: E402
from fedent.checkpoint import list_checkpoints, load_checkpoint  # noqa: E402
from fedent.config import load_config  # noqa: E402
from fedent.inputs import model_factory  # noqa: E402
from fedent.runlog import read_json, read_metrics  # noqa: E402
from fedentrpc import codec, model_delta  # noqa: E402

# encoding -> the aggregator's flags: its transfer settings (both directions) or the run's upload encoding
# (train.upload_encoding, fedent.compress: uploads only, the simulator applies it too)
ENCODINGS: dict[str, tuple[str, ...]] = {
    "native": (), "float16": ("--wire-dtype", "float16"), "bfloat16": ("--wire-dtype", "bfloat16"),
    "zlib": ("--compression", "zlib"), "int8": ("--set", "train.upload_encoding=int8"),
    "topk1%": ("--set", "train.upload_encoding=topk", "--set", "train.topk_fraction=0.01"),
    "int8+float16": ("--set", "train.upload_encoding=int8", "--wire-dtype", "float16"),
    "delta": ("--download-encoding", "delta"),
    "delta+float16": ("--download-encoding", "delta", "--wire-dtype", "float16"),
    "int8+delta+float16": ("--set", "train.upload_encoding=int8", "--download-encoding", "delta",
                           "--wire-dtype", "float16")}
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
        if "delta" in name:
            continue  # measured on the run's own models (delta_figures)
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


def _wire(name: str) -> str:
    return "float16" if "float16" in name else "bfloat16" if "bfloat16" in name else "native"


def delta_figures(prev: list[torch.Tensor], new: list[torch.Tensor], wire: str) -> dict[str, float]:
    """The delta download of ``new`` to a worker holding ``prev`` (two consecutive global models of a run):
    encode + decode + rebuild time (best of 3) and its wire bytes, as the aggregator sends it."""
    spec = codec.TransferSpec(wire_dtype=wire, compression="zlib")
    best, wire_bytes = float("inf"), 0
    for _ in range(3):
        t = time.perf_counter()
        held = model_delta.Held.of("prev", prev, wire)
        target = model_delta.wire_form(new, wire)
        enc = codec.encode_tensors({model_delta.DELTA_GROUP: model_delta.encode(list(held.wire), target)}, spec)
        planes = codec.decode_tensors(enc.chunks)[model_delta.DELTA_GROUP]
        held.rebuild(model_delta.DeltaInfo("prev", held.digest, model_delta.digest(target), wire), planes)
        best, wire_bytes = min(best, time.perf_counter() - t), enc.wire_bytes
    return {"codec_ms": best * 1e3, "model_wire_bytes": wire_bytes}


def delta_sizes(prev: list[torch.Tensor], new: list[torch.Tensor]) -> list[tuple[str, str, int]]:
    """What each way of sending ``new`` to a holder of ``prev`` puts on the wire (zlib level 1, as the codec):
    (wire dtype, form, bytes). The encoding is "xor planes + zlib"; the others are why it is that one."""
    def z(ts: list[torch.Tensor]) -> int:
        return len(zlib.compress(b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in ts), 1))

    rows = []
    for wire in ("native", "float16", "bfloat16"):
        a, b = model_delta.wire_form(prev, wire), model_delta.wire_form(new, wire)
        bits = {2: torch.int16, 4: torch.int32}
        xor = [x.reshape(-1).view(bits[x.element_size()]) ^ y.reshape(-1).view(bits[y.element_size()])
               for x, y in zip(a, b, strict=True)]
        raw = sum(t.numel() * t.element_size() for t in b)
        rows += [(wire, "whole model", raw), (wire, "whole model + zlib", z(b)),
                 (wire, "xor, no zlib (= the model's size)", raw), (wire, "xor + zlib", z(xor)),
                 (wire, "xor planes + zlib (the encoding)", z(model_delta.encode(a, b))),
                 (wire, "float subtraction + zlib (not exact)", z([y - x for x, y in zip(a, b, strict=True)]))]
    return rows


def _last_two_models(out: Path) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """The run's last two global models, from its checkpoints (the aggregator keeps two)."""
    found = list_checkpoints(out / "checkpoint")
    if len(found) < 2:
        return None
    return load_checkpoint(found[-2][1]).global_params, load_checkpoint(found[-1][1]).global_params


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
    down = [t.get("bytes_down", 0) / 1e6 for t in per_round]
    got = {"round_s": statistics.median(r["wall_s"] for r in recs),
           "up_mb": statistics.median(t.get("bytes_up", 0) for t in per_round) / 1e6,
           "down_mb": statistics.median(down), "down_first_mb": down[0],
           "down_later_mb": statistics.mean(down[1:]) if len(down) > 1 else float("nan"),
           "to_target_s": reached[0] if reached else float("nan"), "final_acc": recs[-1]["test_acc"]}
    pair = _last_two_models(out) if "delta" in encoding else None
    if pair is not None:
        got.update(delta_figures(*pair, _wire(encoding)))
        if encoding == "delta":
            print("real delta between the run's last two global models (bytes on the wire):", flush=True)
            for wire, form, n in delta_sizes(*pair):
                print(f"  {wire:>8} {form:<38} {n:>10,d}  ({n / 1e6:.2f} MB)", flush=True)
    return got


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
                fig = figures.get(enc) or {k: got.pop(k, float("nan")) for k in ("codec_ms", "model_wire_bytes")}
                row = {"mbit": mbit, "encoding": enc, **got, **fig,
                       "acc_cost": (base_acc - got["final_acc"]) if base_acc is not None else float("nan")}
                rows.append(row)
                print(f"{mbit:>5g} Mbit/s {enc:>9}: round {got['round_s']:6.2f}s  up {got['up_mb']:6.2f} MB  "
                      f"down {got['down_mb']:6.2f} MB (first round {got['down_first_mb']:.2f}, later "
                      f"{got['down_later_mb']:.2f})  to acc {args.target:g}: {got['to_target_s']:6.1f}s  "
                      f"final acc {got['final_acc']:.4f} (cost {row['acc_cost']:+.4f})  "
                      f"codec {fig['codec_ms']:6.1f} ms on loopback", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
