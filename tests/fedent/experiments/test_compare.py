"""fedent compare: algorithms x seeds on identical inputs -> compare.md, summary.json and figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_support import tiny_config, tiny_inputs

from fedent.config import ExperimentConfig
from fedent.experiments.compare import (
    AlgorithmSummary,
    RunSummary,
    markdown_table,
    rounds_to_target,
    run_comparison,
    sampling_identical,
    summarize,
)
from fedent.inputs import RunInputs


def _inputs(cfg: ExperimentConfig) -> RunInputs:
    return tiny_inputs(seed=cfg.train.seed)


def test_compare_two_algorithms_two_seeds(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=3, lr=0.1)
    res = run_comparison(cfg, ["fedavg", "fedprox"], [0, 1], tmp_path / "cmp", target=0.5, progress=False,
                         local_eval=2, algo_overrides=["fedprox.mu=0.5"], inputs_for=_inputs)
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| fedavg |" in md and "| fedprox |" in md and "rounds to 50.0%" in md
    assert "identical participants per round across algorithms: yes" in md
    assert res.same_sampling
    figs = sorted(p.name for p in (tmp_path / "cmp" / "figures").iterdir())
    assert figs == ["accuracy.png", "local_acc.png", "test_loss.png", "train_loss.png"]
    for p in res.figures:
        assert p.stat().st_size > 1000 and f"]({p.relative_to(tmp_path / 'cmp')})" in md
    assert sorted(p.name for p in (tmp_path / "cmp" / "runs").iterdir()) == [
        "fedavg-s0", "fedavg-s1", "fedprox-s0", "fedprox-s1"]
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    by_algo = {a["algorithm"]: a for a in summary["algorithms"]}
    finals = [r.final_acc for r in res.runs if r.algorithm == "fedavg"]
    assert by_algo["fedavg"]["final_acc"]["mean"] == pytest.approx(sum(finals) / 2)  # type: ignore[arg-type]
    prox_cfg = json.loads((tmp_path / "cmp" / "runs" / "fedprox-s0" / "status.json").read_text())
    assert prox_cfg["algorithm"] == "fedprox"
    assert "mu: 0.5" in (tmp_path / "cmp" / "runs" / "fedprox-s0" / "config.yaml").read_text()


def test_rounds_to_target_and_summary_stats() -> None:
    recs = [{"round": 0, "test_acc": 0.3}, {"round": 1, "test_acc": None}, {"round": 2, "test_acc": 0.7}]
    assert rounds_to_target(recs, 0.5) == 3 and rounds_to_target(recs, 0.3) == 1
    assert rounds_to_target(recs, 0.9) is None and rounds_to_target(recs, None) is None
    p = Path(".")
    runs = [RunSummary("a", 0, p, 0.5, 0.6, 3, 1.0), RunSummary("a", 1, p, 0.7, 0.8, None, 1.0),
            RunSummary("b", 0, p, None, None, None, None, error="diverged")]
    a, b = summarize(runs, ["a", "b"])
    assert a.final == pytest.approx((0.6, 0.1414213562)) and a.reach == (3.0, None) and a.reached == 1
    assert b == AlgorithmSummary("b", 1, None, None, None, 0, 1)
    table = markdown_table([a, b], 0.75)
    assert "| a | 60.00 ± 14.14 | 70.00 ± 14.14 | 3.0 (1/2) | 0 |" in table  # one seed reached: no ± 0.0
    one = summarize(runs[:1], ["a"])[0]  # a single seed has no spread: the table says n=1, never "± 0.00"
    assert one.final == (0.5, None)
    assert "| a | 50.00 (n=1) | 60.00 (n=1) | 3.0 (1/1) | 0 |" in markdown_table([one], 0.75)
    assert "| b | — | — | not reached (0/1) | 1 |" in table


def test_sampling_check_can_fail() -> None:
    same = {("a", 0): [{"round": 0, "clients": [1, 2]}], ("b", 0): [{"round": 0, "clients": [1, 2]}],
            ("a", 1): [{"round": 0, "clients": [3, 4]}]}
    assert sampling_identical(same)
    same[("b", 0)] = [{"round": 0, "clients": [1, 3]}]
    assert not sampling_identical(same)
