"""Figures from run logs (metrics.jsonl only, so finished and live runs plot the same way).

Uses matplotlib's object API with the Agg canvas (no pyplot, no global state, no display needed).
Figures are meant for a paper: PNG/PDF/SVG at 300 dpi (``FigureStyle``), a distinct marker and line style per
curve, the shaded band named in the legend (±1 sd over seeds), the legend outside the axes, optional titles,
and rounds counted as the CLI prints them (1..R). The figures follow the paper: accuracy and loss curves per
algorithm (Figs. ex_mnist..ex_cifar100), FedEnt's per-client learning rates (Eq. eta_deacy), the mean-field
prediction of φ2 against the actual value (Definition 2), and the accuracy spread of uploaded local models
(Fig. client_dev). What they are drawn from is read out of the records by ``fedent.plot_data``.
``FigureStyle(paper=True)`` (``fedent plot --style paper``) makes one-column figures: 3.4 in (or ``width``),
7 pt text, panels stacked, the legend below the axes; the uploads' entropy is drawn as its deviation from −log n.

Why ~440 lines in one module: every figure shares the style, legend, round-axis and saving helpers above
them, and each figure is a short function; splitting per figure would export those private helpers.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator, ScalarFormatter

from fedent import runlog
from fedent.plot_data import Records, eta_trajectories, local_accuracies, mean_std_curve, phi2_series, phi2_style

# ---- style -----------------------------------------------------------------------------------------

FORMATS = ("png", "pdf", "svg")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)))
MAX_ETA_LINES = 8  # more clients than this: the η figure is a heatmap (one row per client), not overlapping lines


@dataclass(frozen=True)
class FigureStyle:
    """How figures are written: file formats (one file per format, same stem), resolution, titles or not;
    ``width`` (inches) sets every figure's width; ``paper``: one-column figures (``PAPER_WIDTH`` unless
    ``width`` says otherwise) with 7 pt text, panels stacked and the legend below the axes."""

    formats: tuple[str, ...] = ("png",)
    dpi: int = 300
    titles: bool = True
    width: float | None = None
    paper: bool = False

    def __post_init__(self) -> None:
        if self.width is not None and not 1.0 <= self.width <= 20.0:
            raise ValueError(f"width: {self.width} inches; expected 1 to 20 (one column: 3.3-3.5)")
        bad = [f for f in self.formats if f not in FORMATS]
        if bad or not self.formats:
            raise ValueError(f"formats: {', '.join(bad) or '(none)'}; choose from {', '.join(FORMATS)}")
        if self.dpi <= 0:
            raise ValueError("dpi: must be > 0")


DEFAULT_STYLE = FigureStyle()
PAPER_WIDTH = 3.4  # inches: one column of a two-column paper (3.3-3.5 in)
PAPER_RC: dict[str, Any] = {"font.size": 7, "axes.titlesize": 7, "axes.labelsize": 7, "xtick.labelsize": 6,
                            "ytick.labelsize": 6, "legend.fontsize": 6, "lines.markersize": 3, "lines.linewidth": 1.0}


def _figure(style: FigureStyle, size: tuple[float, float], panels: int = 1) -> Figure:
    """A figure of the default ``size`` (panels side by side), or ``style``'s width: the height scaled with
    it, and under ``paper`` each panel 0.7 x the width tall, the panels stacked."""
    w, h = size
    if style.paper:
        width = style.width or PAPER_WIDTH
        return Figure(figsize=(width, 0.7 * width * panels + 0.35), layout="constrained")
    if style.width is not None:
        return Figure(figsize=(style.width, h * style.width / w), layout="constrained")
    return Figure(figsize=size, layout="constrained")


def _panel(fig: Figure, style: FigureStyle, panels: int, i: int) -> Axes:
    """The i-th (1-based) of ``panels`` axes: side by side, or stacked for a paper column."""
    return fig.add_subplot(panels, 1, i) if style.paper else fig.add_subplot(1, panels, i)


def line_style(i: int) -> dict[str, Any]:
    """Colour, marker and line style of the i-th curve: every (marker, linestyle) pair differs up to i = 71,
    so curves stay apart in greyscale and where they lie on top of each other (FedProx over FedAvg)."""
    return {"color": f"C{i % 10}", "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINESTYLES[(i + i // len(_MARKERS)) % len(_LINESTYLES)]}


ROUND_LABEL = "round"


def _plot_curve(ax: Axes, xs: Sequence[int], ys: Any, i: int, label: str,
                look: Mapping[str, Any] | None = None) -> None:
    """The i-th curve, styled by ``line_style(i)`` unless ``look`` (color, marker, linestyle) is given."""
    n = len(xs)
    every = max(1, -(-n // 8))
    # markers at most ~10 per curve, shifted per curve so overlapping curves still show each marker
    ax.plot([int(x) for x in xs], ys, label=label, ms=4, lw=1.3, markevery=(i % every, every),
            **(line_style(i) if look is None else look))


def _band(ax: Axes, xs: Sequence[int], mean: Any, std: Any, i: int) -> None:
    ax.fill_between([int(x) for x in xs], mean - std, mean + std, alpha=0.15, color=f"C{i % 10}", lw=0)


def _band_handle(what: str) -> Patch:
    return Patch(facecolor="0.5", alpha=0.3, label=f"shaded: ±1 sd {what}")


def _legend(fig: Figure, handles: Sequence[Any] | None = None, style: FigureStyle = DEFAULT_STYLE) -> None:
    """One legend for the figure, outside the axes, never over data: on the right (centred, clear of the
    title), or for a paper column below the axes in two columns, where it does not narrow the plot."""
    if handles is None:
        handles = [h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]]
    if not handles:
        return
    if style.paper:
        fig.legend(handles=list(handles), loc="outside lower center", ncols=min(2, len(handles)), frameon=False)
    else:
        fig.legend(handles=list(handles), loc="outside right center", fontsize=8, frameon=False)


def _title(obj: Axes | Figure, text: str, style: FigureStyle) -> None:
    if not style.titles or not text:
        return
    if isinstance(obj, Figure):
        # wrapped to the figure's width (about 13 characters an inch at this size), so a long title never runs
        # under the legend
        width = max(30, int(obj.get_figwidth() * (15 if style.paper else 13)))
        obj.suptitle(textwrap.fill(text, width), fontsize=8 if style.paper else 11)
    else:
        obj.set_title(text)


def _round_axis(ax: Axes) -> None:
    ax.set_xlabel(ROUND_LABEL)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    lo, hi = ax.get_xlim()
    if hi - lo < 2:  # one or two rounds: widen so the ticks are whole rounds, not 0.945, 0.960, ...
        mid = (lo + hi) / 2
        ax.set_xlim(mid - 1, mid + 1)


def save(fig: Figure, path: str | Path, style: FigureStyle = DEFAULT_STYLE) -> list[Path]:
    """Write ``fig`` once per format of ``style`` (``path``'s suffix is replaced); the paths, in format order."""
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    sized = style.paper or style.width is not None
    out = []
    for fmt in style.formats:
        p = base.with_suffix(f".{fmt}")
        # fixed metadata (no creation date) so regenerated figures only differ when their content does
        meta: dict[str, Any] = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}.get(fmt, {})
        with rc_context({"pdf.fonttype": 42}):  # TrueType in PDFs: Type 3 fonts are refused by some publishers
            # a width asked for is the file's width (constrained layout fits the content into it); otherwise
            # trimmed to what is drawn
            fig.savefig(p, dpi=style.dpi, bbox_inches=None if sized else "tight", metadata=meta)
        out.append(p)
    return out


