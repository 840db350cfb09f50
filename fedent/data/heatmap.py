"""The label-distribution heatmap of a partition (like the paper's Fig. Dirichlet_data_distribution).

Drawn on an explicit Agg canvas (no pyplot), so it never touches matplotlib's global state or a display.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_label_heatmap(label_counts: np.ndarray, path: Path, title: str = "") -> None:
    """PNG of clients (x) by classes (y); colour = the share of each class in the client's data."""
    counts = np.asarray(label_counts, dtype=np.float64)
    if counts.ndim != 2 or counts.size == 0:
        raise ValueError(f"label_counts must be a non-empty clients x classes matrix, got shape {counts.shape}")
    num_clients, num_classes = counts.shape
    totals = counts.sum(axis=1, keepdims=True)
    ratio = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    width = min(16.0, max(5.0, 0.08 * num_clients + 2.0))
    height = min(12.0, max(3.0, 0.12 * num_classes + 1.5))
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(ratio.T, aspect="auto", origin="lower", cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, label="label ratio")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), format="png")
