"""Paired comparisons over seeds: n, mean paired difference and its 95% t-interval (issue 29, item 2).

For one seed every row of a comparison shares partitions and participants, so the honest test is on the per-seed
*difference* (row − reference), not on two independent means. End points are the mean test accuracy of the last
``k`` evaluated rounds (``TAIL_K`` by default): one final round swings by several points from round to round.
With one seed there is no spread to report: the text says "n = 1", never "± 0.00".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TAIL_K = 5  # end point = mean of the last TAIL_K evaluated rounds' global test accuracy

# Two-sided 95% Student-t quantiles t_{0.975, df}, df = 1..30 (standard tables); no scipy needed.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """t_{0.975, df}: the table for df <= 30, the Cornish-Fisher expansion around z = 1.96 beyond (error < 1e-3)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def tail_mean(records: Sequence[Mapping[str, Any]], k: int = TAIL_K) -> float | None:
    """Mean global test accuracy over the last ``k`` evaluated rounds (fewer if the run evaluated fewer)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    accs = [float(r["test_acc"]) for r in records if r.get("test_acc") is not None]
    return sum(accs[-k:]) / len(accs[-k:]) if accs else None


@dataclass(frozen=True)
class Paired:
    n: int
    mean: float
    lo: float | None  # 95% t-interval of the mean paired difference; None when n = 1
    hi: float | None


def paired(values: Mapping[int, float | None], reference: Mapping[int, float | None]) -> Paired | None:
    """Mean of values[s] − reference[s] over the seeds both have, with its 95% t-interval (None: no common seed)."""
    diffs = [float(v) - float(r) for s, v in values.items()
             if v is not None and (r := reference.get(s)) is not None]
    n = len(diffs)
    if n == 0:
        return None
    mean = sum(diffs) / n
    if n == 1:
        return Paired(1, mean, None, None)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return Paired(n, mean, mean - half, mean + half)


def fmt(p: Paired | None, scale: float = 100.0, digits: int = 2) -> str:
    """'+1.50 [−0.20, +3.20] (n = 3)'; '+1.50 (n = 1, no interval)'; '—' without common seeds."""
    if p is None:
        return "—"
    m = f"{scale * p.mean:+.{digits}f}"
    if p.lo is None or p.hi is None:
        return f"{m} (n = 1, no interval)"
    return f"{m} [{scale * p.lo:+.{digits}f}, {scale * p.hi:+.{digits}f}] (n = {p.n})"


def as_dict(p: Paired | None) -> dict[str, Any] | None:
    return None if p is None else {"n": p.n, "mean": p.mean, "lo": p.lo, "hi": p.hi}
