"""Config loading: strict keys, types and values, one-line errors, --set overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.config import ConfigError, ExperimentConfig, apply_overrides, config_from_dict, load_config


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_and_values(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "name: x\ntrain: {rounds: 3, lr: 0.1}\nalgorithm: {name: fedavg}\n"))
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.train.rounds == 3 and cfg.train.lr == 0.1 and cfg.algorithm.name == "fedavg"
    assert cfg.data.num_clients == 100 and cfg.train.fraction == 0.2


@pytest.mark.parametrize(
    "text, needle",
    [
        ("trian: {rounds: 3}\n", "unknown top-level key(s) trian"),
        ("train: {rounds: 3, lr_: 1}\n", "train: unknown key(s) lr_"),
        ("train: {rounds: three}\n", "train.rounds: expected an integer"),
        ("train: {fraction: 1.5}\n", "train.fraction: must be in (0, 1]"),
        ("data: {partition: random}\n", "data.partition"),
        ("algorithm: {name: fedbogus}\n", "unknown algorithm 'fedbogus'"),
        ("algorithm: {name: fedavg, mu: 0.1}\n", "algorithm: unknown key(s) mu"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("train: [1, 2\n", "not valid YAML"),
    ],
)
def test_bad_configs_have_one_line_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_overrides() -> None:
    raw = apply_overrides({"train": {"rounds": 1}}, ["train.rounds=5", "data.alpha=0.1", "name=y"])
    cfg = config_from_dict(raw)
    assert cfg.train.rounds == 5 and cfg.data.alpha == 0.1 and cfg.name == "y"
    with pytest.raises(ConfigError):
        apply_overrides({}, ["novalue"])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
