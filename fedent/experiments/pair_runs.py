"""Any pairing of kept run logs: ``python -m fedent.experiments.pair_runs SETTING_DIR --rows A --against B,C``.

Why: a generated report pairs every row against one reference (FedEnt), but a reader checking a sentence such as
"the tuned FedAvg beats FedAdam" needs the pair the sentence names. This reads the run directories a reproduce or
compare run left (``<row>-s<seed>/metrics.jsonl``, ``partition.json``), pairs the end points (mean test accuracy
of the last k evaluated rounds) seed by seed with :mod:`fedent.experiments.paired`, and prints a markdown table.
A seed whose two runs were trained on different partitions is refused: such a pair is not a paired comparison,
and a run its status.json shows unfinished (still training, stopped, failed) is left out and named: the end point
of a run cut short is not its row's.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from fedent import runlog
from fedent.experiments import paired as P

RUN = re.compile(r"^(?P<row>.+)-s(?P<seed>\d+)$")


class PairingError(ValueError):
    """Runs that cannot be paired (missing, or trained on different partitions)."""


def unfinished(run: Path) -> str | None:
    """Why ``run`` is not a result yet: its status.json's phase is not ``done`` (kept logs without a status.json,
    older archives, count as finished). Unlike ``reproduce.finished`` a diverged run is left out too: it has no end
    point, as the generated reports print it."""
    status = runlog.read_json(runlog.RunPaths(run).status, default=None)
    if isinstance(status, dict) and status.get("phase", "done") != "done":
        return f"{run.name} ({status.get('phase')} at round {status.get('round')} of {status.get('rounds')})"
    return None


def _seeds(setting: Path, row: str) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for d in sorted(setting.iterdir()) if setting.is_dir() else ():
        m = RUN.match(d.name)
        if d.is_dir() and m and m["row"] == row:
            out[int(m["seed"])] = d
    return out


def runs_of(setting: Path, row: str) -> dict[int, Path]:
    """``row``'s finished run directories under ``setting`` by seed (``<row>-s<seed>``; superseded copies and
    unfinished runs skipped)."""
    every = _seeds(setting, row)
    if not every:
        raise PairingError(f"no runs of row {row!r} in {setting} (expected {row}-s<seed> directories)")
    out = {s: d for s, d in every.items() if unfinished(d) is None}
    if not out:
        raise PairingError(f"no finished runs of row {row!r} in {setting}: "
                           + ", ".join(str(unfinished(d)) for d in every.values()))
    return out


def left_out(setting: Path, rows: Sequence[str]) -> list[str]:
    """The unfinished runs of ``rows`` under ``setting``, as ``unfinished`` names them."""
    return [why for row in dict.fromkeys(rows) for d in _seeds(setting, row).values()
            if (why := unfinished(d)) is not None]


def _md5(run: Path) -> str | None:
    info = runlog.read_json(run / "partition.json", default=None)
    return str(info["md5"]) if isinstance(info, dict) and "md5" in info else None


def end_points(runs: dict[int, Path], k: int) -> dict[int, float | None]:
    return {s: P.tail_mean(runlog.read_metrics(d / "metrics.jsonl"), k) for s, d in runs.items()}


def pair(setting: Path, row: str, against: str, k: int = P.TAIL_K) -> P.Paired | None:
    """``row`` − ``against`` end points over their common seeds (refused where a seed's partitions differ)."""
    a, b = runs_of(setting, row), runs_of(setting, against)
    for s in sorted(a.keys() & b.keys()):
        if _md5(a[s]) != _md5(b[s]):
            raise PairingError(f"seed {s}: {a[s].name} and {b[s].name} were trained on different partitions "
                               f"({_md5(a[s])} vs {_md5(b[s])}); not a paired comparison")
    return P.paired(end_points(a, k), end_points(b, k))


def table(setting: Path, rows: Sequence[str], against: Sequence[str], k: int = P.TAIL_K) -> str:
    lines = [f"End point = mean test accuracy of the last {k} evaluated rounds; Δ = row − reference, mean per-seed "
             "difference in points with its 95% t-interval.", "",
             "| row | reference | Δ end point (pts) |", "| --- | --- | ---: |"]
    for row in rows:
        for ref in against:
            lines.append(f"| {row} | {ref} | {P.fmt(pair(setting, row, ref, k))} |")
    if cut := left_out(setting, [*rows, *against]):
        lines += ["", f"Left out, unfinished: {', '.join(cut)}."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedent.experiments.pair_runs", description=__doc__.split("\n")[0])
    ap.add_argument("setting", type=Path, help="a setting's run directory, e.g. results/cpu/runs/pathological")
    ap.add_argument("--rows", required=True, help="comma-separated rows to compare")
    ap.add_argument("--against", required=True, help="comma-separated reference rows")
    ap.add_argument("--k", type=int, default=P.TAIL_K, help=f"end point: last K evaluated rounds (default {P.TAIL_K})")
    args = ap.parse_args(argv)
    try:
        sys.stdout.write(table(args.setting, args.rows.split(","), args.against.split(","), args.k))
    except (PairingError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
