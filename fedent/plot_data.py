"""What the figures are drawn from, read out of run records (metrics.jsonl rows): pure, no matplotlib.

``fedent.plots`` draws these; ``fedent.experiments.reproduce_report`` summarises some of them in its tables.
The style of the two φ2 series is data too (``phi2_style.json`` beside this module, read by ``phi2_style``), so
``fedent plot`` and the dashboard's φ2 chart, which embeds the same file, draw them alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedent import runlog

Records = Sequence[Mapping[str, Any]]

PHI2_STYLE_FILE = Path(__file__).with_name("phi2_style.json")  # package data (pyproject.toml)
PHI2_KEYS = ("phi2_pred", "phi2_actual")
# What both readers can draw: matplotlib's linestyle names and marker codes, and the page's linechart.js.
DASHES = ("solid", "dashed", "dotted")
MARKERS = ("o", "s")
_COLOR = re.compile(r"#[0-9a-fA-F]{6}")


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """(rounds, values) of a top-level metric, skipping rounds where it was not measured."""
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if v is not None:
            xs.append(runlog.round_of(r))
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
            xs.append(runlog.round_of(r))
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
                xs.append(runlog.round_of(r))
                ys.append(float(v))
        if xs:
            out[key] = (xs, ys)
    return out


@dataclass(frozen=True)
class SeriesStyle:
    """How one φ2 series is drawn, in the page and in ``fedent plot`` alike."""

    key: str  # the trajectory field: phi2_pred or phi2_actual
    label: str  # legend text
    color: str  # #rrggbb
    dash: str  # one of DASHES
    marker: str  # one of MARKERS


def phi2_style(path: Path | None = None) -> tuple[SeriesStyle, ...]:
    """The two φ2 series' style from ``phi2_style.json`` (or ``path``), in legend order; ValueError if malformed."""
    path = PHI2_STYLE_FILE if path is None else path
    raw = json.loads(path.read_text(encoding="utf-8"))
    series = raw.get("series") if isinstance(raw, dict) else None
    if not isinstance(series, list):
        raise ValueError(f"{path}: needs a list 'series'")
    out = []
    fields = set(SeriesStyle.__dataclass_fields__)
    for item in series:
        if not isinstance(item, dict) or set(item) != fields or not all(isinstance(v, str) for v in item.values()):
            raise ValueError(f"{path}: each series needs exactly the text fields {', '.join(sorted(fields))}")
        st = SeriesStyle(**item)
        if not _COLOR.fullmatch(st.color):
            raise ValueError(f"{path}: {st.key}: color {st.color!r} is not #rrggbb")
        if st.dash not in DASHES:
            raise ValueError(f"{path}: {st.key}: dash {st.dash!r}; choose from {', '.join(DASHES)}")
        if st.marker not in MARKERS:
            raise ValueError(f"{path}: {st.key}: marker {st.marker!r}; choose from {', '.join(MARKERS)}")
        out.append(st)
    if sorted(st.key for st in out) != sorted(PHI2_KEYS):
        raise ValueError(f"{path}: needs one series for each of {', '.join(PHI2_KEYS)}")
    return tuple(out)


def phi2_style_json(path: Path | None = None) -> dict[str, Any]:
    """``phi2_style`` as the JSON the dashboard embeds in its page: ``{"series": [{key, label, ...}, ...]}``."""
    return {"series": [asdict(st) for st in phi2_style(path)]}


def local_accuracies(records: Records) -> list[tuple[int, list[float]]]:
    """Per evaluated round, the test accuracies of the sampled uploaded local models."""
    out = []
    for r in records:
        accs = (r.get("diagnostics") or {}).get("local_acc")
        if accs:
            out.append((runlog.round_of(r), [float(a) for a in accs]))
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
