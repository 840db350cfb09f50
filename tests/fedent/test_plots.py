"""fedent.plots: what a paper needs of the figures (files in every format, distinct styles, labelled band, no
titles on request, short ticks, legend off the data, an η figure readable with many clients, rounds numbered as
the CLI prints them)."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from PIL import Image
from plot_records import RECS, edited_phi2_style
from sim_support import tiny_config, tiny_inputs

from fedent import plot_data, plots

ALGOS = ["fedavg", "fedprox", "fedadam", "feddyn", "fedcos", "fednorm", "fedent", "fedent-paper", "scaffold"]


def _groups(n_algos: int = len(ALGOS), seeds: int = 3, rounds: int = 12) -> dict[str, list[list[dict[str, Any]]]]:
    rng = np.random.default_rng(0)
    return {a: [[{"round": r, "test_acc": 0.3 + 0.02 * r + rng.normal(0, 0.01), "train_loss": 2.0 - 0.1 * r,
                  "test_loss": 2.1 - 0.1 * r, "diagnostics": {"local_acc": [0.2 + 0.01 * r, 0.3]}}
                 for r in range(rounds)] for _ in range(seeds)] for a in ALGOS[:n_algos]}


def _fedent_run(n_clients: int, rounds: int = 12, per_round: int = 6) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    recs = []
    for r in range(rounds):
        chosen = rng.choice(n_clients, min(per_round, n_clients), replace=False)
        recs.append({"round": r, "test_acc": 0.5, "train_loss": 1.0, "diagnostics": {},
                     "fedent": {"phi2_pred": 5.0 + r, "phi2_actual": 5.1 + r,
                                "entropy": -float(np.log(per_round)) + float(rng.normal(0, 1e-7)),
                                "clients": [{"client": int(c), "eta": float(0.01 * np.exp(rng.normal()))}
                                            for c in chosen]}})
    return recs


def _drawn(fig: Figure | None) -> Figure:
    assert fig is not None
    FigureCanvasAgg(fig).draw()
    return fig


def _all_figures(style: plots.FigureStyle = plots.DEFAULT_STYLE) -> list[Figure]:
    g = _groups()
    return [_drawn(f) for f in (
        plots.draw_curves(g, "test_acc", "test accuracy", "a title", style),
        plots.draw_acc_loss(g, "a title", style),
        plots.draw_local_spread(g, style),
        plots.draw_eta(_fedent_run(20), style=style),
        plots.draw_eta(_fedent_run(5, per_round=3), style=style),
        plots.draw_phi2(_fedent_run(20), style),
    )]


def test_plot_groups_writes_every_format_readable_at_300_dpi(tmp_path: Path) -> None:
    style = plots.FigureStyle(formats=("png", "pdf", "svg"))
    made = plots.plot_groups({"fedent": [RECS]}, tmp_path, style=style)
    stems = ["accuracy", "train_loss", "local_acc", "eta", "phi2"]  # no test_loss in RECS
    assert sorted(p.name for p in made) == sorted(f"{s}.{f}" for s in stems for f in ("png", "pdf", "svg"))
    for p in made:
        data = p.read_bytes()
        if p.suffix == ".png":
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
            with Image.open(io.BytesIO(data)) as im:
                assert im.info["dpi"] == pytest.approx((300, 300), abs=0.1)
        elif p.suffix == ".pdf":
            assert data[:5] == b"%PDF-" and b"%%EOF" in data[-32:]
        else:
            assert ET.fromstring(data).tag == "{http://www.w3.org/2000/svg}svg"
    assert plots.plot_run(tmp_path / "empty") == []


def test_style_rejects_unknown_formats() -> None:
    with pytest.raises(ValueError, match="eps"):
        plots.FigureStyle(formats=("png", "eps"))
    with pytest.raises(ValueError):
        plots.FigureStyle(dpi=0)


def test_every_algorithm_has_its_own_marker_and_line_style() -> None:
    pairs = {(s["marker"], str(s["linestyle"])) for s in map(plots.line_style, range(72))}
    assert len(pairs) == 72
    fig = _drawn(plots.draw_curves(_groups(), "test_acc", "test accuracy"))
    lines = fig.axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ALGOS
    assert len({(ln.get_marker(), ln.get_linestyle()) for ln in lines}) == len(ALGOS) >= 7
    # identical curves (FedProx = FedAvg here) still show both: their markers sit on different rounds
    avg, prox = lines[0], lines[1]
    every = [ln.get_markevery() for ln in (avg, prox)]
    assert every[0] != every[1]


def test_the_shaded_band_is_named_in_the_legend() -> None:
    fig = _drawn(plots.draw_curves(_groups(seeds=3), "test_acc", "test accuracy"))
    assert "shaded: ±1 sd over 3 seeds" in [t.get_text() for t in fig.legends[0].get_texts()]
    one_seed = _drawn(plots.draw_curves(_groups(seeds=1), "test_acc", "test accuracy"))
    assert not any("sd" in t.get_text() for t in one_seed.legends[0].get_texts())  # no band, no entry
    spread = _drawn(plots.draw_local_spread(_groups()))
    assert any("±1 sd over the uploaded local models" in t.get_text() for t in spread.legends[0].get_texts())


def test_no_title_leaves_no_title() -> None:
    with_titles = _all_figures()
    assert all(any(ax.get_title() for ax in f.axes) or f.get_suptitle() for f in with_titles)
    for fig in _all_figures(plots.FigureStyle(titles=False)):
        assert fig.get_suptitle() == ""
        assert all(ax.get_title(loc) == "" for ax in fig.axes for loc in ("left", "center", "right"))


def test_legend_lies_outside_every_axes() -> None:
    for fig in _all_figures():
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        for leg in legends:
            box = leg.get_window_extent(renderer)
            for ax in fig.axes:
                assert not box.overlaps(ax.get_window_extent(renderer)), (leg, ax)


def test_entropy_ticks_are_short_and_distinct() -> None:
    fig = _drawn(plots.draw_phi2(_fedent_run(20)))
    ax = fig.axes[1]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3 and len(set(labels)) == len(labels)
    assert all(len(t) <= 5 for t in labels), labels  # not −1.7917595
    assert "[×1e-7]" in ax.get_ylabel() and "−1.79175" in ax.get_ylabel().replace("-", "−")
    flat = _fedent_run(4)
    for r in flat:
        r["fedent"]["entropy"] = -1.5
    ax = _drawn(plots.draw_phi2(flat)).axes[1]
    assert all(len(t.get_text()) <= 5 for t in ax.get_yticklabels())


def test_eta_with_many_clients_is_a_heatmap_one_row_per_client() -> None:
    recs = _fedent_run(20, rounds=12)
    fig = _drawn(plots.draw_eta(recs))
    ax = fig.axes[0]
    images = [im for im in ax.get_images() if isinstance(im, AxesImage)]
    assert len(images) == 1 and not ax.get_lines()
    arr = images[0].get_array()
    assert arr is not None and arr.shape == (20, 12)
    traj = plot_data.eta_trajectories(recs)
    cid = sorted(traj)[3]
    xs, ys = traj[cid]
    assert [float(arr[3, x - 1]) for x in xs] == pytest.approx(ys)
    assert int(np.ma.count_masked(arr)) == 20 * 12 - sum(len(v[0]) for v in traj.values())  # grey = not sampled
    assert len(fig.axes) == 2 and "η_i(t)" in fig.axes[1].get_ylabel()  # colour bar
    assert images[0].get_extent()[:2] == [0.5, 12.5]  # columns are rounds 1..12
    few = _drawn(plots.draw_eta(_fedent_run(5, per_round=3)))
    assert len(few.axes[0].get_lines()) == 5 and not few.axes[0].get_images()


def test_rounds_are_numbered_as_the_cli_prints_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedent.sim.simulator import run_simulation

    # without a terminal the simulator prints one plain "round k/R" line per round on stdout
    res = run_simulation(tiny_config(rounds=3), tmp_path / "r", progress=True, inputs=tiny_inputs(), plots=False)
    printed = [int(m) for m in re.findall(r"round (\d+)/3", capsys.readouterr().out)]
    assert printed == [1, 2, 3]
    fig = _drawn(plots.draw_curves({"fedavg": [res.records]}, "train_loss", "training loss"))
    assert list(fig.axes[0].get_lines()[0].get_xdata()) == printed
    assert fig.axes[0].get_xlabel() == "round"


def _phi2_lines(fig: Figure) -> list[dict[str, str]]:
    """What the φ2 figure drew for each series, in the style file's terms."""
    return [{"label": str(ln.get_label()), "color": to_hex(ln.get_color()), "linestyle": str(ln.get_linestyle()),
             "marker": str(ln.get_marker())} for ln in fig.axes[0].get_lines()]


