"""What FedEnt's rate does, read from the run logs alone (docs/results.md "The mechanism", issue 17).

* ``solve_stats``: over every logged solve, the share of η*_i at 0 and at the cap U_i = min(B_i, eta_max), the
  sign rule (with p_i(0) = θ_i c/φ2' < 1/e, 1 + log p_i(0) < 0, so η*_i > 0 exactly where a_i = ⟨w, g_i⟩ < 0;
  docs/algorithm.md §5), the ramp of the used rate η_i(t) over the rounds, and the online φ2(t+1) prediction
  error at η* and at the rate actually used (recomputed from the logged scalars, spec §5).
* ``scale_response``: how η* moves when the loss is multiplied by s (g → s g: a → s a, b → s² b) or the weights
  by s (w → s w with F(w/s): a → a, b → b/s², c → s² c), against how a learning rate should move to give the
  same step (1/s and s²), with φ2' re-solved online each time.

* ``phi2_scores`` (issue 29, item 4): the mean field's φ2(t+1) against the naive guess ‖w(t)‖² (c: "no change"),
  per round: each one's relative error, how often the mean field is the closer one, and whether it gets the sign
  of the change right, sign(φ2' − c) = sign(φ2_actual − c), with Wilson 95% intervals over rounds (rounds of one
  run are not independent, so the intervals are optimistic). One scoring for both estimators, one entry each:
  ``online`` and ``offline`` (Algorithm 1's precomputed trajectory), read from each round's ``estimate.mode``.

Usage: ``python -m fedent.experiments.mechanism RUN_DIR [RUN_DIR ...] [--scale] [--phi2] [--pool]`` prints markdown
tables (``--pool``: the seeds of one comparison row, ``<row>-s<seed>``, pooled into one line).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedent import runlog
from fedent.meanfield.lr import solve_eta, upper_bound
from fedent.meanfield.scalar_fixed_point import solve_online

Records = Sequence[Mapping[str, Any]]
AT_BOUND_RTOL = 1e-9
SCALES = (0.1, 0.5, 1.0, 2.0, 10.0)


def _clients(rec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((rec.get("fedent") or {}).get("clients") or [])


def solve_stats(runs: Sequence[Records]) -> dict[str, Any] | None:
    """Pooled statistics of every FedEnt solve in ``runs`` (None when none holds FedEnt records)."""
    zero = bound = total = sign_cases = sign_ok = neg_a = 0
    first: list[float] = []
    last: list[float] = []
    peak = 0.0
    base: list[float] = []
    err_star: list[float] = []
    err_used: list[float] = []
    for recs in runs:
        fed = [r for r in recs if _clients(r)]
        if not fed:
            continue
        for i, rec in enumerate(fed):
            cl = _clients(rec)
            for c in cl:
                total += 1
                e = float(c["eta_star"])
                cap = c.get("eta_max")
                u = float(upper_bound(c["b"], c["c"], c["theta"], c["phi2_next"], float(c["beta"])))
                u = min(u, float(cap)) if cap is not None else u
                zero += e == 0.0
                bound += e > 0 and abs(e - u) <= AT_BOUND_RTOL * u
                neg_a += float(c["a"]) < 0
                if float(c["theta"]) * float(c["c"]) / float(c["phi2_next"]) < 1 / math.e:
                    sign_cases += 1
                    sign_ok += (e > 0) == (float(c["a"]) < 0)
                peak = max(peak, float(c["eta"]))
                if "eta_prev" in c and i == 0:
                    base.append(float(c["eta_prev"]))
            mean_eta = sum(float(c["theta"]) * float(c["eta"]) for c in cl)
            if i == 0:
                first.append(mean_eta)
            if i == len(fed) - 1:
                last.append(mean_eta)
            pred, actual = (rec.get("fedent") or {}).get("phi2_pred"), (rec.get("fedent") or {}).get("phi2_actual")
            if pred is not None and actual:
                rel_star, rel_used = _phi2_errors(cl, float(pred), float(actual))
                err_star.append(rel_star)
                if rel_used is not None:
                    err_used.append(rel_used)
    if total == 0:
        return None
    return {
        "solves": total,
        "zero": zero / total,
        "at_bound": bound / total,
        "a_negative": neg_a / total,
        "sign_rule_cases": sign_cases / total,
        "sign_rule_holds": sign_ok / sign_cases if sign_cases else None,
        "base_lr": float(np.median(base)) if base else None,
        "rate_first": float(np.mean(first)),
        "rate_last": float(np.mean(last)),
        "rate_peak": peak,
        "phi2_err_logged": float(np.median(err_star)) if err_star else None,
        "phi2_err_at_used": float(np.median(err_used)) if err_used else None,
    }


def _phi2_errors(cl: Sequence[Mapping[str, Any]], pred: float, actual: float) -> tuple[float, float | None]:
    """(|logged prediction − actual|/actual, |prediction re-solved at the used rate − actual|/actual)."""
    logged = abs(pred - actual) / actual
    if not _resolvable(cl):
        return logged, None
    return logged, abs(_used_prediction(cl) - actual) / actual


def _resolvable(cl: Sequence[Mapping[str, Any]]) -> bool:
    """The round logs what re-solving φ2' at the used rate needs (variant and η_i(t−1))."""
    return cl[0].get("variant") is not None and "eta_prev" in cl[0]


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson score 95% interval of a proportion k/n (None for n = 0)."""
    if n <= 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


ESTIMATORS = ("online", "offline")  # what a round's ``fedent.estimate.mode`` says (spec §3); other: "not logged"


def _estimator(fed: Mapping[str, Any]) -> str:
    """Which estimator gave the round's φ2(t+1): the mode its estimate report logged (online, offline)."""
    mode = (fed.get("estimate") or {}).get("mode")
    return str(mode) if mode in ESTIMATORS else "not logged"


