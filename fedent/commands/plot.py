"""``fedent plot RUN_DIR...``: re-plot finished (or live) runs from their metrics.jsonl."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedent.config import ConfigError

HELP = "re-plot run directories"

FORMATS = ("png", "pdf", "svg")  # = fedent.plots.FORMATS (not imported here: matplotlib only when plotting)


def _formats(text: str) -> tuple[str, ...]:
    fmts = tuple(dict.fromkeys(f.strip().lower().lstrip(".") for f in text.split(",") if f.strip()))
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise argparse.ArgumentTypeError(f"{', '.join(bad) or '(none)'}: choose from {','.join(FORMATS)}")
    return fmts


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("plot", help=HELP,
                              description="Plot accuracy/loss curves (and FedEnt's η and φ2 when logged) of runs. "
                                          "One run: into RUN_DIR/plots (or --out). Several: one overlay in --out. "
                                          "Rounds are numbered 1..R, as simulate prints them.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None, help="output directory")
    p.add_argument("--formats", type=_formats, default=("png",), metavar="png,pdf,svg",
                   help="file formats, comma-separated: one file per figure and format (default: png)")
    p.add_argument("--dpi", type=int, default=300, help="resolution of raster output (default: 300)")
    p.add_argument("--width", type=float, default=None, metavar="INCHES",
                   help="figure width in inches (one column of a paper: 3.3-3.5; default: 6.5-11 by figure)")
    p.add_argument("--style", choices=("default", "paper"), default="default",
                   help="paper: one-column figures (3.4 in unless --width), 7 pt text, panels stacked, legend "
                        "below the axes")
    p.add_argument("--no-title", dest="titles", action="store_false",
                   help="no titles on the figures (a paper's caption says it)")


def run(args: argparse.Namespace) -> int:
    from fedent import runlog
    from fedent.plots import FigureStyle, plot_groups, plot_run

    if args.dpi <= 0:
        raise ConfigError("--dpi: must be > 0")
    if args.width is not None and not 1.0 <= args.width <= 20.0:
        raise ConfigError(f"--width: {args.width} inches; expected 1 to 20 (one column of a paper: 3.3-3.5)")
    style = FigureStyle(formats=tuple(args.formats), dpi=args.dpi, titles=args.titles, width=args.width,
                        paper=args.style == "paper")
    dirs = [Path(r) for r in args.runs]
    for d in dirs:
        if not runlog.RunPaths(d).metrics.is_file():
            raise ConfigError(f"{d}: not a run directory (no metrics.jsonl)")
    made: list[Path] = []
    if len(dirs) == 1:
        made = plot_run(dirs[0], args.out, style)
    else:
        if args.out is None:
            raise ConfigError("--out: required when plotting several runs together")
        groups = {d.name: [runlog.read_metrics(runlog.RunPaths(d).metrics)] for d in dirs}
        made = plot_groups(groups, args.out, style=style)
    if not made:
        print("nothing to plot yet (no completed rounds)")
        return 0
    for p in made:
        print(p)
    return 0