def _seeds_text(runs_per_group: Sequence[int]) -> str:
    lo, hi = min(runs_per_group), max(runs_per_group)
    return f"over {lo} seeds" if lo == hi else f"over {lo}–{hi} seeds"


# ---- drawing ---------------------------------------------------------------------------------------
# draw_* build a Figure (or None when there is nothing to draw); plot_* draw and save it in every format.

def draw_curves(groups: Mapping[str, Sequence[Records]], key: str, ylabel: str, title: str = "",
                style: FigureStyle = DEFAULT_STYLE) -> Figure | None:
    """One metric per round, mean over seeds per group, ±1 sd band where a group has several seeds."""
    fig = _figure(style, (6.5, 4))
    ax = fig.add_subplot()
    drawn, banded = False, []
    for i, (name, runs) in enumerate(groups.items()):
        xs, mean, std = mean_std_curve(runs, key)
        if not xs:
            continue
        _plot_curve(ax, xs, mean, i, name)
        if len(runs) > 1:
            _band(ax, xs, mean, std, i)
            banded.append(len(runs))
        drawn = True
    if not drawn:
        return None
    _round_axis(ax)
    ax.set_ylabel(ylabel)
    _title(ax, title, style)
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()[0]
    _legend(fig, handles + ([_band_handle(_seeds_text(banded))] if banded else []), style)
    return fig