def phi2_scores(runs: Sequence[Records]) -> dict[str, dict[str, Any]] | None:
    """The φ2(t+1) prediction scored per round against the naive guess c = ‖w(t)‖² and on the predicted change,
    one entry per estimator that made the runs' predictions (``online``, ``offline``: Algorithm 1's trajectory).

    Both are scored the same way: the prediction φ2' against c, the model the round's clients start from and
    solve their rates with, whichever estimator gave φ2' (an offline trajectory never sees w(t), so its
    predicted change φ2' − c includes how far the run has drifted from the trajectory). ``used``: the prediction
    re-solved online at the rate actually used (``_phi2_errors``), an online estimate in either case (for an
    offline run: what the online estimator would have said in the same rounds). None: no round with a
    prediction and an actual value."""
    rows: dict[str, list[tuple[float, float | None, float, float]]] = {}  # (pred, used-rate pred, c, actual)
    for recs in runs:
        for rec in recs:
            cl, fed = _clients(rec), rec.get("fedent") or {}
            pred, actual = fed.get("phi2_pred"), fed.get("phi2_actual")
            if not cl or pred is None or not actual:
                continue
            used = _used_prediction(cl) if _resolvable(cl) else None
            rows.setdefault(_estimator(fed), []).append((float(pred), used, float(cl[0]["c"]), float(actual)))
    if not rows:
        return None
    order = [e for e in ESTIMATORS if e in rows] + sorted(set(rows) - set(ESTIMATORS))
    return {e: {"estimator": e, **_scored(rows[e])} for e in order}


def _scored(rows: Sequence[tuple[float, float | None, float, float]]) -> dict[str, Any]:
    """Relative errors, the share of rounds closer than c, and the sign of the change, of (pred, used, c, actual)
    rows: the one scoring of every estimator."""
    out: dict[str, Any] = {"rounds": len(rows)}
    naive_err = [abs(c - act) / act for _, _, c, act in rows]
    out["naive_err"] = float(np.median(naive_err))
    for name, idx in (("logged", 0), ("used", 1)):
        preds: list[tuple[float, float, float]] = [(float(p_), r[2], r[3]) for r in rows
                                                   if (p_ := r[idx]) is not None]
        if not preds:
            out[name] = None
            continue
        err = [abs(p - act) / act for p, _, act in preds]
        closer = sum(abs(p - act) < abs(c - act) for p, c, act in preds)
        moved = [(p, c, act) for p, c, act in preds if act != c and p != c]
        agree = sum((p > c) == (act > c) for p, c, act in moved)
        out[name] = {"n": len(preds), "err": float(np.median(err)), "closer": closer / len(preds),
                     "closer_ci": wilson(closer, len(preds)), "sign_n": len(moved),
                     "sign": agree / len(moved) if moved else None, "sign_ci": wilson(agree, len(moved))}
    return out


def _used_prediction(cl: Sequence[Mapping[str, Any]]) -> float:
    """φ2(t+1) re-solved online with the decayed rates the clients trained with (spec §5, phi2_rate used)."""
    c0 = cl[0]
    return float(solve_online(float(c0["c"]), [float(c["theta"]) for c in cl], [float(c["a"]) for c in cl],
                              [float(c["b"]) for c in cl], float(c0["beta"]), str(c0["variant"]),
                              eta_max=None if c0.get("eta_max") is None else float(c0["eta_max"]),
                              eta_prev=[float(c["eta_prev"]) for c in cl], gamma=float(c0["gamma"])).phi2_next)


def _ci(p: float | None, ci: tuple[float, float] | None) -> str:
    if p is None or ci is None:
        return "—"
    return f"{p:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]"


def _pct2(v: float) -> str:
    """A relative error to two significant digits (φ2 moves by ~0.1% a round: a fixed 0.1% step hides it)."""
    return f"{100 * v:.2g}%"


