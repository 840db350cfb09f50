"""The label-distribution heatmap of a partition (like the paper's Fig. Dirichlet_data_distribution).

Drawn on an explicit Agg canvas (no pyplot), so it never touches matplotlib's global state or a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FORMATS = ("png", "pdf", "svg")


def plot_label_heatmap(label_counts: np.ndarray, path: Path, title: str = "", formats: tuple[str, ...] = ("png",),
                       dpi: int = 300) -> list[Path]:
    """Clients (x) by classes (y); colour = the share of each class in the client's data. One file per format
    (``path``'s suffix replaced by the format's), at ``dpi``, like
    ``fedent plot``'s figures; returns the paths written."""
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats or dpi <= 0:
        raise ValueError(f"heatmap: formats {', '.join(bad) or formats} / dpi {dpi}; choose from "
                         f"{', '.join(FORMATS)}, dpi > 0")
    counts = np.asarray(label_counts, dtype=np.float64)
    if counts.ndim != 2 or counts.size == 0:
        raise ValueError(f"label_counts must be a non-empty clients x classes matrix, got shape {counts.shape}")
    num_clients, num_classes = counts.shape
    totals = counts.sum(axis=1, keepdims=True)
    ratio = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    width = min(16.0, max(5.0, 0.08 * num_clients + 2.0))
    height = min(12.0, max(3.0, 0.12 * num_classes + 1.5))
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(ratio.T, aspect="auto", origin="lower", cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, label="label ratio")
    fig.tight_layout()
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in formats:
        p = base.with_suffix(f".{fmt}")
        meta: dict[str, Any] = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt, {})
        fig.savefig(str(p), format=fmt, dpi=dpi, metadata=meta)
        out.append(p)
    return out
