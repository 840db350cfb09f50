"""fedent.plots: what the figures are drawn from (extraction is pure; drawing is checked by file output)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedent import plots

RECS = [
    {"round": 0, "test_acc": 0.2, "train_loss": 2.0, "diagnostics": {"local_acc": [0.1, 0.3]},
     "fedent": {"phi2_pred": 5.0, "phi2_actual": 4.0, "entropy": -1.2,
                "clients": [{"client": 3, "eta": 0.01}, {"client": 7, "eta": 0.02}]}},
    {"round": 1, "test_acc": None, "train_loss": 1.5, "diagnostics": {}, "fedent": None},
    {"round": 2, "test_acc": 0.6, "train_loss": 1.0, "diagnostics": {"local_acc": [0.5]},
     "fedent": {"phi2_pred": 6.0, "phi2_actual": 6.5, "entropy": -1.1, "clients": [{"client": 3, "eta": 0.03}]}},
]


def test_extraction() -> None:
    assert plots.series(RECS, "test_acc") == ([0, 2], [0.2, 0.6])
    assert plots.eta_trajectories(RECS) == {3: ([0, 2], [0.01, 0.03]), 7: ([0], [0.02])}
    assert plots.phi2_series(RECS)["phi2_actual"] == ([0, 2], [4.0, 6.5])
    assert plots.local_accuracies(RECS) == [(0, [0.1, 0.3]), (2, [0.5])]


def test_mean_std_over_seeds_uses_common_rounds() -> None:
    other = [{"round": 0, "test_acc": 0.4}, {"round": 2, "test_acc": 0.8}, {"round": 3, "test_acc": 0.9}]
    xs, mean, std = plots.mean_std_curve([RECS, other], "test_acc")
    assert xs == [0, 2]
    assert mean == pytest.approx([0.3, 0.7]) and std == pytest.approx([0.1414213562, 0.1414213562])
    assert plots.mean_std_curve([], "test_acc")[0] == []
    assert isinstance(mean, np.ndarray)


def test_plot_groups_writes_pngs_and_skips_missing(tmp_path: Path) -> None:
    made = plots.plot_groups({"fedent": [RECS]}, tmp_path)
    names = sorted(p.name for p in made)
    assert names == sorted(["accuracy.png", "eta.png", "local_acc.png", "phi2.png", "train_loss.png"])  # no test_loss
    for p in made:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plots.plot_run(tmp_path / "empty") == []
