"""Seeded chaos in CI: random SIGKILLs of the aggregator, the estimator and the workers (tests/chaos.py).

At least 3 kills over two runs (FedEnt with the estimator service, SCAFFOLD with persisted client state),
one worker process per run to keep it short on two cores;
each run must finish with every round logged once and the uninterrupted simulation's model (1e-5). The long
version is ``benchmarks/chaos.py --kills 20``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from chaos import chaos


@pytest.mark.slow
def test_random_kills_never_change_the_model_or_the_log(tmp_path: Path) -> None:
    report = chaos(tmp_path, kills=3, seed=7, rounds=10, max_wait_s=2.0, workers=1, log=sys.stderr)
    summary = report.summary()
    assert summary["kills"] >= 3 and summary["recoveries"] == summary["kills"], summary
    assert {r.algorithm for r in report.runs} == {"fedent", "scaffold"}
    assert summary["runs_equal_to_simulation"] == len(report.runs), report.to_json()
