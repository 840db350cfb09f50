"""Cost of secure aggregation per round: the same simulator run plain, with ``privacy.secure_aggregation`` in the
honest-but-curious variant, and in the malicious-server one (signed keys and the consistency check, the default).

Workload: MNIST-CNN on the seeded synthetic 28x28 dataset, ``--clients`` clients split IID, ``--per-round`` of
them per round, 1 local epoch, batch 32, FedAvg, CPU. Both sides run through ``fedent.sim.run_simulation`` (the
one engine and in-process host), alternating plain and secure ``--repeats`` times in this process; a round's time
is its metrics.jsonl ``wall_s``, round 0 (warm-up) and the last round (the only evaluation) left out. Secure rounds
pay the protocol's key agreement, Shamir shares and sealing (O(k) per client for SecAgg+ degree k, all pairs when
``--degree 0``), each client's fixed-point encoding and k + 1 AES-CTR masks of the model's size, and the server's
unmasking; the malicious variant adds Ed25519 signatures on the keys (verified by every neighbour) and the
consistency round (each survivor signs U3 and verifies the forwarded signatures: O(n) verifications per client).
Also reports the secure model's relative difference from the plain one (the fixed-point rounding).

    .venv/bin/python benchmarks/bench_secagg.py [--rounds 4 --clients 50 --per-round 10 --degree 0 --json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import torch

from fedent.config import PrivacyConfig, SecAggThreat, config_from_dict
from fedent.sim import run_simulation

SIDES = ("plain", "honest-but-curious", "malicious")


def config(args: argparse.Namespace, side: str) -> Any:
    cfg = config_from_dict({
        "name": "bench-secagg",
        "data": {"name": "synthetic", "num_clients": args.clients, "partition": "iid",
                 "synthetic_train": args.clients * args.samples, "synthetic_test": 200},
        "model": {"name": "mnist-cnn"},
        "train": {"rounds": args.rounds, "fraction": args.per_round / args.clients, "local_epochs": 1,
                  "batch_size": 32, "lr": 0.01, "seed": 0, "device": "cpu", "eval_every": args.rounds},
        "algorithm": {"name": "fedavg"},
    })
    if side == "plain":
        return cfg
    return dataclasses.replace(cfg, privacy=PrivacyConfig(secure_aggregation=True, secagg_degree=args.degree,
                                                          secagg_threat=cast(SecAggThreat, side)))


def one_run(args: argparse.Namespace, side: str) -> tuple[list[float], list[torch.Tensor]]:
    with tempfile.TemporaryDirectory() as tmp:
        res = run_simulation(config(args, side), Path(tmp) / "run", progress=False, plots=False)
    return [float(r["wall_s"]) for r in res.records[1:-1]], res.params


def protocol_only(n_params: int, clients: int, degree: int, threat: str) -> tuple[float, float, float, float]:
    """The protocol without training, at the model's size: (key setup for the round, one client's quantise + mask,
    the consistency check (0 when honest-but-curious), the server's unmasking), seconds, on the same in-process
    host the simulator uses. A fresh identity PKI each call, as a new run would derive."""
    import time

    from fedent.secagg.hosted import HostedSecAgg
    from fedent.secagg.protocol import ServerSession, Setup
    from fedent.strategies.base import ClientUpdate

    cids = list(range(clients))
    t0 = time.perf_counter()
    host = HostedSecAgg(0, threat)
    srv = ServerSession(Setup(0, 64, 24, "nearest", "samples", (), clients, threat), cids, degree, 0.6, 1, host.pki)

    def ask(reqs: Any) -> dict[int, bytes]:
        return {c: host.handle(0, c, r) for c, r in reqs.items()}

    srv.take_advertise(ask(srv.advertise_requests()))
    srv.take_share(ask(srv.share_requests()[0]))
    ask(srv.route_requests())
    t1 = time.perf_counter()
    masked = {c: host.mask(0, ClientUpdate(c, [torch.randn(n_params)], 100, 0.0)).masked for c in cids}
    t2 = time.perf_counter()
    if threat == "malicious":
        srv.take_consistency(ask(srv.consistency_requests(cids)))
    t3 = time.perf_counter()
    srv.unmask(masked, ask(srv.unmask_requests(cids)))
    return t1 - t0, (t2 - t1) / clients, t3 - t2, time.perf_counter() - t3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--samples", type=int, default=64, help="training samples per client")
    ap.add_argument("--degree", type=int, default=0, help="SecAgg+ neighbours per client (0: all pairs)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    params: dict[str, list[torch.Tensor]] = {}
    for _ in range(args.repeats):
        for side in SIDES:
            t, params[side] = one_run(args, side)
            times[side] += t
    med = {side: statistics.median(times[side]) for side in SIDES}
    plain, hbc, mal = med["plain"], med["honest-but-curious"], med["malicious"]
    num = sum(float((a.double() - b.double()).norm() ** 2) for a, b in zip(params["malicious"], params["plain"],
                                                                           strict=True)) ** 0.5
    den = sum(float(b.double().norm() ** 2) for b in params["plain"]) ** 0.5
    n_params = sum(p.numel() for p in params["plain"])
    degree = args.degree or "all pairs"
    out: dict[str, Any] = {"model_params": n_params, "clients_per_round": args.per_round, "degree": degree,
                           "plain_round_s": plain, "hbc_round_s": hbc, "malicious_round_s": mal,
                           "ratio_hbc_to_plain": hbc / plain, "ratio_malicious_to_plain": mal / plain,
                           "ratio_malicious_to_hbc": mal / hbc, "model_rel_diff": num / den,
                           "same_model_hbc_malicious": all(bool(torch.equal(a, b)) for a, b in zip(
                               params["honest-but-curious"], params["malicious"], strict=True)),
                           "rounds_timed": len(times["plain"])}
    print(f"secure aggregation, {args.per_round} clients/round, {n_params} parameters, degree {degree}: plain "
          f"{plain * 1e3:.1f} ms/round, honest-but-curious {hbc * 1e3:.1f} ({hbc / plain:.3f}x plain), malicious "
          f"(consistency check) {mal * 1e3:.1f} ({mal / plain:.3f}x plain, {mal / hbc:.3f}x honest-but-curious); "
          f"model relative difference {num / den:.2e}; the two secure models equal: "
          f"{out['same_model_hbc_malicious']}")
    for size, label in ((n_params, "model size"), (1000, "1000 parameters: the fixed cost")):
        for threat in SIDES[1:]:  # medians of 5 alternating tries: the crypto is small beside the load's noise
            tries = [protocol_only(size, args.per_round, args.degree, threat) for _ in range(5 if size < 10**5 else 1)]
            setup_s, mask_s, check_s, unmask_s = (statistics.median(x) for x in zip(*tries, strict=True))
            out[f"protocol_{threat}_{size}"] = {"setup_s": setup_s, "mask_s_per_client": mask_s,
                                                "check_s": check_s, "unmask_s": unmask_s}
            print(f"protocol alone, {label} ({threat}): key setup {setup_s * 1e3:.1f} ms/round, quantise + mask "
                  f"{mask_s * 1e3:.1f} ms per client, consistency check {check_s * 1e3:.1f} ms/round, unmask "
                  f"{unmask_s * 1e3:.1f} ms/round")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
