"""fedent.yamlio: YAML 1.2's floats (an exponent without a dot) load as numbers, the rest as PyYAML's safe loader."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from fedent import yamlio
from fedent.config import load_config, parse_override


@pytest.mark.parametrize("text, want", [("1e-05", 1e-05), ("-2E+3", -2000.0), ("3e2", 300.0), ("1.5e-3", 0.0015),
                                        ("0.1", 0.1), (".5", 0.5), ("+1.0", 1.0)])
def test_exponent_floats_are_numbers(text: str, want: float) -> None:
    got = yamlio.load(text)
    assert isinstance(got, float) and got == want
    if "." not in text:
        assert isinstance(yaml.safe_load(text), str)  # what PyYAML alone gives: the reason for this module


@pytest.mark.parametrize("text, want", [("12", 12), ("true", True), ("null", None), ("e5", "e5"), ("1e", "1e"),
                                        ("1_000", 1000), ("[1, 2e-1]", [1, 0.2]), ("1.2.3", "1.2.3")])
def test_everything_else_loads_as_before(text: str, want: object) -> None:
    assert yamlio.load(text) == want


def test_special_floats_still_load() -> None:
    assert math.isinf(yamlio.load("-.inf")) and math.isnan(yamlio.load(".nan"))


def test_config_files_and_set_overrides_read_exponents_as_numbers(tmp_path: Path) -> None:
    assert parse_override("algorithm.mu=1e-05") == (["algorithm", "mu"], 1e-05)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("name: x\ndata: {name: synthetic, num_clients: 4}\ntrain: {lr: 3e-2, rounds: 1}\n"
                        "algorithm: {name: fedprox, mu: 1e-5}\n")
    cfg = load_config(str(cfg_file), ["privacy.delta=2e-6"])
    assert cfg.train.lr == 0.03 and cfg.privacy.delta == 2e-6
    assert cfg.algorithm.name == "fedprox" and cfg.algorithm.to_dict()["mu"] == 1e-05
