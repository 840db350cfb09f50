"""fedent tune --reuse: a search that adds a knob reads back an earlier search's runs of the same configs (copied in
under the new names, files unchanged) and trains only the points that search never ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sim_support import tiny_config, tiny_inputs

from fedent import runlog
from fedent.config import ConfigError, ExperimentConfig
from fedent.experiments.reuse import LOG_FILES, adopt, candidates
from fedent.experiments.tuning import Tuner
from fedent.inputs import RunInputs


def _inputs(cfg: ExperimentConfig) -> RunInputs:
    return tiny_inputs(seed=cfg.train.seed)


def _tuner(out: Path, reuse: list[Path] | None = None, log: list[str] | None = None, **train: object) -> Tuner:
    cfg = tiny_config("fednorm", rounds=2, local_eval=0, **train)
    return Tuner(cfg, [0, 1], out, fraction=0.2, tail_k=2, max_extend=0, inputs_for=_inputs, reuse=reuse or [],
                 log=None if log is None else log.append)


RATES = {"train.lr": [0.02, 0.05, 0.1]}


def test_a_search_that_adds_a_knob_reads_the_earlier_runs_back_and_trains_only_the_new_points(tmp_path: Path) -> None:
    first = _tuner(tmp_path / "rate").tune("fednorm", RATES)
    lines: list[str] = []
    second = _tuner(tmp_path / "beta", [tmp_path / "rate"], lines).tune(
        "fednorm", {**RATES, "fednorm.algorithm.beta": [0.9, 0.99]})
    assert second.knobs[0].to_dict() == first.knobs[0].to_dict()  # the rate step: the same scores and choice
    best = first.chosen["train.lr"]
    runs = tmp_path / "beta" / "runs" / "fednorm"
    read = {f"beta0.99_lr{lr:g}-s{s}" for lr in RATES["train.lr"] for s in (0, 1)}
    trained = {f"beta0.9_lr{best:g}-s{s}" for s in (0, 1)}
    assert {d.name for d in runs.iterdir()} == read | trained
    for name in read:  # copied, unchanged, the logs only (no model, no checkpoint: nothing was trained here)
        src = tmp_path / "rate" / "runs" / "fednorm" / name.removeprefix("beta0.99_")
        files = sorted(f.name for f in (runs / name).iterdir())
        assert files == sorted(n for n in LOG_FILES if (src / n).is_file()) and "metrics.jsonl" in files
        assert all((runs / name / f).read_bytes() == (src / f).read_bytes() for f in files)
        assert f"tune fednorm: {name}: read back from {src}" in lines
    for name in trained:
        assert (runs / name / "model_final.pt").is_file()
        assert not any(line.startswith(f"tune fednorm: {name}: read back") for line in lines)
    assert second.runs == len(read) + len(trained)


def test_only_a_settled_run_of_the_same_config_is_read_back(tmp_path: Path) -> None:
    _tuner(tmp_path / "rate").tune("fednorm", {"train.lr": [0.02, 0.05]})
    earlier = tmp_path / "rate" / "runs" / "fednorm"
    cut = earlier / "lr0.02-s1"  # cut short: round 2 missing
    cut_lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text(cut_lines[0] + "\n")
    other = earlier / "lr0.05-s0"  # another config under a matching name
    written = yaml.safe_load((other / "config.yaml").read_text())
    written["train"]["local_epochs"] = 2
    (other / "config.yaml").write_text(yaml.safe_dump(written))
    lines: list[str] = []
    _tuner(tmp_path / "beta", [tmp_path / "rate"], lines).tune(
        "fednorm", {"train.lr": [0.02, 0.05], "fednorm.algorithm.beta": [0.9, 0.99]})
    got = [line.split(":")[1].strip() for line in lines if "read back from" in line]
    assert sorted(got) == ["beta0.99_lr0.02-s0", "beta0.99_lr0.05-s1"]
    runs = tmp_path / "beta" / "runs" / "fednorm"
    for name in ("beta0.99_lr0.02-s1", "beta0.99_lr0.05-s0"):  # trained here, whole
        assert (runs / name / "model_final.pt").is_file()
        assert len(runlog.read_metrics(runs / name / "metrics.jsonl")) == 2
    assert (cut / "metrics.jsonl").read_text() == cut_lines[0] + "\n"  # the earlier search's files are not touched


def test_a_diverged_run_is_settled_and_read_back_an_existing_point_never_overwritten(tmp_path: Path) -> None:
    cfg = tiny_config("fednorm", rounds=2)
    src = tmp_path / "old" / "runs" / "fednorm" / "lr9-s0"
    src.mkdir(parents=True)
    (src / "config.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(runlog.jsonable(cfg.to_dict())))))
    (src / "metrics.jsonl").write_text("")
    (src / "status.json").write_text(json.dumps({"phase": "failed", "state": {"error": "RunError: the local model "
                                                                                       "is not finite"}}))
    assert candidates([tmp_path / "old"], "fednorm", 0) == [src] and candidates([tmp_path / "old"], "fednorm", 1) == []
    dst = tmp_path / "new" / "beta0.99_lr9-s0"
    assert adopt(dst, cfg.to_dict(), 2, [src]) == src
    assert sorted(f.name for f in dst.iterdir()) == ["config.yaml", "metrics.jsonl", "status.json"]
    assert [p.name for p in dst.parent.iterdir()] == [dst.name]  # no half-copied directory left beside it
    (dst / "status.json").write_text("{}")
    assert adopt(dst, cfg.to_dict(), 2, [src]) is None and (dst / "status.json").read_text() == "{}"
    (src / "status.json").write_text(json.dumps({"phase": "failed", "state": {"error": "RunError: killed"}}))
    assert adopt(tmp_path / "new" / "other-s0", cfg.to_dict(), 2, [src]) is None  # failed, not diverged: not settled
    assert not (tmp_path / "new" / "other-s0").exists()


def test_reuse_must_name_a_search_output(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--reuse .*not a search's output directory"):
        _tuner(tmp_path / "out", [tmp_path / "nowhere"])