def _eta_matrix(traj: Mapping[int, tuple[list[int], list[float]]]) -> tuple[list[int], list[int], np.ndarray]:
    """(client ids, logged rounds first..last, η[client, round] with NaN where the client did not take part)."""
    clients = sorted(traj)
    first = min(min(xs) for xs, _ in traj.values())
    last = max(max(xs) for xs, _ in traj.values())
    rounds = list(range(first, last + 1))
    m = np.full((len(clients), len(rounds)), np.nan)
    for row, cid in enumerate(clients):
        for x, y in zip(*traj[cid], strict=True):
            m[row, x - first] = y
    return clients, rounds, m


def draw_eta(records: Records, title: str = "FedEnt per-client learning rate η_i(t)",
             style: FigureStyle = DEFAULT_STYLE) -> Figure | None:
    """η_i(t) per client: lines up to MAX_ETA_LINES clients, otherwise a clients x rounds heatmap (grey where a
    client was not sampled), which stays readable with 100 clients."""
    traj = eta_trajectories(records)
    if not traj:
        return None
    full_title = f"{title} ({len(traj)} clients)"
    if len(traj) <= MAX_ETA_LINES:
        fig = _figure(style, (6.5, 4))
        ax = fig.add_subplot()
        for i, cid in enumerate(sorted(traj)):
            xs, ys = traj[cid]
            _plot_curve(ax, xs, np.asarray(ys), i, f"client {cid}")
        _round_axis(ax)
        ax.set_ylabel("η_i(t) (rounds the client took part in)")
        ax.grid(alpha=0.3)
        _title(ax, full_title, style)
        _legend(fig, style=style)
        return fig
    clients, rounds, m = _eta_matrix(traj)
    fig = _figure(style, (6.5, min(9.0, 2.0 + 0.1 * len(clients))))
    ax = fig.add_subplot()
    vals = m[~np.isnan(m)]
    lo, hi = float(vals.min()), float(vals.max())
    norm: Normalize = LogNorm(lo, hi) if lo > 0 and hi / lo > 10 else Normalize(lo, hi if hi > lo else lo + 1e-12)
    ax.set_facecolor("0.88")
    img = ax.imshow(np.ma.masked_invalid(m), aspect="auto", interpolation="nearest", cmap="viridis", norm=norm,
                    extent=(int(rounds[0]) - 0.5, int(rounds[-1]) + 0.5, len(clients) - 0.5, -0.5))
    fig.colorbar(img, ax=ax, label="η_i(t)" + (" (log scale)" if isinstance(norm, LogNorm) else ""))
    _round_axis(ax)
    ax.set_ylabel("client (grey: not sampled that round)")
    ax.yaxis.set_major_locator(MaxNLocator(nbins=min(len(clients), 20), integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda y, _pos: str(clients[int(y)]) if 0 <= int(y) < len(clients) and y == int(y) else ""))
    _title(ax, full_title, style)
    return fig


def _short_axis(ax: Axes, xs: Sequence[int], ys: Sequence[float], name: str) -> None:
    """Plot ``ys`` so that tick labels stay short: when the values vary only far behind the decimal point
    (the uploads' entropy is ≈ −log n every round), plot the scaled deviation from a reference rounded to
    the variation's precision, and name the reference and the scale in the axis label instead."""
    v = np.asarray(ys, dtype=float)
    x = [int(r) for r in xs]
    scale = float(np.max(np.abs(v))) if len(v) else 0.0
    span = float(v.max() - v.min()) if len(v) else 0.0
    if scale > 0 and span < 1e-2 * scale:
        if span == 0:  # constant: the value itself is the reference, the curve is flat at 0
            ref, ref_text = float(v[0]), f"{float(v[0]):.10g}"
        else:
            digits = 1 - int(np.floor(np.log10(span)))
            ref = round(float(np.median(v)), digits)
            ref_text = f"{ref:.{max(digits, 1)}f}"
        dev = v - ref
        top = float(np.max(np.abs(dev)))
        exp = int(np.floor(np.log10(top))) if top > 0 else 0
        ax.plot(x, dev / 10.0**exp, marker="o", ms=3, color="C2")
        unit = f" [×1e{exp}]" if exp else ""
        ax.set_ylabel(f"{name} − ({ref_text}){unit}")
    else:
        ax.plot(x, v, marker="o", ms=3, color="C2")
        ax.set_ylabel(name)
    ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))


