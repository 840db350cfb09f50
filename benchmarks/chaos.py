"""Seeded chaos, long: ``--kills`` random SIGKILLs of the aggregator, the estimator and the workers over
FedEnt and SCAFFOLD runs, each restarted at once; every run must end with the simulation's model.

    .venv/bin/python benchmarks/chaos.py --kills 20 --seed 1 --out chaos-report.json

The harness is tests/chaos.py (the CI test tests/system/test_chaos.py runs a few kills of it). The report
(JSON) lists every kill (run, algorithm, process, seeded wait, rounds logged when it landed, seconds until
the run logged a new round) and every run (kills, wall time, relative error against the simulation), with a
summary: kills, recoveries, kills per process, recovery time (min/median/max). It is written whatever
happens: a run whose model or log differs is a failed row, a harness that crashes leaves ``crash`` set
beside everything done until then (exit code 1 either way). The reference simulation runs at the processes'
thread count (one), so a thread-count rounding difference is never reported as a failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from chaos import ChaosReport, chaos  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=20, help="kills that must land in unfinished runs")
    p.add_argument("--seed", type=int, default=0, help="seeds the victims and the waits")
    p.add_argument("--rounds", type=int, default=12, help="rounds per run (another run starts when one ends); "
                   "FedEnt on this tiny config amplifies float rounding past 1e-5 by round 30, kills or not")
    p.add_argument("--max-wait", type=float, default=3.0, help="a kill comes U(0, this) seconds after recovery")
    p.add_argument("--min-runs", type=int, default=2, help="runs at least (FedEnt, SCAFFOLD, ...)")
    p.add_argument("--workers", type=int, default=2, choices=[1, 2], help="worker processes per run")
    p.add_argument("--out", default="chaos-report.json", help="the JSON report")
    p.add_argument("--workdir", default=None, help="keep the runs and the process logs here (default: a temp dir)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    report = ChaosReport(args.seed)
    try:
        with tempfile.TemporaryDirectory(prefix="fedent-chaos-") as tmp:
            work = Path(args.workdir) if args.workdir else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            chaos(work, args.kills, args.seed, rounds=args.rounds, max_wait_s=args.max_wait,
                  min_runs=args.min_runs, workers=args.workers, log=sys.stdout, report=report)
    except Exception as e:  # the report is written whatever happened: what ran until the crash, and the crash
        report.crash = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        print(f"chaos: {report.crash}", file=sys.stderr)
    finally:
        Path(args.out).write_text(report.to_json() + "\n")
    s = report.summary()
    rec = s["recover_s"] or {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    err = s["max_relative_error"]
    print(f"{s['kills']} kills ({s['by_process']}), {s['recoveries']} recoveries, recovery "
          f"min/median/max {rec['min']:.1f}/{rec['median']:.1f}/{rec['max']:.1f} s; "
          f"{s['runs_equal_to_simulation']}/{s['runs']} runs equal to the simulation "
          f"(max relative error {'n/a' if err is None else f'{err:.1e}'}); {time.monotonic() - t0:.0f} s; "
          f"report {args.out}")
    ok = not report.crash and s["runs_equal_to_simulation"] == s["runs"] and s["kills"] >= args.kills
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
