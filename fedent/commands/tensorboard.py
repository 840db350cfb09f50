"""``fedent tensorboard RUN_DIR...``: a run's scalars (accuracy, loss, FedEnt's η, φ2, entropy) for TensorBoard.

A subcommand over finished (or live, or cluster) run directories rather than a flag of ``simulate``: the run
directory's metrics.jsonl stays the one record, simulating needs no tensorboard, and any old run can be exported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedent.config import ConfigError

HELP = "export runs' scalars as TensorBoard event files"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("tensorboard", help=HELP,
                              description="Write each run's scalars (test accuracy, train/test loss, FedEnt's "
                                          "per-client η, φ2 predicted vs actual, entropy) as TensorBoard event "
                                          "files, step = round 1..R. One run: into RUN_DIR/tensorboard (or --out). "
                                          "Several: --out DIR, one sub-folder per run, for tensorboard --logdir "
                                          "DIR. Needs pip install 'fedent[tracking]'.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None, help="output directory")


def run(args: argparse.Namespace) -> int:
    from fedent import runlog
    from fedent.tbexport import TrackingUnavailable, export

    dirs = [Path(r) for r in args.runs]
    for d in dirs:
        if not runlog.RunPaths(d).metrics.is_file():
            raise ConfigError(f"{d}: not a run directory (no metrics.jsonl)")
    if len(dirs) > 1 and args.out is None:
        raise ConfigError("--out: required when exporting several runs together")
    names = [d.resolve().name for d in dirs]
    if len(set(names)) < len(names):
        raise ConfigError("several runs share a folder name; export them one at a time with --out")
    written = []
    try:
        for d, name in zip(dirs, names, strict=True):
            out = args.out if len(dirs) == 1 else Path(args.out) / name
            made = export(d, out)
            if made is None:
                print(f"{d}: nothing to export yet (no completed rounds)")
            else:
                written.append(made)
                print(made)
    except TrackingUnavailable as e:
        raise ConfigError(str(e)) from e
    if written:
        logdir = written[0] if len(dirs) == 1 else Path(args.out)
        print(f"view: tensorboard --logdir {logdir}")
    return 0