ENTROPY_LABEL = "entropy − (−log n)"


def _entropy_axis(ax: Axes, records: Records, xs: Sequence[int], ys: Sequence[float]) -> None:
    """The uploads' entropy Σ p_i log p_i is −log n (n uploads) up to tiny terms, so it is drawn as its
    deviation from −log n, with a plain label and a power-of-ten scale; without the round's n (a log that
    lacks num_clients) the value itself, with short ticks (``_short_axis``)."""
    n_of = {runlog.round_of(r): int(r.get("num_clients") or len(r.get("clients") or [])) for r in records}
    if not xs or any(n_of.get(int(x), 0) < 1 for x in xs):
        _short_axis(ax, xs, ys, "Σ p_i log p_i")
        return
    dev = np.asarray([float(y) + float(np.log(n_of[int(x)])) for x, y in zip(xs, ys, strict=True)])
    top = float(np.max(np.abs(dev)))
    exp = int(np.floor(np.log10(top))) if top > 0 else 0
    exp = 0 if -2 <= exp <= 2 else exp
    ax.plot([int(x) for x in xs], dev / 10.0**exp, marker="o", ms=3, color="C2")
    ax.set_ylabel(ENTROPY_LABEL + (f" [×1e{exp}]" if exp else ""))
    ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))


def draw_phi2(records: Records, style: FigureStyle = DEFAULT_STYLE) -> Figure | None:
    ser = phi2_series(records)
    if "phi2_pred" not in ser and "phi2_actual" not in ser:
        return None
    fig = _figure(style, (10, 4), panels=2)
    ax, ax2 = _panel(fig, style, 2, 1), _panel(fig, style, 2, 2)
    for i, st in enumerate(phi2_style()):  # fedent/phi2_style.json: the dashboard's φ2 chart reads the same file
        if st.key in ser:
            xs, ys = ser[st.key]
            _plot_curve(ax, xs, np.asarray(ys), i, st.label,
                        look={"color": st.color, "linestyle": st.dash, "marker": st.marker})
    _round_axis(ax)
    ax.set_ylabel("φ2(t+1)")
    _title(ax, "mean-field estimate vs actual", style)
    ax.grid(alpha=0.3)
    if "entropy" in ser:
        _entropy_axis(ax2, records, *ser["entropy"])
    _round_axis(ax2)
    _title(ax2, "entropy of the uploads", style)
    ax2.grid(alpha=0.3)
    _legend(fig, style=style)
    return fig


def draw_local_spread(groups: Mapping[str, Sequence[Records]], style: FigureStyle = DEFAULT_STYLE) -> Figure | None:
    """Paper Fig. client_dev: mean ± sd of local-model test accuracy per round, and the pooled spread."""
    pooled: dict[str, list[float]] = {}
    fig = _figure(style, (10, 4), panels=2)
    ax, ax2 = _panel(fig, style, 2, 1), _panel(fig, style, 2, 2)
    for i, (name, runs) in enumerate(groups.items()):
        by_round: dict[int, list[float]] = {}
        for recs in runs:
            for rnd, accs in local_accuracies(recs):
                by_round.setdefault(rnd, []).extend(accs)
        if not by_round:
            continue
        xs = sorted(by_round)
        mean = np.array([np.mean(by_round[x]) for x in xs])
        std = np.array([np.std(by_round[x]) for x in xs])
        _plot_curve(ax, xs, mean, i, name)
        _band(ax, xs, mean, std, i)
        pooled[name] = [a for x in xs for a in by_round[x]]
    if not pooled:
        return None
    _round_axis(ax)
    ax.set_ylabel("local model test accuracy")
    _title(ax, "uploaded local models on the global test set", style)
    ax.grid(alpha=0.3)
    ax2.boxplot(list(pooled.values()))
    ax2.set_xticks(range(1, len(pooled) + 1), list(pooled), rotation=30 if len(pooled) > 4 else 0, ha="right"
                   if len(pooled) > 4 else "center")
    ax2.set_ylabel("local model test accuracy (all rounds)")
    _title(ax2, "spread (deviation analysis)", style)
    ax2.grid(alpha=0.3)
    _legend(fig, ax.get_legend_handles_labels()[0] + [_band_handle("over the uploaded local models")], style)
    return fig


