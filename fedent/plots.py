"""Figures from run logs (metrics.jsonl only, so finished and live runs plot the same way).

Uses matplotlib's object API with the Agg canvas (no pyplot, no global state, no display needed).
The figures follow the paper: accuracy and loss curves per algorithm (Figs. ex_mnist..ex_cifar100),
FedEnt's per-client learning rates (Eq. eta_deacy), the mean-field prediction of φ2 against the actual
value (Definition 2), and the accuracy spread of uploaded local models (Fig. client_dev).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedent import runlog

Records = Sequence[Mapping[str, Any]]


# ---- extraction (pure; tested without drawing) -------------------------------------------------------

def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """(rounds, values) of a top-level metric, skipping rounds where it was not measured."""
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if v is not None:
            xs.append(int(r["round"]))
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
            xs.append(int(r["round"]))
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
                xs.append(int(r["round"]))
                ys.append(float(v))
        if xs:
            out[key] = (xs, ys)
    return out


def local_accuracies(records: Records) -> list[tuple[int, list[float]]]:
    """Per evaluated round, the test accuracies of the sampled uploaded local models."""
    out = []
    for r in records:
        accs = (r.get("diagnostics") or {}).get("local_acc")
        if accs:
            out.append((int(r["round"]), [float(a) for a in accs]))
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


# ---- drawing ---------------------------------------------------------------------------------------

def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    for ax in fig.axes:
        if ax.get_xlabel().startswith("global round"):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _curves(groups: Mapping[str, Sequence[Records]], key: str, ylabel: str, title: str, path: Path) -> Path | None:
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for name, runs in groups.items():
        xs, mean, std = mean_std_curve(runs, key)
        if not xs:
            continue
        ax.plot(xs, mean, marker="o" if len(xs) < 30 else None, ms=3, label=name)
        if len(runs) > 1:
            ax.fill_between(xs, mean - std, mean + std, alpha=0.2)
        drawn = True
    if not drawn:
        return None
    ax.set_xlabel("global round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_eta(records: Records, path: Path, title: str = "FedEnt per-client learning rate η_i(t)") -> Path | None:
    traj = eta_trajectories(records)
    if not traj:
        return None
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for cid in sorted(traj):
        xs, ys = traj[cid]
        ax.plot(xs, ys, marker=".", lw=0.8, alpha=0.7)
    ax.set_xlabel("global round (client took part)")
    ax.set_ylabel("η_i(t)")
    ax.set_title(f"{title} ({len(traj)} clients)")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_phi2(records: Records, path: Path) -> Path | None:
    ser = phi2_series(records)
    if "phi2_pred" not in ser and "phi2_actual" not in ser:
        return None
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for key, label in (("phi2_pred", "predicted φ2(t+1)"), ("phi2_actual", "actual Σθ‖w_i(t+1)‖²")):
        if key in ser:
            ax.plot(*ser[key], marker=".", label=label)
    ax.set_xlabel("global round")
    ax.set_title("mean-field estimate vs actual")
    ax.legend()
    ax.grid(alpha=0.3)
    if "entropy" in ser:
        ax2.plot(*ser["entropy"], marker=".", color="C2")
    ax2.set_xlabel("global round")
    ax2.set_title("Σ p_i log p_i of the uploads")
    ax2.ticklabel_format(axis="y", useOffset=False)
    ax2.grid(alpha=0.3)
    return _save(fig, path)


def plot_local_spread(groups: Mapping[str, Sequence[Records]], path: Path) -> Path | None:
    """Paper Fig. client_dev: mean ± std of local-model test accuracy per round, and the pooled spread."""
    pooled: dict[str, list[float]] = {}
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for name, runs in groups.items():
        by_round: dict[int, list[float]] = {}
        for recs in runs:
            for rnd, accs in local_accuracies(recs):
                by_round.setdefault(rnd, []).extend(accs)
        if not by_round:
            continue
        xs = sorted(by_round)
        mean = np.array([np.mean(by_round[x]) for x in xs])
        std = np.array([np.std(by_round[x]) for x in xs])
        ax.plot(xs, mean, marker=".", label=name)
        ax.fill_between(xs, mean - std, mean + std, alpha=0.2)
        pooled[name] = [a for x in xs for a in by_round[x]]
    if not pooled:
        return None
    ax.set_xlabel("global round")
    ax.set_ylabel("local model test accuracy")
    ax.set_title("uploaded local models on the global test set")
    ax.grid(alpha=0.3)
    ax.legend()
    ax2.boxplot(list(pooled.values()))
    ax2.set_xticks(range(1, len(pooled) + 1), list(pooled))
    ax2.set_ylabel("local model test accuracy (all rounds)")
    ax2.set_title("spread (deviation analysis)")
    ax2.grid(alpha=0.3)
    return _save(fig, path)


def plot_groups(groups: Mapping[str, Sequence[Records]], out_dir: str | Path, title: str = "") -> list[Path]:
    """All figures for named groups of runs (a group = one algorithm over seeds)."""
    out = Path(out_dir)
    suffix = f" — {title}" if title else ""
    made = [
        _curves(groups, "test_acc", "test accuracy", f"global model accuracy{suffix}", out / "accuracy.png"),
        _curves(groups, "train_loss", "training loss", f"training loss{suffix}", out / "train_loss.png"),
        _curves(groups, "test_loss", "test loss", f"test loss{suffix}", out / "test_loss.png"),
        plot_local_spread(groups, out / "local_acc.png"),
    ]
    for name, runs in groups.items():
        if runs:
            prefix = "" if len(groups) == 1 else f"{name}_"
            made.append(plot_eta(runs[0], out / f"{prefix}eta.png"))
            made.append(plot_phi2(runs[0], out / f"{prefix}phi2.png"))
    return [p for p in made if p is not None]


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Re-plot one run from its metrics.jsonl into ``out_dir`` (default: RUN_DIR/plots)."""
    paths = runlog.RunPaths(Path(run_dir))
    records = runlog.read_metrics(paths.metrics)
    if not records:
        return []
    name = str(records[0].get("algorithm") or paths.run_id)
    return plot_groups({name: [records]}, out_dir if out_dir is not None else paths.plots, title=paths.run_id)
