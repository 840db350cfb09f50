"""The report's privacy table (issue 26): ε read from each run's own log beside the rows' final accuracy; the
settings line names the overrides the runs trained with."""

from __future__ import annotations

from pathlib import Path

from conftest import tiny_inputs

from fedent import runlog
from fedent.experiments.plan import build_plan
from fedent.experiments.profiles import Profile, Row, Section, Setting
from fedent.experiments.reproduce import run_plan
from fedent.experiments.reproduce_report import write_report

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_the_privacy_section_is_one_table_of_epsilon_against_accuracy(tmp_path: Path) -> None:
    base = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
            "train": {"rounds": 2, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "device": "cpu"}}
    dp = ("privacy.dp=central", "privacy.noise_multiplier=1.0")
    prof = Profile("tiny", "test", (Setting("plain", "no DP", base), Setting("dp-central-z1", "central", base, dp)),
                   (Row("fedavg", "fedavg"), Row("fedent", "fedent")),
                   (Section("privacy", "Privacy", ("plain", "dp-central-z1"), ("fedavg", "fedent")),))
    out = tmp_path / "out"
    plan = build_plan(prof, [0], out, CONFIGS)
    assert [o.status for o in run_plan(plan, 1, 1, lambda cfg: tiny_inputs(4, 12, cfg.train.seed))] == ["done"] * 4
    report = write_report(plan, out, {"argv": ["fedent", "reproduce"], "machine": {}, "commit": "abc"}).read_text()
    runs = {(s.setting, s.row): runlog.read_metrics(s.run_dir / "metrics.jsonl") for s in plan.runs}
    eps = runs[("dp-central-z1", "fedavg")][-1]["privacy"]["epsilon"]
    assert eps == runs[("dp-central-z1", "fedent")][-1]["privacy"]["epsilon"] > 0
    acc = {k: 100 * runlog.final_accuracy(v) for k, v in runs.items()}  # type: ignore[operator]
    assert (f"| dp-central-z1 | central | 1.0 | {eps:.3g} at δ=1e-05 | {acc[('dp-central-z1', 'fedavg')]:.2f} (n = 1) "
            f"| {acc[('dp-central-z1', 'fedent')]:.2f} (n = 1) |") in report
    assert (f"| plain | none | — | — | {acc[('plain', 'fedavg')]:.2f} (n = 1) | "
            f"{acc[('plain', 'fedent')]:.2f} (n = 1) |") in report


def test_the_settings_line_names_the_set_overrides_the_runs_trained_with(tmp_path: Path) -> None:
    """``--set`` over a setting's own value of the same key: the report gives the value the runs trained with, once."""
    base = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid"},
            "train": {"rounds": 2, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "device": "cpu"}}
    prof = Profile("tiny", "test", (Setting("plain", "plain", base, ("train.local_eval=2", "train.lr=0.2")),),
                   (Row("fedavg", "fedavg"),), (Section("main", "Main", ("plain",), ("fedavg",)),))
    plan = build_plan(prof, [0], tmp_path / "out", CONFIGS, overrides=["train.local_eval=0"])
    assert plan.runs[0].config["train"]["local_eval"] == 0
    report = write_report(plan, tmp_path / "out", {"argv": ["fedent", "reproduce"], "machine": {}}).read_text()
    assert "every setting also has `--set` `train.local_eval=0` `train.lr=0.2`):" in report
    assert "local_eval=2" not in report
