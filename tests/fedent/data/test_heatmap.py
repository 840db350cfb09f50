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


def test_formats_and_dpi_like_fedent_plot(tmp_path: Path) -> None:
    """One file per format at the given dpi (it was a 100 dpi PNG only): 300 dpi is 3x the pixels of 100."""
    import struct

    counts = np.random.default_rng(1).integers(0, 50, (20, 10))
    made = plot_label_heatmap(counts, tmp_path / "h.png", formats=("png", "pdf", "svg"), dpi=300)
    assert made == [tmp_path / "h.png", tmp_path / "h.pdf", tmp_path / "h.svg"]
    assert made[1].read_bytes()[:5] == b"%PDF-" and b"<svg" in made[2].read_bytes()
    low = plot_label_heatmap(counts, tmp_path / "low.png", dpi=100)
    w300 = struct.unpack(">I", made[0].read_bytes()[16:20])[0]
    w100 = struct.unpack(">I", low[0].read_bytes()[16:20])[0]
    assert w300 == 3 * w100
    with pytest.raises(ValueError, match="choose from png, pdf, svg"):
        plot_label_heatmap(counts, tmp_path / "x.png", formats=("eps",))
