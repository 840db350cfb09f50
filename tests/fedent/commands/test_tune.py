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
