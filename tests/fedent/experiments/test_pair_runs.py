"""fedent.experiments.pair_runs: end points of kept run logs paired seed by seed, against hand-computed numbers;
runs on different partitions are refused, and a missing row is a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedent.experiments import pair_runs


def _run(setting: Path, name: str, accs: list[float | None], md5: str = "m") -> None:
    d = setting / name
    d.mkdir(parents=True)
    lines = [json.dumps({"round": i + 1, "test_acc": a}) for i, a in enumerate(accs)]
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (d / "partition.json").write_text(json.dumps({"md5": md5}))


def test_end_points_are_paired_by_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = tmp_path / "pathological"
    # end point (k = 2): mean of the last two evaluated rounds (None: a round without a test reading)
    _run(s, "a-s0", [0.1, 0.50, None, 0.70])  # 0.60
    _run(s, "a-s1", [0.1, 0.60, 0.80])  # 0.70
    _run(s, "a-s2", [0.9, 0.80])  # 0.85, no partner: left out
    _run(s, "b-s0", [0.2, 0.50, 0.50])  # 0.50
    _run(s, "b-s1", [0.3, 0.70, 0.50])  # 0.60
    _run(s, "b-s1.superseded-1", [0.0, 0.0])  # an older copy, not a seed
    p = pair_runs.pair(s, "a", "b", k=2)
    # diffs 0.10, 0.10: mean 0.10, no spread
    assert p is not None and p.n == 2
    assert p.mean == pytest.approx(0.10) and p.lo == pytest.approx(0.10) and p.hi == pytest.approx(0.10)
    assert pair_runs.main([str(s), "--rows", "a", "--against", "b", "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert "| a | b | +10.00 [+10.00, +10.00] (n = 2) |" in out and "last 2 evaluated rounds" in out


def test_one_common_seed_says_n1(tmp_path: Path) -> None:
    s = tmp_path / "x"
    _run(s, "a-s3", [0.4])
    _run(s, "b-s3", [0.1])
    assert pair_runs.table(s, ["a"], ["b"], k=5).splitlines()[-1] == "| a | b | +30.00 (n = 1, no interval) |"


def test_runs_on_other_partitions_and_missing_rows_are_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    s = tmp_path / "x"
    _run(s, "a-s0", [0.4], md5="one")
    _run(s, "b-s0", [0.1], md5="two")
    with pytest.raises(pair_runs.PairingError, match="different partitions"):
        pair_runs.pair(s, "a", "b")
    assert pair_runs.main([str(s), "--rows", "a", "--against", "c"]) == 2
    assert "no runs of row 'c'" in capsys.readouterr().err


def test_a_run_cut_short_is_left_out_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run still training (or stopped) has no end point of its row: pairing it would average a run's first rounds
    with another's last (a reader paired a study's third seed two rounds into training)."""
    s = tmp_path / "x"
    _run(s, "a-s0", [0.4, 0.6])
    _run(s, "b-s0", [0.3, 0.5])
    _run(s, "a-s1", [0.1])
    _run(s, "b-s1", [0.9])
    (s / "a-s0" / "status.json").write_text(json.dumps({"phase": "done", "round": 2, "rounds": 2}))
    (s / "a-s1" / "status.json").write_text(json.dumps({"phase": "training", "round": 1, "rounds": 2}))
    p = pair_runs.pair(s, "a", "b", k=2)
    assert p is not None and p.n == 1 and p.mean == pytest.approx(0.10)
    assert pair_runs.table(s, ["a"], ["b"], k=2).splitlines()[-1] == \
        "Left out, unfinished: a-s1 (training at round 1 of 2)."
    (s / "a-s0" / "status.json").write_text(json.dumps({"phase": "failed", "round": 1, "rounds": 2}))
    assert pair_runs.main([str(s), "--rows", "a", "--against", "b"]) == 2
    assert "no finished runs of row 'a'" in capsys.readouterr().err
