"""Experiment configuration: frozen dataclasses, loaded from YAML with strict validation.

Unknown keys, wrong types and out-of-range values raise ``ConfigError`` with the dotted path of the
offending key, so a typo never silently falls back to a default.

Algorithm options are typed too: ``AlgorithmConfig.options`` is the strategy's ``StrategyOptions``
subclass (fedent/strategies/options.py), built and validated once when the config is built. Each
field is declared with ``option(default, doc, gt=..., ...)``; its type (``Literal`` choices included)
and range are checked in ``StrategyOptions.__post_init__``, so every consumer (strategies, simulator,
aggregator, workers, estimator service) receives an object that is already valid.

Why ~520 lines in one module: every config section and the option machinery share one validator
(types, ranges, dotted error paths); split, each half would re-implement it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration problem, with a one-line message naming the key.

    ``problems`` holds every problem found (one message each); a config with several bad keys raises one
    error that lists them all (``"; "``-joined, still one line), so one edit fixes the file.
    """

    def __init__(self, message: str = "", problems: list[str] | None = None) -> None:
        self.problems = list(problems) if problems else [message]
        super().__init__(message if problems is None else "; ".join(self.problems))


def _raise_all(problems: list[str]) -> None:
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(problems=problems)


class _Collect:
    """Gather the ConfigErrors of several independent steps, then raise them as one."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def run(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ConfigError as e:
            self.problems.extend(e.problems)
            return None

    def check(self, ok: bool, key: str, why: str) -> None:
        if not ok:
            self.problems.append(f"{key}: {why}")

    def raise_any(self) -> None:
        _raise_all(self.problems)


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
    # central: every process loads data.name and rebuilds the partition; workers: each worker brings its
    # clients' data from its own disk (python -m client --data SPEC) and reports the sample counts
    placement: Literal["central", "workers"] = "central"
    # the model's input when no process can read it from a dataset (placement workers with a plug-in dataset)
    num_classes: int | None = None
    in_channels: int | None = None
    image_size: int | None = None
    server_test: str | None = None  # a .npz/.pt file (x, y): the aggregator's held-out set with placement workers

    def validate(self) -> None:
        c = _Collect()
        c.check(self.placement in ("central", "workers"), "data.placement", "must be central or workers")
        for key in ("num_classes", "in_channels", "image_size"):
            v = getattr(self, key)
            c.check(v is None or v >= 1, f"data.{key}", "must be >= 1 or null")
        c.check(self.partition in ("iid", "pathological", "dirichlet"), "data.partition",
               "must be one of iid, pathological, dirichlet")
        c.check(self.dirichlet_flavour in ("client", "class"), "data.dirichlet_flavour", "must be client or class")
        c.check(self.num_clients >= 1, "data.num_clients", "must be >= 1")
        c.check(self.alpha > 0, "data.alpha", "must be > 0")
        c.check(self.shards_per_client >= 1, "data.shards_per_client", "must be >= 1")
        c.check(self.min_samples >= 0, "data.min_samples", "must be >= 0")
        c.raise_any()


@dataclass(frozen=True)
class ModelConfig:
    name: str = "mnist-cnn"  # mnist-cnn | cifar10-cnn | lenet5 | vgg11
    dropout: float = 0.0

    def validate(self) -> None:
        c = _Collect()
        c.check(0.0 <= self.dropout < 1.0, "model.dropout", "must be in [0, 1)")
        c.raise_any()


ExecutorName = Literal["auto", "sequential", "vectorised"]
EXECUTORS: tuple[str, ...] = typing.get_args(ExecutorName)
Precision = Literal["float32", "tf32"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
ConvPath = Literal["direct", "unfold"]
CONV_PATHS: tuple[str, ...] = typing.get_args(ConvPath)


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
    # server: the aggregator evaluates w(t+1) on a held-out set; federated: every client evaluates it on its
    # local test split and the run reports the sample-weighted mean
    evaluation: Literal["server", "federated"] = "server"
    executor: ExecutorName = "auto"  # how the simulator runs a round's clients
    max_parallel_clients: int | None = None  # vectorised: clients per chunk (None: from free device memory)
    # float32: exact float32 everywhere (executors and workers agree to ~1e-6); tf32: on CUDA, convolutions and
    # matmuls may round their inputs to TF32 on tensor cores (PyTorch's own default for cuDNN convolutions),
    # several times faster on Ampere and later, ~1e-3 relative per step. No effect on the CPU.
    precision: Precision = "float32"
    # vectorised executor: direct (vmap's grouped convolution) or unfold (im2col + one batched matmul per layer,
    # which tensor cores run well); the same function, float32 results agree to ~1e-6
    conv: ConvPath = "direct"

    def validate(self) -> None:
        c = _Collect()
        c.check(self.rounds >= 1, "train.rounds", "must be >= 1")
        c.check(0.0 < self.fraction <= 1.0, "train.fraction", "must be in (0, 1]")
        c.check(self.local_epochs >= 1, "train.local_epochs", "must be >= 1")
        c.check(self.batch_size >= 1, "train.batch_size", "must be >= 1")
        c.check(self.lr > 0, "train.lr", "must be > 0")
        c.check(self.eval_every >= 1, "train.eval_every", "must be >= 1")
        c.check(self.local_eval >= 0, "train.local_eval", "must be >= 0")
        c.check(self.evaluation in ("server", "federated"), "train.evaluation", "must be server or federated")
        c.check(self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
               "train.device", "must be auto, cpu, cuda or cuda:N")
        c.check(self.executor in EXECUTORS, "train.executor", f"must be one of {', '.join(EXECUTORS)}")
        c.check(self.max_parallel_clients is None or self.max_parallel_clients >= 1, "train.max_parallel_clients",
                "must be >= 1 or null")
        c.check(self.precision in PRECISIONS, "train.precision", f"must be one of {', '.join(PRECISIONS)}")
        c.check(self.conv in CONV_PATHS, "train.conv", f"must be one of {', '.join(CONV_PATHS)}")
        c.raise_any()


# ---- typed strategy options ----------------------------------------------------------------------


class OptionError(ConfigError):
    """A bad option value; ``field`` and ``why`` let a caller re-prefix the key (e.g. the estimator's)."""

    def __init__(self, prefix: str, field_name: str, why: str) -> None:
        super().__init__(f"{prefix}.{field_name}: {why}")
        self.field, self.why = field_name, why


def option(default: T, doc: str, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
           le: float | None = None) -> T:
    """Declare a ``StrategyOptions`` field: its default, a one-line doc, and its range (bounds on numbers).

    The type comes from the annotation: ``float`` (ints accepted), ``int``, ``bool``, ``str``, a ``Literal``
    of strings (the allowed choices) or ``X | None`` (None always allowed, the bounds apply otherwise).
    """
    meta = {"doc": doc, "gt": gt, "ge": ge, "lt": lt, "le": le}
    return field(default=default, metadata=meta)


def _range_text(m: Mapping[str, Any]) -> str | None:
    lo = ("(", m["gt"]) if m.get("gt") is not None else ("[", m["ge"]) if m.get("ge") is not None else None
    hi = (")", m["lt"]) if m.get("lt") is not None else ("]", m["le"]) if m.get("le") is not None else None
    if lo and hi:
        return f"must be in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}"
    if lo:
        return f"must be {'>' if lo[0] == '(' else '>='} {lo[1]:g}"
    if hi:
        return f"must be {'<' if hi[0] == ')' else '<='} {hi[1]:g}"
    return None


def _in_range(v: float, m: Mapping[str, Any]) -> bool:
    return not ((m.get("gt") is not None and not v > m["gt"]) or (m.get("ge") is not None and not v >= m["ge"])
                or (m.get("lt") is not None and not v < m["lt"]) or (m.get("le") is not None and not v <= m["le"]))


@dataclass(frozen=True)
class StrategyOptions:
    """Base of every strategy's options: a frozen dataclass of ``option(...)`` fields, valid once built.

    ``__post_init__`` checks each field's type and range (ints are stored as floats where the field is a
    float) and then calls ``check()`` for cross-field rules. Errors are ``OptionError``s keyed
    ``algorithm.<field>``. ``from_mapping`` parses the flat YAML layout; ``to_dict`` writes it back.
    """

    algorithm: ClassVar[str] = ""  # the strategy name, set by each subclass (for error messages)

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            try:
                coerced = _coerce(value, hints[f.name], f.name)
            except ConfigError:
                raise OptionError("algorithm", f.name, f"{_type_text(hints[f.name])}, got {value!r}") from None
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)
            why = _range_text(f.metadata)
            if why is not None and isinstance(coerced, (int, float)) and not _in_range(coerced, f.metadata):
                none_ok = type(None) in typing.get_args(hints[f.name])
                raise OptionError("algorithm", f.name, f"{why}{' or null' if none_ok else ''}, got {coerced!r}")
        self.check()

    def check(self) -> None:
        """Cross-field rules (raise ``OptionError``); single fields are checked from their declarations."""

    @classmethod
    def from_mapping(cls: type[SO], raw: Mapping[str, Any] | None, prefix: str = "algorithm") -> SO:
        """Build from the flat YAML layout; unknown keys name the keys that are allowed."""
        raw = dict(raw or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            allowed = ", ".join(sorted(names)) or "(none)"
            raise ConfigError(f"{prefix}: unknown key(s) {', '.join(unknown)} for {cls.algorithm or cls.__name__}; "
                              f"allowed: {allowed}")
        try:
            return cls(**raw)
        except OptionError as e:
            if prefix == "algorithm":
                raise
            raise OptionError(prefix, e.field, e.why) from None

    def to_dict(self) -> dict[str, Any]:
        """Every field, in declaration order (the ``algorithm:`` section of config.yaml, besides ``name``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Field name -> its one-line doc."""
        return {f.name: str(f.metadata.get("doc", "")) for f in dataclasses.fields(cls)}


SO = TypeVar("SO", bound=StrategyOptions)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field annotations of an Options class (cached: resolving is the slow part)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _type_text(tp: Any) -> str:
    """What a field accepts, as the start of an error message."""
    if typing.get_origin(tp) is typing.Literal:
        return "must be one of " + ", ".join(str(a) for a in typing.get_args(tp))
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return "expected " + " or ".join(names.get(a, str(a)) for a in args)


def options_class(name: str) -> type[StrategyOptions]:
    """The Options class of algorithm ``name`` (torch-free: fedent.strategies.options, not the strategy)."""
    from fedent.strategies.options import OPTIONS  # local import: the options module imports this one

    if name in OPTIONS:
        return OPTIONS[name]
    from fedent import plugins  # an import path or an installed package's entry point (docs/extending.md)

    if plugins.is_import_path(name) or plugins.has_entry_point("strategies", name):
        opts: type[StrategyOptions] = plugins.strategy_class(name).Options
        return opts
    listed = ", ".join(sorted(OPTIONS))
    raise ConfigError(f"algorithm.name: unknown algorithm {name!r}; available: {listed} "
                      "(or an import path 'package.module:Class')")


@dataclass(frozen=True)
class AlgorithmConfig:
    """``name`` picks the strategy; ``options`` is that strategy's typed Options, valid once built.

    ``options`` may be given as a plain mapping (the YAML layout without ``name``): it is parsed here,
    once. Left out, the strategy's defaults apply. YAML: ``algorithm: {name: fedent, beta: 0.99, ...}``.
    """

    name: str = "fedent"
    options: StrategyOptions = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError("algorithm.name: expected a string")
        cls = options_class(self.name)
        opts: Any = self.options
        if opts is None:
            opts = cls()
        elif isinstance(opts, Mapping):
            opts = cls.from_mapping(opts)
        elif type(opts) is not cls:
            raise ConfigError(f"algorithm.options: {type(opts).__name__} given for {self.name}, "
                              f"which takes {cls.__name__}")
        object.__setattr__(self, "options", opts)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> AlgorithmConfig:
        """The YAML layout ``{name: ..., <options>}`` (name defaults to fedent)."""
        if raw is not None and not isinstance(raw, Mapping):
            raise ConfigError("algorithm: expected a mapping")
        opts = dict(raw or {})
        return cls(name=opts.pop("name", "fedent"), options=opts)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.options.to_dict()}

    def options_as(self, kind: type[SO]) -> SO | None:
        """The options when they are ``kind`` (e.g. FedEntOptions), else None: typed access for consumers."""
        return self.options if type(self.options) is kind else None


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "experiment"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    out_dir: str = "runs"

    def validate(self) -> None:
        c = _Collect()
        c.run(self.data.validate)
        c.run(self.model.validate)
        c.run(self.train.validate)
        c.raise_any()

    def to_dict(self) -> dict[str, Any]:
        # The algorithm section keeps its flat YAML layout {name, <options>} (asdict would nest "options").
        return {
            "name": self.name,
            "data": dataclasses.asdict(self.data),
            "model": dataclasses.asdict(self.model),
            "train": dataclasses.asdict(self.train),
            "algorithm": self.algorithm.to_dict(),
            "out_dir": self.out_dir,
        }


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against a (simple) type annotation; ints are accepted where floats are."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {_type_text(tp)}, got {value!r}")
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if any(value == c and type(value) is type(c) for c in choices):
            return value
        raise ConfigError(f"{key}: must be one of {', '.join(str(c) for c in choices)}, got {value!r}")
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
    c = _Collect()
    if unknown:
        c.problems.append(f"{prefix}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    kwargs = {k: c.run(_coerce, v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in raw.items() if k in names}
    c.raise_any()  # every unknown key and bad type at once
    return cls(**kwargs)


def config_from_dict(raw: Mapping[str, Any]) -> ExperimentConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping")
    allowed = {"name", "data", "model", "train", "algorithm", "out_dir"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        listed = ", ".join(sorted(allowed))
        raise ConfigError(f"config: unknown top-level key(s) {', '.join(unknown)}; allowed: {listed}")
    c = _Collect()  # every section is checked, and all their problems reported together
    data = c.run(dataclass_from_mapping, DataConfig, raw.get("data"), "data")
    model = c.run(dataclass_from_mapping, ModelConfig, raw.get("model"), "model")
    train = c.run(dataclass_from_mapping, TrainConfig, raw.get("train"), "train")
    algorithm = c.run(AlgorithmConfig.from_mapping, raw.get("algorithm"))
    for section in (data, model, train):
        if section is not None:
            c.run(section.validate)
    if data is not None and model is not None and not c.problems:
        from fedent import plugins  # plug-ins resolve now, before any data loads

        c.run(plugins.check_names, data.name, model.name)
        c.run(plugins.check_placement, data, train)
    c.raise_any()
    return ExperimentConfig(name=str(raw.get("name", "experiment")), data=data, model=model, train=train,
                            algorithm=algorithm, out_dir=str(raw.get("out_dir", "runs")))


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
    """Apply ``key.sub=value`` overrides in order.

    ``algorithm.name=X`` that changes the algorithm drops the previous algorithm's options (they belong to
    it, e.g. FedEnt's beta means nothing to FedAvg); ``algorithm.<option>`` overrides given in the same
    call are kept, before or after the name change, so they apply to the new algorithm.
    """
    out = dict(raw)
    given: dict[str, Any] = {}  # algorithm.<option> values set by these overrides
    for text in overrides:
        path, value = parse_override(text)
        if len(path) == 2 and path[0] == "algorithm":
            section = out.get("algorithm")
            section = dict(section) if isinstance(section, Mapping) else {}
            if path[1] == "name" and value != section.get("name", AlgorithmConfig.name):
                out["algorithm"] = {"name": value, **given}
                continue
            if path[1] != "name":
                given[path[1]] = value
        node = out
        for p in path[:-1]:
            child = node.get(p)
            child = dict(child) if isinstance(child, Mapping) else {}
            node[p] = child
            node = child
        node[path[-1]] = value
    return out


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate (the algorithm's options become its typed Options here, once)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return config_from_dict(apply_overrides(raw, overrides or []))


def with_device(cfg: ExperimentConfig, device: str | None) -> ExperimentConfig:
    """The config with ``train.device`` replaced by an explicit --device, so config.yaml says what ran."""
    if device is None:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=device))
