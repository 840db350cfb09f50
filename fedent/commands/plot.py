"""``fedent plot RUN_DIR...``: re-plot finished (or live) runs from their metrics.jsonl."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedent.config import ConfigError

HELP = "re-plot run directories"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("plot", help=HELP,
                              description="Plot accuracy/loss curves (and FedEnt's η and φ2 when logged) of runs. "
                                          "One run: into RUN_DIR/plots (or --out). Several: one overlay in --out.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None, help="output directory")


def run(args: argparse.Namespace) -> int:
    from fedent import runlog
    from fedent.plots import plot_groups, plot_run

    dirs = [Path(r) for r in args.runs]
    for d in dirs:
        if not runlog.RunPaths(d).metrics.is_file():
            raise ConfigError(f"{d}: not a run directory (no metrics.jsonl)")
    made: list[Path] = []
    if len(dirs) == 1:
        made = plot_run(dirs[0], args.out)
    else:
        if args.out is None:
            raise ConfigError("--out: required when plotting several runs together")
        groups = {d.name: [runlog.read_metrics(runlog.RunPaths(d).metrics)] for d in dirs}
        made = plot_groups(groups, args.out)
    if not made:
        print("nothing to plot yet (no completed rounds)")
        return 0
    for p in made:
        print(p)
    return 0
