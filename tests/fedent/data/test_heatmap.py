"""The label-distribution heatmap is a real PNG and rejects malformed input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedent.data.heatmap import plot_label_heatmap


def test_writes_png(tmp_path: Path) -> None:
    counts = np.random.default_rng(0).integers(0, 50, (30, 10))
    counts[3] = 0  # an empty client must not divide by zero
    out = tmp_path / "sub" / "h.png"
    plot_label_heatmap(counts, out, title="test")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


@pytest.mark.parametrize("bad", [np.zeros(5), np.zeros((0, 3))])
def test_rejects_bad_shapes(tmp_path: Path, bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="clients x classes"):
        plot_label_heatmap(bad, tmp_path / "x.png")
