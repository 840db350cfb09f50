"""Final and best test accuracy of every run directory under DIR (a `fedent reproduce --out` tree), as Markdown.

Unlike `fedent reproduce --report-only`, which only tabulates seeds that completed every row, this lists each
run as it stands: finished, failed (with status.json's reason) or cut short (last logged round), so a partial
run of a profile (a device call that ran out of time) can still be read.

    python tools/runs_table.py results/full/runs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedent import runlog


def row(run: Path) -> str:
    paths = runlog.RunPaths(run)
    recs = runlog.read_metrics(paths.metrics) if paths.metrics.exists() else []
    status = runlog.read_json(paths.status, default={}) or {}
    accs = [r["test_acc"] for r in recs if r.get("test_acc") is not None]
    final = runlog.final_accuracy(recs)
    phase = status.get("phase", "?")
    error = (status.get("state") or {}).get("error") or status.get("error") or ""
    note = {"done": "done", "failed": f"failed: {str(error)[:90]}"}.get(phase, f"cut short while {phase}")
    rounds = f"{len(recs)}/{status.get('rounds', '?')}"
    fmt = lambda v: f"{100 * v:.2f}" if v is not None else "—"  # noqa: E731
    return f"| {run.parent.name} | {run.name} | {rounds} | {fmt(final)} | {fmt(max(accs) if accs else None)} | {note} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a directory of <setting>/<run> directories")
    args = ap.parse_args(argv)
    runs = sorted(p.parent for p in Path(args.dir).glob("*/*/status.json"))
    print("| setting | run | rounds logged | final acc (%) | best acc (%) | status |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for run in runs:
        print(row(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