def draw_acc_loss(groups: Mapping[str, Sequence[Records]], title: str = "",
                  style: FigureStyle = DEFAULT_STYLE) -> Figure | None:
    """Test accuracy and training loss side by side, mean ± sd over seeds (paper Figs. ex_mnist..)."""
    fig = _figure(style, (11, 4), panels=2)
    axes = (_panel(fig, style, 2, 1), _panel(fig, style, 2, 2))
    drawn, banded = False, []
    for i, (name, runs) in enumerate(groups.items()):
        for ax, key in zip(axes, ("test_acc", "train_loss"), strict=True):
            xs, mean, std = mean_std_curve(runs, key)
            if not xs:
                continue
            _plot_curve(ax, xs, mean, i, name)
            if len(runs) > 1:
                _band(ax, xs, mean, std, i)
                if key == "test_acc":
                    banded.append(len(runs))
            drawn = True
    if not drawn:
        return None
    for ax, ylabel in zip(axes, ("global test accuracy", "training loss (weighted over participants)"),
                          strict=True):
        _round_axis(ax)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}  # one per group
    _legend(fig, list(handles.values()) + ([_band_handle(_seeds_text(banded))] if banded else []), style)
    _title(fig, title, style)
    return fig


def _saved(fig: Figure | None, path: str | Path, style: FigureStyle) -> list[Path]:
    return [] if fig is None else save(fig, path, style)


def plot_eta(records: Records, path: str | Path, title: str = "FedEnt per-client learning rate η_i(t)",
             style: FigureStyle = DEFAULT_STYLE) -> list[Path]:
    return _saved(draw_eta(records, title, style), path, style)


def plot_phi2(records: Records, path: str | Path, style: FigureStyle = DEFAULT_STYLE) -> list[Path]:
    return _saved(draw_phi2(records, style), path, style)


def plot_local_spread(groups: Mapping[str, Sequence[Records]], path: str | Path,
                      style: FigureStyle = DEFAULT_STYLE) -> list[Path]:
    return _saved(draw_local_spread(groups, style), path, style)


def plot_acc_loss(groups: Mapping[str, Sequence[Records]], path: str | Path, title: str = "",
                  style: FigureStyle = DEFAULT_STYLE) -> list[Path]:
    return _saved(draw_acc_loss(groups, title, style), path, style)


def plot_groups(groups: Mapping[str, Sequence[Records]], out_dir: str | Path, title: str = "",
                style: FigureStyle = DEFAULT_STYLE) -> list[Path]:
    """All figures for named groups of runs (a group = one algorithm over seeds), each in every format."""
    with rc_context(PAPER_RC if style.paper else None):  # type: ignore[arg-type]  # text sizes are fixed when the artists are made
        return _plot_groups(groups, Path(out_dir), title, style)


def _plot_groups(groups: Mapping[str, Sequence[Records]], out: Path, title: str, style: FigureStyle) -> list[Path]:
    suffix = f" — {title}" if title else ""
    made: list[Path] = []
    for key, ylabel, name, stem in (("test_acc", "test accuracy", "global model accuracy", "accuracy"),
                                    ("train_loss", "training loss", "training loss", "train_loss"),
                                    ("test_loss", "test loss", "test loss", "test_loss")):
        made += _saved(draw_curves(groups, key, ylabel, f"{name}{suffix}", style), out / stem, style)
    made += plot_local_spread(groups, out / "local_acc", style)
    for name, runs in groups.items():
        if runs:
            prefix = "" if len(groups) == 1 else f"{name}_"
            made += plot_eta(runs[0], out / f"{prefix}eta", style=style)
            made += plot_phi2(runs[0], out / f"{prefix}phi2", style)
    return made


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None,
             style: FigureStyle = DEFAULT_STYLE) -> list[Path]:
    """Re-plot one run from its metrics.jsonl into ``out_dir`` (default: RUN_DIR/plots)."""
    paths = runlog.RunPaths(Path(run_dir))
    records = runlog.read_metrics(paths.metrics)
    if not records:
        return []
    name = str(records[0].get("algorithm") or paths.run_id)
    return plot_groups({name: [records]}, out_dir if out_dir is not None else paths.plots, title=paths.run_id,
                       style=style)