def _as_drawn(series: list[dict[str, str]]) -> list[dict[str, str]]:
    """The style file's series as matplotlib reports them back ("dashed" -> "--")."""
    def linestyle(dash: Any) -> str:
        return str(Line2D([], [], linestyle=dash).get_linestyle())

    return [{"label": s["label"], "color": s["color"].lower(), "linestyle": linestyle(s["dash"]),
             "marker": s["marker"]} for s in series]


def test_phi2_lines_are_styled_by_the_style_file_the_dashboard_embeds() -> None:
    """fedent plot and the dashboard's φ2 chart draw the two series from fedent/phi2_style.json alone (the page's
    side: tests/server/dashboard/test_page.py and the browser tests)."""
    raw = json.loads((Path(plots.__file__).parent / "phi2_style.json").read_text(encoding="utf-8"))
    fig = _drawn(plots.draw_phi2(_fedent_run(5)))
    assert _phi2_lines(fig) == _as_drawn(raw["series"])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [s["label"] for s in raw["series"]]


def test_phi2_figure_follows_an_edited_style_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = edited_phi2_style(tmp_path, monkeypatch)
    assert _phi2_lines(_drawn(plots.draw_phi2(_fedent_run(5)))) == _as_drawn(edited["series"])


def test_entropy_is_drawn_as_its_deviation_from_minus_log_n_with_a_plain_label() -> None:
    """With the round's upload count n logged, the panel shows Σ p_i log p_i + log n (0: uniform) scaled by a
    power of ten named in a plain label, not 'Σ p_i log p_i − (−1.7917595) [×1e-7]'."""
    recs = _fedent_run(20, per_round=6)
    for r in recs:
        r["num_clients"] = 6
    ax = _drawn(plots.draw_phi2(recs)).axes[1]
    assert ax.get_ylabel() == "entropy − (−log n) [×1e-7]"
    (line,) = ax.get_lines()
    want = [(r["fedent"]["entropy"] + np.log(6)) * 1e7 for r in recs]
    assert list(line.get_ydata()) == pytest.approx(want, rel=1e-6)
    assert list(line.get_xdata()) == list(range(1, 13))