def phi2_table(named: Mapping[str, Mapping[str, Mapping[str, Any]] | None]) -> list[str]:
    """One row per run, estimator and prediction (as logged; re-solved online at the used rate): n (the rounds
    scored), median relative errors of the prediction and of the naive ‖w(t)‖² guess, the share of rounds the
    prediction is closer, and its sign agreement on the change (over the rounds where both moved)."""
    lines = ["| run | estimator | φ2' | rounds (n) | median error, mean field | median error, ‖w(t)‖² guess | "
             "mean field closer [95% CI] | sign of the change right [95% CI] (rounds) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, by in named.items():
        for est, sc in (by or {}).items():
            for which, label in (("logged", "as logged"), ("used", "online, re-solved at the used rate")):
                row = sc.get(which)
                if row is None:
                    continue
                lines.append(f"| {name} | {est} | {label} | {row['n']} | {_pct2(row['err'])} | "
                             f"{_pct2(sc['naive_err'])} | {_ci(row['closer'], row['closer_ci'])} | "
                             f"{_ci(row['sign'], row['sign_ci'])} ({row['sign_n']}) |")
    return lines


def scale_response(rec: Mapping[str, Any], scales: Sequence[float] = SCALES,
                   eta_max: float | None = None) -> list[dict[str, float]]:
    """η* of one logged round's participants when the loss or the weights are multiplied by s (φ2' re-solved
    online at the star rate, so only the scale changes). Returns per s the median ratio η*(s)/η*(1) over the
    clients with η*(1) > 0 and the ratio a learning rate needs for the same step."""
    cl = _clients(rec)
    if not cl:
        raise ValueError("the record holds no FedEnt clients")
    c = float(cl[0]["c"])
    th = np.array([float(x["theta"]) for x in cl])
    a = np.array([float(x["a"]) for x in cl])
    b = np.array([float(x["b"]) for x in cl])
    beta, variant = float(cl[0]["beta"]), str(cl[0]["variant"])

    def etas(a_: np.ndarray, b_: np.ndarray, c_: float) -> np.ndarray:
        phi = solve_online(c_, th, a_, b_, beta, variant, eta_max=eta_max).phi2_next
        return solve_eta(a_, b_, c_, th, phi, beta, variant, eta_max=eta_max).eta_star

    ref = etas(a, b, c)
    live = ref > 0
    out = []
    for s in scales:
        loss = etas(a * s, b * s * s, c)
        weights = etas(a, b / (s * s), c * s * s)
        out.append({
            "s": float(s),
            "loss_ratio": float(np.median(loss[live] / ref[live])) if live.any() else math.nan,
            "loss_ideal": 1.0 / s,
            "weights_ratio": float(np.median(weights[live] / ref[live])) if live.any() else math.nan,
            "weights_ideal": s * s,
            "positive": float(live.mean()),
        })
    return out


def _f(v: float | None, spec: str = ".3g") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def stats_table(named: Mapping[str, dict[str, Any] | None]) -> list[str]:
    lines = ["| run | solves | η* = 0 | η* at cap | a < 0 | sign rule holds | base lr | mean η, first round | "
             "mean η, last round | max η | φ2' error (logged) | φ2' error at the used rate |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, st in named.items():
        if st is None:
            continue
        lines.append(
            f"| {name} | {st['solves']} | {st['zero']:.0%} | {st['at_bound']:.0%} | {st['a_negative']:.0%} | "
            f"{_f(st['sign_rule_holds'], '.1%')} of {st['sign_rule_cases']:.0%} | {_f(st['base_lr'])} | "
            f"{_f(st['rate_first'])} | {_f(st['rate_last'])} | {_f(st['rate_peak'])} | "
            f"{_f(st['phi2_err_logged'], '.1%')} | {_f(st['phi2_err_at_used'], '.1%')} |")
    return lines


def scale_table(rows: Sequence[Mapping[str, float]]) -> list[str]:
    lines = ["| s | loss × s: η*(s)/η*(1) | a rate needs | weights × s: η*(s)/η*(1) | a rate needs |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['s']:g} | {_f(r['loss_ratio'])} | {r['loss_ideal']:.3g} | {_f(r['weights_ratio'])} | "
                     f"{r['weights_ideal']:.3g} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedent.experiments.mechanism", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (each with a metrics.jsonl)")
    p.add_argument("--scale", action="store_true", help="also the scale response of the first run's first round")
    p.add_argument("--phi2", action="store_true", help="also φ2' scored against the ‖w(t)‖² guess and on the change")
    p.add_argument("--pool", action="store_true",
                   help="one row per run name without its -s<seed> suffix (a comparison's seeds pooled)")
    args = p.parse_args(argv)
    groups: dict[str, list[Records]] = {}
    for r in args.runs:
        name = re.sub(r"-s\d+$", "", Path(r).name) + " (pooled)" if args.pool else str(r)
        groups.setdefault(name, []).append(runlog.read_metrics(runlog.RunPaths(Path(r)).metrics))
    print("\n".join(stats_table({name: solve_stats(runs) for name, runs in groups.items()})))
    if args.phi2:
        print()
        print("\n".join(phi2_table({name: phi2_scores(runs) for name, runs in groups.items()})))
    if args.scale:
        recs = [r for r in runlog.read_metrics(runlog.RunPaths(Path(args.runs[0])).metrics) if _clients(r)]
        if not recs:
            print("no FedEnt round to scale", file=sys.stderr)
            return 1
        print()
        print("\n".join(scale_table(scale_response(recs[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
