"""`fedent --help` start-up time against a bare interpreter start (`python -c pass`), alternated in one run.

Also times `python -c "import torch"`: what every `fedent` invocation paid before the CLI imported its
subcommands lazily (the old --help imported torch, grpc and the dashboard up front).

    python benchmarks/bench_cli.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "python -c pass": ["-c", "pass"],
    "fedent --help": ["-m", "fedent.cli", "--help"],
    "fedent --version": ["-m", "fedent.cli", "--version"],
    "python -c 'import torch'": ["-c", "import torch"],
}


def once(args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for a in CASES.values():  # warm the page cache once
        once(a)
    for _ in range(args.repeats):
        for name, a in CASES.items():  # alternated, so load drift hits every case alike
            times[name].append(once(a))
    base = statistics.median(times["python -c pass"])
    print(f"{'command':28s} {'median (s)':>10s} {'min (s)':>8s} {'vs python -c pass':>18s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:28s} {med:10.3f} {min(ts):8.3f} {med / base:17.1f}x")
    print(f"fedent --help above python start-up: {statistics.median(times['fedent --help']) - base:.3f} s "
          f"({args.repeats} repeats, {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
