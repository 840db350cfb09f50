"""fedent.plot_data: what the figures are drawn from, read out of run records (pure, no drawing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from plot_records import RECS

from fedent import plot_data


def test_extraction() -> None:
    # RECS carry no round_base: the old 0-based layout, so every round is shown one up (rounds 1..R)
    assert plot_data.series(RECS, "test_acc") == ([1, 3], [0.2, 0.6])
    assert plot_data.eta_trajectories(RECS) == {3: ([1, 3], [0.01, 0.03]), 7: ([1], [0.02])}
    assert plot_data.phi2_series(RECS)["phi2_actual"] == ([1, 3], [4.0, 6.5])
    assert plot_data.local_accuracies(RECS) == [(1, [0.1, 0.3]), (3, [0.5])]
    based = [{**r, "round": r["round"] + 1, "round_base": 1} for r in RECS]
    assert plot_data.series(based, "test_acc") == ([1, 3], [0.2, 0.6])


def test_mean_std_over_seeds_uses_common_rounds() -> None:
    other = [{"round": 0, "test_acc": 0.4}, {"round": 2, "test_acc": 0.8}, {"round": 3, "test_acc": 0.9}]
    xs, mean, std = plot_data.mean_std_curve([RECS, other], "test_acc")
    assert xs == [1, 3]  # old 0-based records, shown 1-based
    assert mean == pytest.approx([0.3, 0.7]) and std == pytest.approx([0.1414213562, 0.1414213562])
    assert plot_data.mean_std_curve([], "test_acc")[0] == []
    assert isinstance(mean, np.ndarray)


def test_phi2_style_is_the_file_in_legend_order() -> None:
    raw = json.loads((Path(plot_data.__file__).parent / "phi2_style.json").read_text(encoding="utf-8"))
    styles = plot_data.phi2_style()
    assert [s.key for s in styles] == ["phi2_pred", "phi2_actual"]
    assert plot_data.phi2_style_json() == {"series": raw["series"]}


@pytest.mark.parametrize(("change", "match"), [
    ({"dash": "dashdot"}, "dash 'dashdot'"),  # the page's linechart.js draws solid, dashed and dotted only
    ({"marker": "^"}, "marker '\\^'"),
    ({"color": "purple"}, "not #rrggbb"),
    ({"key": "entropy"}, "one series for each of phi2_pred, phi2_actual"),
    ({"width": "2"}, "exactly the text fields"),
])
def test_phi2_style_rejects_what_a_reader_cannot_draw(tmp_path: Path, change: dict[str, str], match: str) -> None:
    raw = plot_data.phi2_style_json()
    raw["series"][0].update(change)
    path = tmp_path / "style.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        plot_data.phi2_style(path)
