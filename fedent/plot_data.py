"""What the figures are drawn from, read out of run records (metrics.jsonl rows): pure, no matplotlib.

``fedent.plots`` draws these; ``fedent.experiments.reproduce_report`` summarises some of them in its tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Records = Sequence[Mapping[str, Any]]


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """(rounds, values) of a top-level metric, skipping rounds where it was not measured."""
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if v is not None:
            xs.append(int(r["round"]))
            ys.append(float(v))
    return xs, ys


def eta_trajectories(records: Records) -> dict[int, tuple[list[int], list[float]]]:
    """FedEnt's η_i(t) per client over the rounds it took part in (from the "fedent" diagnostics)."""
    out: dict[int, tuple[list[int], list[float]]] = {}
    for r in records:
        fd = r.get("fedent") or {}
        for row in fd.get("clients") or []:
            if row.get("eta") is None:
                continue
            xs, ys = out.setdefault(int(row["client"]), ([], []))
            xs.append(int(r["round"]))
            ys.append(float(row["eta"]))
    return out


def phi2_series(records: Records) -> dict[str, tuple[list[int], list[float]]]:
    """Predicted vs actual φ2(t+1) and the entropy of the uploads, per round."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for key in ("phi2_pred", "phi2_actual", "entropy"):
        xs, ys = [], []
        for r in records:
            v = (r.get("fedent") or {}).get(key)
            if v is not None:
                xs.append(int(r["round"]))
                ys.append(float(v))
        if xs:
            out[key] = (xs, ys)
    return out


def local_accuracies(records: Records) -> list[tuple[int, list[float]]]:
    """Per evaluated round, the test accuracies of the sampled uploaded local models."""
    out = []
    for r in records:
        accs = (r.get("diagnostics") or {}).get("local_acc")
        if accs:
            out.append((int(r["round"]), [float(a) for a in accs]))
    return out


def mean_std_curve(runs: Sequence[Records], key: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Mean and sample std over seeds of a metric, on the rounds every run measured."""
    per_run = [dict(zip(*series(recs, key), strict=True)) for recs in runs]
    if not per_run:
        return [], np.zeros(0), np.zeros(0)
    common = sorted(set.intersection(*(set(d) for d in per_run)))
    vals = np.array([[d[x] for x in common] for d in per_run], dtype=float).reshape(len(per_run), len(common))
    std = vals.std(axis=0, ddof=1) if len(per_run) > 1 else np.zeros(len(common))
    return common, vals.mean(axis=0), std  # sample std, as in compare.md
