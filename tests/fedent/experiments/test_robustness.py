"""The robustness grid of ``fedent reproduce --profile robust`` (fedent.experiments.robustness): one line per
attack with the clean run first, a column per (defence, algorithm), "diverged" where the attack drove the model
non-finite, "—" where a pair was not run, and each defence's seconds per round without attack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import tiny_inputs

from fedent.experiments.plan import build_plan
from fedent.experiments.profiles import Profile, Row, Section, Setting
from fedent.experiments.reproduce import run_plan
from fedent.experiments.reproduce_report import write_report
from fedent.experiments.robustness import attack_defence, robustness_lines

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _setting(attack: str, *sets: str) -> dict[str, Any]:
    return {"overrides": ["train.rounds=10", f"adversary.attack={attack}", *sets], "train": {"rounds": 10}}


def _table(fedavg: float | None, fedent: float | None, wall: float = 20.0, diverged: int = 0) -> dict[str, Any]:
    def row(name: str, acc: float | None) -> dict[str, Any]:
        return {"row": name, "final_acc": None if acc is None else {"mean": acc}, "diverged": diverged,
                "wall_s": {"mean": wall}}
    return {"rows": [row("fedavg", fedavg), row("fedent", fedent)]}


def test_attack_defence_names_the_rule_and_a_clip() -> None:
    assert attack_defence(_setting("scale", "robust.aggregator=median")) == ("scale", "median")
    assert attack_defence({"overrides": ["train.rounds=3"]}) == ("none", "mean")
    assert attack_defence(_setting("none", "robust.aggregator=mean", "robust.clip_norm=1.0")) == ("none", "clip")
    assert attack_defence(_setting("alie", "robust.aggregator=krum", "robust.clip_norm=2")) == ("alie", "krum+clip")
    assert attack_defence(_setting("alie", "robust.clip_norm=null")) == ("alie", "mean")


def test_the_grid_puts_the_clean_run_first_and_says_diverged_and_not_run() -> None:
    settings = {"none-mean": _setting("none", "robust.aggregator=mean"),
                "none-median": _setting("none", "robust.aggregator=median"),
                "scale-mean": _setting("scale", "robust.aggregator=mean"),
                "scale-median": _setting("scale", "robust.aggregator=median"),
                "none-clip": _setting("none", "robust.aggregator=mean", "robust.clip_norm=1.0")}
    tables = {"robustness/none-mean": _table(0.712, 0.705, 20.0),
              "robustness/none-median": _table(0.70, 0.69, 30.0),
              "robustness/scale-mean": _table(None, None, diverged=1),
              "robustness/scale-median": _table(0.688, 0.6749),
              "robustness/none-clip": _table(0.71, 0.7, 25.0)}
    data = {"settings": settings, "tables": tables, "seeds": [0]}
    sec = {"key": "robustness", "settings": list(settings), "rows": {k: ["fedavg", "fedent"] for k in settings}}
    lines = robustness_lines(data, sec)
    assert "| attack | mean: fedavg | mean: fedent | median: fedavg | median: fedent | clip: fedavg | clip: fedent |" \
        in lines
    grid = [ln for ln in lines if ln.startswith("| none") or ln.startswith("| scale")]
    assert grid == ["| none | 71.2 | 70.5 | 70.0 | 69.0 | 71.0 | 70.0 |",
                    "| scale | diverged | diverged | 68.8 | 67.5 | — | — |"]
    assert "seed(s) 0" in lines[1]
    assert lines[-1].endswith("mean 2.00 / 2.00; median 3.00 / 3.00; clip 2.50 / 2.50.")


def test_a_robust_plan_reports_one_grid_and_no_table_per_setting(tmp_path: Path) -> None:
    """Four tiny settings through run_plan and write_report: one grid line per attack with each (defence,
    algorithm) cell filled from its run, and no per-setting tables or figures."""
    base = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
            "train": {"rounds": 2, "fraction": 1.0, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "device": "cpu"}}
    grid = [("none", "mean"), ("none", "median"), ("scale", "mean"), ("scale", "median")]
    settings = tuple(Setting(f"{a}-{d}", f"{a}, {d}", base, ("adversary.fraction=0.25", f"adversary.attack={a}",
                                                             f"robust.aggregator={d}"))
                     for a, d in grid)
    prof = Profile("tiny", "test", settings, (Row("fedavg", "fedavg"),),
                   (Section("robustness", "Robustness", tuple(s.key for s in settings), ("fedavg",)),))
    out = tmp_path / "out"
    plan = build_plan(prof, [0], out, CONFIGS)
    outcomes = list(run_plan(plan, 1, 1, lambda cfg: tiny_inputs(4, 12, cfg.train.seed)))
    assert [o.status for o in outcomes] == ["done"] * 4
    write_report(plan, out, {"argv": ["fedent", "reproduce"], "machine": {}, "commit": "abc"})
    text = (out / "report.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    acc = {k: 100 * summary["tables"][f"robustness/{k}"]["rows"][0]["final_acc"]["mean"] for k in
           ("none-mean", "none-median", "scale-mean", "scale-median")}
    assert "| attack | mean: fedavg | median: fedavg |" in text
    assert f"| none | {acc['none-mean']:.1f} | {acc['none-median']:.1f} |" in text
    assert f"| scale | {acc['scale-mean']:.1f} | {acc['scale-median']:.1f} |" in text
    assert "**none, mean**" not in text and not list((out / "figures").glob("*.png"))
