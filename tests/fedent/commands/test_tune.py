"""fedent tune from the command line: grids, tuned.json and tune.md, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_support import write_tiny_config_file

from fedent.cli import main
from fedent.commands.tune import parse_grids
from fedent.config import ConfigError


def test_parse_grids() -> None:
    assert parse_grids(["train.lr=0.1,0.01", "fedprox.algorithm.mu=1e-3, 1e-2"]) == {
        "train.lr": [0.1, 0.01], "fedprox.algorithm.mu": [0.001, 0.01]}
    for bad in ("train.lr", "train.lr=a,b", "=0.1,0.2"):
        with pytest.raises(ConfigError, match="--grid"):
            parse_grids([bad])


def test_tune_writes_the_chosen_values_and_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_tiny_config_file(tmp_path / "tiny.yaml", rounds=1)
    out = tmp_path / "tune"
    rc = main(["tune", "--config", str(cfg), "--algorithms", "fedavg", "--grid", "train.lr=0.01,0.1",
               "--max-extend", "0", "--tail-k", "1", "--validation-fraction", "0.25", "--out", str(out)])
    assert rc == 0
    tuned = json.loads((out / "tuned.json").read_text())
    knob = tuned["algorithms"]["fedavg"]["knobs"][0]
    assert tuned["validation_fraction"] == 0.25 and [v for v, _ in knob["tried"]] == [0.01, 0.1]
    assert tuned["algorithms"]["fedavg"]["chosen"] == {"train.lr": knob["best"]}
    assert knob["bracketed"] is False and "after 0 extension(s)" in knob["why"]  # two values: always an edge
    assert "| fedavg | train.lr |" in capsys.readouterr().out and (out / "tune.md").exists()
    for metrics in (out / "runs" / "fedavg").glob("*/metrics.jsonl"):
        assert json.loads(metrics.read_text().splitlines()[-1])["test_acc"] is None
    assert main(["tune", "--config", str(cfg), "--algorithms", "fedavg", "--grid", "train.lr=0.1",
                 "--out", str(out)]) == 2
    capsys.readouterr()
    assert main(["tune", "--config", str(cfg), "--algorithms", "fedavg", "--knobs", "algorithm.mu",
                 "--out", str(out)]) == 2
    assert "--knobs: algorithm.mu: not a knob of fedavg" in capsys.readouterr().err
    assert main(["tune", "--config", str(cfg), "--algorithms", "fedprox", "--grid", "train.lr=0.01,0.1",
                 "--knobs", "train.lr", "--max-extend", "0", "--tail-k", "1", "--out", str(out / "prox")]) == 0
    knobs = json.loads((out / "prox" / "tuned.json").read_text())["algorithms"]["fedprox"]["knobs"]
    assert [(k["key"], k["tuned"], len(k["tried"])) for k in knobs] == [("train.lr", True, 2),
                                                                        ("algorithm.mu", False, 0)]
    assert "| fedprox | algorithm.mu | not tuned (--knobs) |" in capsys.readouterr().out


def test_tune_reuse_reads_an_earlier_searchs_runs_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_tiny_config_file(tmp_path / "tiny.yaml", rounds=1)
    argv = ["tune", "--config", str(cfg), "--algorithms", "fedavg", "--grid", "train.lr=0.01,0.1", "--max-extend", "0",
            "--tail-k", "1"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "b"), "--reuse", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    for lr in ("0.01", "0.1"):
        assert f"tune fedavg: lr{lr}-s0: read back from {tmp_path / 'a' / 'runs' / 'fedavg' / f'lr{lr}-s0'}" in err
        assert not (tmp_path / "b" / "runs" / "fedavg" / f"lr{lr}-s0" / "model_final.pt").exists()
    assert (tmp_path / "a" / "tuned.json").read_text() == (tmp_path / "b" / "tuned.json").read_text()
    assert main([*argv, "--out", str(tmp_path / "c"), "--reuse", str(tmp_path / "nowhere")]) == 2
    assert "--reuse" in capsys.readouterr().err and not (tmp_path / "c" / "runs").exists()


@pytest.mark.slow  # ~25 s on a loaded 2-core box: two spawned pools, each worker importing torch
def test_tune_with_two_workers_writes_what_one_worker_writes(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Real runs in a spawned pool of 2: the same tuned.json and tune.md as the in-process search, one log line
    per point; a rerun into a finished directory reads every point back instead of training it again."""
    cfg = write_tiny_config_file(tmp_path / "tiny.yaml", rounds=2)
    argv = ["tune", "--config", str(cfg), "--algorithms", "fedavg,fedprox", "--seeds", "0,1", "--grid",
            "train.lr=0.01,0.1", "--grid", "fedprox.algorithm.mu=0.01,1", "--max-extend", "1", "--tail-k", "2",
            "--threads", "1"]
    logs = {}
    for workers in (1, 2):
        assert main([*argv, "--workers", str(workers), "--out", str(tmp_path / f"w{workers}")]) == 0
        logs[workers] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tune ")]
    one, two = (json.loads((tmp_path / f"w{w}" / "tuned.json").read_text()) for w in (1, 2))
    assert two == one and one["algorithms"]["fedprox"]["runs"] > 0
    assert (tmp_path / "w2" / "tune.md").read_text() == (tmp_path / "w1" / "tune.md").read_text()
    points = sum(a["runs"] for a in one["algorithms"].values()) // 2  # two seeds a point
    assert sorted(logs[2]) == sorted(logs[1]) and len(logs[1]) == len(set(logs[1])) == points
    metrics = sorted((tmp_path / "w1" / "runs").glob("*/*/metrics.jsonl"))
    stamps = [m.stat().st_mtime_ns for m in metrics]
    assert main([*argv, "--workers", "2", "--out", str(tmp_path / "w1")]) == 0
    assert [m.stat().st_mtime_ns for m in metrics] == stamps  # read back, not rerun
    assert json.loads((tmp_path / "w1" / "tuned.json").read_text()) == one
    assert main([*argv, "--workers", "0", "--out", str(tmp_path / "w0")]) == 2
