"""Experiment configuration: frozen dataclasses, loaded from YAML with strict validation.

Unknown keys, wrong types and out-of-range values raise ``ConfigError`` with the dotted path of the
offending key, so a typo never silently falls back to a default. Algorithm-specific options are
validated against the options dataclass that each strategy declares (see fedent.strategies.registry).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration problem, with a one-line message naming the key."""


@dataclass(frozen=True)
class DataConfig:
    name: str = "fashion-mnist"
    root: str | None = None  # explicit data root; searched first
    download: bool = False  # allow torchvision's download as the last resort
    num_clients: int = 100
    partition: str = "pathological"  # iid | pathological | dirichlet
    alpha: float = 0.5  # Dirichlet concentration α_d
    dirichlet_flavour: str = "client"  # client: q_k ~ Dir(α) (Hsu et al.); class: per-class over clients
    shards_per_client: int = 2
    min_samples: int = 10  # minimum samples per client for Dirichlet splits
    max_train_samples: int | None = None  # optional seeded subsample of the train set (smoke runs)
    max_test_samples: int | None = None
    synthetic_train: int = 6000  # sizes of the seeded synthetic dataset
    synthetic_test: int = 1000

    def validate(self) -> None:
        _check(self.partition in ("iid", "pathological", "dirichlet"), "data.partition",
               "must be one of iid, pathological, dirichlet")
        _check(self.dirichlet_flavour in ("client", "class"), "data.dirichlet_flavour", "must be client or class")
        _check(self.num_clients >= 1, "data.num_clients", "must be >= 1")
        _check(self.alpha > 0, "data.alpha", "must be > 0")
        _check(self.shards_per_client >= 1, "data.shards_per_client", "must be >= 1")
        _check(self.min_samples >= 0, "data.min_samples", "must be >= 0")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "mnist-cnn"  # mnist-cnn | cifar10-cnn | lenet5 | vgg11
    dropout: float = 0.0

    def validate(self) -> None:
        _check(0.0 <= self.dropout < 1.0, "model.dropout", "must be in [0, 1)")


@dataclass(frozen=True)
class TrainConfig:
    rounds: int = 50
    fraction: float = 0.2  # participation per round
    local_epochs: int = 3
    batch_size: int = 32
    lr: float = 0.01  # base learning rate (Table IV); FedEnt's η_i(-1)
    eval_every: int = 1
    eval_batch_size: int = 1000
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    target_accuracy: float | None = None  # for "rounds to reach" in comparisons
    local_eval: int = 0  # evaluate this many uploaded local models per eval round (paper Fig. client_dev)

    def validate(self) -> None:
        _check(self.rounds >= 1, "train.rounds", "must be >= 1")
        _check(0.0 < self.fraction <= 1.0, "train.fraction", "must be in (0, 1]")
        _check(self.local_epochs >= 1, "train.local_epochs", "must be >= 1")
        _check(self.batch_size >= 1, "train.batch_size", "must be >= 1")
        _check(self.lr > 0, "train.lr", "must be > 0")
        _check(self.eval_every >= 1, "train.eval_every", "must be >= 1")
        _check(self.local_eval >= 0, "train.local_eval", "must be >= 0")
        _check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
               "train.device", "must be auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = "fedent"
    options: Mapping[str, Any] = field(default_factory=dict)  # validated by the strategy's Options


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    out_dir: str = "runs"

    def validate(self) -> None:
        self.data.validate()
        self.model.validate()
        self.train.validate()

    def to_dict(self) -> dict[str, Any]:
        # asdict() would deep-copy the read-only options mapping, which cannot be pickled: build by hand.
        return {
            "name": self.name,
            "data": dataclasses.asdict(self.data),
            "model": dataclasses.asdict(self.model),
            "train": dataclasses.asdict(self.train),
            "algorithm": {"name": self.algorithm.name, **dict(self.algorithm.options)},
            "out_dir": self.out_dir,
        }


def _check(ok: bool, key: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {why}")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against a (simple) type annotation; ints are accepted where floats are."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {tp}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def dataclass_from_mapping(cls: Any, raw: Mapping[str, Any] | None, prefix: str) -> Any:
    """Build a frozen dataclass from a mapping; unknown keys and bad types are ConfigErrors."""
    raw = dict(raw or {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix}: expected a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"{prefix}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in raw.items()}
    return cls(**kwargs)


def config_from_dict(raw: Mapping[str, Any]) -> ExperimentConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping")
    allowed = {"name", "data", "model", "train", "algorithm", "out_dir"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        listed = ", ".join(sorted(allowed))
        raise ConfigError(f"config: unknown top-level key(s) {', '.join(unknown)}; allowed: {listed}")
    algo_raw = dict(raw.get("algorithm") or {})
    algo_name = algo_raw.pop("name", "fedent")
    if not isinstance(algo_name, str):
        raise ConfigError("algorithm.name: expected a string")
    cfg = ExperimentConfig(
        name=str(raw.get("name", "experiment")),
        data=dataclass_from_mapping(DataConfig, raw.get("data"), "data"),
        model=dataclass_from_mapping(ModelConfig, raw.get("model"), "model"),
        train=dataclass_from_mapping(TrainConfig, raw.get("train"), "train"),
        algorithm=AlgorithmConfig(name=algo_name, options=types.MappingProxyType(algo_raw)),
        out_dir=str(raw.get("out_dir", "runs")),
    )
    cfg.validate()
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """``key.sub=value`` with the value parsed as YAML (so 0.1, true, null and [1,2] work)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value")
    key, _, value = text.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: bad value ({e.__class__.__name__})") from None
    return path, parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = dict(raw)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for p in path[:-1]:
            child = node.get(p)
            child = dict(child) if isinstance(child, Mapping) else {}
            node[p] = child
            node = child
        node[path[-1]] = value
    return out


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate; the algorithm options are checked against the strategy too."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    cfg = config_from_dict(apply_overrides(raw, overrides or []))
    from fedent.strategies.registry import validate_algorithm  # local import: registry imports config

    validate_algorithm(cfg.algorithm)
    return cfg


def with_device(cfg: ExperimentConfig, device: str | None) -> ExperimentConfig:
    """The config with ``train.device`` replaced by an explicit --device, so config.yaml says what ran."""
    if device is None:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=device))
