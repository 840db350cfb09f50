"""The robustness grid of ``fedent reproduce --profile robust`` (fedent.experiments.robustness): one line per
attack with the clean run first, a column per (defence, algorithm), "diverged" where the attack drove the model
non-finite, "—" where a pair was not run, and each defence's seconds per round without attack."""

from __future__ import annotations

from typing import Any

from fedent.experiments.robustness import attack_defence, robustness_lines


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
    sec = {"key": "robustness", "settings": list(settings), "rows": ["fedavg", "fedent"]}
    lines = robustness_lines(data, sec)
    assert "| attack | mean: fedavg | mean: fedent | median: fedavg | median: fedent | clip: fedavg | clip: fedent |" \
        in lines
    grid = [ln for ln in lines if ln.startswith("| none") or ln.startswith("| scale")]
    assert grid == ["| none | 71.2 | 70.5 | 70.0 | 69.0 | 71.0 | 70.0 |",
                    "| scale | diverged | diverged | 68.8 | 67.5 | — | — |"]
    assert "seed(s) 0" in lines[1]
    assert lines[-1].endswith("mean 2.00 / 2.00; median 3.00 / 3.00; clip 2.50 / 2.50.")
