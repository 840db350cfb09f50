"""Run every benchmark in sequence with its default (or quick) settings; `make bench` calls this.

Each benchmark prints its own ratios against an in-process baseline; nothing here asserts a timing.
Pass --full to use each script's full-size defaults instead of the quick settings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

QUICK = {
    "bench_simulator.py": ["--quick", "--rounds", "3", "--repeats", "1"],
    "bench_fixed_point.py": ["--clients", "10", "--rounds", "2"],
    "bench_cluster.py": ["--rounds", "4", "--workers", "1", "--threads", "1"],
    "bench_transfer.py": ["--sizes-mb", "16,256", "--repeat", "3"],
    "bench_network.py": ["--rounds", "2", "--mbit", "10", "--encodings", "native,float16,int8+float16"],  # root only
    "bench_cli.py": ["--repeats", "5"],
    "bench_vectorised_step.py": ["--clients", "4", "--samples", "128", "--repeats", "1"],
    "bench_privacy.py": ["--quick", "--rounds", "2", "--repeats", "1", "--threads", "1"],
    "bench_secagg.py": ["--rounds", "3", "--clients", "10", "--per-round", "5", "--repeats", "1"],
    "bench_robust.py": ["--model", "lenet5", "--repeats", "2", "--rounds", "2"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--full", action="store_true", help="full-size settings (slow on a small CPU box)")
    ap.add_argument("--only", default="", help="comma-separated script names to run")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    failed = []
    for script, quick in QUICK.items():
        if only and script not in only and script.removesuffix(".py") not in only:
            continue
        cmd = [sys.executable, str(HERE / script), *([] if args.full else quick)]
        print(f"\n=== {' '.join(cmd[1:])}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            failed.append(script)
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
