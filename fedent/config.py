"""Experiment configuration: frozen dataclasses, loaded from YAML with strict validation.

Unknown keys, wrong types and out-of-range values raise ``ConfigError`` with the dotted path of the
offending key, so a typo never silently falls back to a default.

One declarative style for every settings class: the config sections (``DataConfig``, ``ModelConfig``,
``TrainConfig``), the strategies' options (``StrategyOptions`` subclasses, fedent/strategies/options.py)
and the services' process settings (aggregator, estimator, worker) are frozen dataclasses of ``Declared``
whose fields are declared with ``option(default, doc, gt=..., ge=..., lt=..., le=...)``; the annotation
gives the type (``Literal`` for choices, ``X | None`` for nullable). One validator (``declared_problems``)
checks every field's type and range when the object is built and reports every problem, each keyed by the
setting's name; rules that span fields are small ``checks()`` methods. So every consumer (strategies,
simulator, aggregator, workers, estimator service) receives an object that is already valid.

Why ~660 lines in one module: every config section and the option machinery share one validator
(types, ranges, dotted error paths); split, each half would re-implement it.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml

from fedent import yamlio

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

    def raise_any(self) -> None:
        _raise_all(self.problems)


# ---- typed strategy options ----------------------------------------------------------------------


class OptionError(ConfigError):
    """Bad option values, structured: ``fields`` is every (field, why); ``field`` and ``why`` the first one.

    A caller re-keys them (e.g. the estimator's ``params.<field>``) from these, never from the message.
    """

    def __init__(self, prefix: str, field_name: str, why: str, *, more: Sequence[tuple[str, str]] = ()) -> None:
        self.fields: list[tuple[str, str]] = [(field_name, why), *more]
        super().__init__(problems=[f"{prefix}.{n}: {w}" for n, w in self.fields])
        self.field, self.why = field_name, why

    def keyed(self, prefix: str) -> OptionError:
        """The same problems under another key prefix."""
        return OptionError(prefix, self.field, self.why, more=self.fields[1:])


class SettingsError(ConfigError):
    """A bad process setting (aggregator, estimator, worker); one line naming each bad setting."""


def option(default: T, doc: str, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
           le: float | None = None) -> T:
    """Declare a ``Declared`` field: its default, a one-line doc, and its range (bounds on numbers).

    The type comes from the annotation: ``float`` (ints accepted), ``int``, ``bool``, ``str``, a ``Literal``
    of strings (the allowed choices) or ``X | None`` (None always allowed, the bounds apply otherwise).
    """
    meta = {"doc": doc, "gt": gt, "ge": ge, "lt": lt, "le": le}
    return field(default=default, metadata=meta)


def required(doc: str, *, gt: float | None = None, ge: float | None = None, lt: float | None = None,
             le: float | None = None) -> Any:
    """A ``Declared`` field without a default (e.g. the worker's aggregator address)."""
    return field(metadata={"doc": doc, "gt": gt, "ge": ge, "lt": lt, "le": le})


def declared_problems(obj: Any) -> list[tuple[str, str]]:
    """The one validator: every field of the dataclass ``obj`` checked against its annotation (type, ``Literal``
    choices) and its declared range; (field, why) for each problem, in declaration order. Ints are stored as
    floats where the annotation is ``float`` (set in place, on frozen dataclasses too). Types it does not
    know (a nested settings object, ``tuple[int, ...]``) are left to the class's ``checks()``."""
    hints = _hints(type(obj))
    problems: list[tuple[str, str]] = []
    for f in dataclasses.fields(obj):
        value, tp = getattr(obj, f.name), hints[f.name]
        try:
            coerced = _coerce(value, tp, f.name)
        except ConfigError:
            problems.append((f.name, f"{_type_text(tp)}, got {value!r}"))
            continue
        if coerced is not value:
            object.__setattr__(obj, f.name, coerced)
        why = _range_text(f.metadata)
        if (why is not None and isinstance(coerced, (int, float)) and not isinstance(coerced, bool)
                and not _in_range(coerced, f.metadata)):
            none_ok = type(None) in typing.get_args(tp)
            problems.append((f.name, f"{why}{' or null' if none_ok else ''}, got {coerced!r}"))
    return problems


class Declared:
    """Base of a frozen dataclass of ``option(...)`` fields: valid once built.

    ``__post_init__`` runs ``declared_problems`` and then (when every field is fine) ``checks()``, the
    cross-field rules, and raises one ``error_type`` listing every problem, each keyed
    ``<key_prefix>.<field>`` (just ``<field>`` for process settings, whose prefix is empty).
    ``from_mapping`` builds one from a mapping: unknown keys are errors that name the allowed ones.
    """

    key_prefix: ClassVar[str] = ""
    error_type: ClassVar[type[ConfigError]] = ConfigError

    def __post_init__(self) -> None:
        problems = declared_problems(self) or list(self.checks())
        if problems:
            self._fail(problems)

    def checks(self) -> Iterable[tuple[str, str]]:
        """Rules that span fields: (field, why) for each broken one. Single fields are checked from their
        declarations and need nothing here."""
        return ()

    def validate(self) -> None:
        """Check again (built objects are already valid; kept for callers that validate explicitly)."""
        self.__post_init__()

    def _fail(self, problems: list[tuple[str, str]]) -> None:
        p = self.key_prefix
        raise self.error_type(problems=[f"{p}.{k}: {why}" if p else f"{k}: {why}" for k, why in problems])

    @classmethod
    def from_mapping(cls: type[D], raw: Mapping[str, Any] | None, prefix: str | None = None) -> D:
        key = cls.key_prefix if prefix is None else prefix
        built: D = dataclass_from_mapping(cls, raw, key, cls.error_type)
        return built

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Field name -> its one-line doc."""
        return {f.name: str(f.metadata.get("doc", "")) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


D = TypeVar("D", bound=Declared)


# ---- the config sections ---------------------------------------------------------------------------------

Partition = Literal["iid", "pathological", "dirichlet"]
DirichletFlavour = Literal["client", "class"]
Placement = Literal["central", "workers"]


@dataclass(frozen=True)
class DataConfig(Declared):
    key_prefix = "data"

    name: str = option("fashion-mnist", "the dataset (a built-in name or a plug-in's)")
    root: str | None = option(None, "explicit data root; searched first")
    download: bool = option(False, "allow torchvision's download as the last resort")
    num_clients: int = option(100, "number of clients N", ge=1)
    partition: Partition = option("pathological", "how the train set is split among the clients")
    alpha: float = option(0.5, "Dirichlet concentration α_d", gt=0)
    dirichlet_flavour: DirichletFlavour = option("client", "client: q_k ~ Dir(α) (Hsu et al.); class: per-class "
                                                           "over clients")
    shards_per_client: int = option(2, "pathological: label-sorted shards per client", ge=1)
    min_samples: int = option(10, "minimum samples per client for Dirichlet splits", ge=0)
    max_train_samples: int | None = option(None, "optional seeded subsample of the train set (smoke runs)")
    max_test_samples: int | None = option(None, "optional seeded subsample of the test set")
    synthetic_train: int = option(6000, "train size of the seeded synthetic dataset")
    synthetic_test: int = option(1000, "test size of the seeded synthetic dataset")
    placement: Placement = option("central", "central: every process loads data.name and rebuilds the partition; "
                                             "workers: each worker brings its clients' data from its own disk "
                                             "(python -m client --data SPEC) and reports the sample counts")
    # the model's input when no process can read it from a dataset (placement workers with a plug-in dataset)
    num_classes: int | None = option(None, "the model's number of classes when no dataset says it", ge=1)
    in_channels: int | None = option(None, "the model's input channels when no dataset says it", ge=1)
    image_size: int | None = option(None, "the model's input size when no dataset says it", ge=1)
    server_test: str | None = option(None, "a .npz/.pt file (x, y): the aggregator's held-out set with placement "
                                           "workers")
    validation_fraction: float = option(0.0, "a seeded share of every client's training samples held out as the "
                                             "validation set (fedent.data.validation; tuning scores on it, never on "
                                             "the test set); 0: none", ge=0, lt=1)

    def checks(self) -> Iterable[tuple[str, str]]:
        if self.validation_fraction > 0 and self.placement != "central":
            yield "validation_fraction", "needs placement central (the validation set is carved where the partition is)"


@dataclass(frozen=True)
class ModelConfig(Declared):
    key_prefix = "model"

    name: str = option("mnist-cnn", "mnist-cnn | cifar10-cnn | lenet5 | vgg11 (or a plug-in's)")
    dropout: float = option(0.0, "dropout probability", ge=0, lt=1)


ExecutorName = Literal["auto", "sequential", "vectorised"]
EXECUTORS: tuple[str, ...] = typing.get_args(ExecutorName)
Precision = Literal["float32", "tf32"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
ConvPath = Literal["direct", "unfold", "looped"]
UploadEncoding = Literal["none", "int8", "topk"]
CONV_PATHS: tuple[str, ...] = typing.get_args(ConvPath)
Evaluation = Literal["server", "federated"]


@dataclass(frozen=True)
class PerfOptions(Declared):
    """``train.perf``: speed levers of the simulator's trainer (issue 28), each off by default; applied by
    ``fedent.perf`` and checked on the CPU against the default (tests/fedent/test_perf.py states each tolerance)."""

    key_prefix = "train.perf"

    cudnn_benchmark: bool = option(False, "cuDNN autotuning (torch.backends.cudnn.benchmark); no effect on the CPU")
    channels_last: bool = option(False, "the model and the image data in channels-last memory format")
    autocast: Literal["off", "bf16"] = option("off", "bf16: forward passes under bfloat16 autocast, weights and "
                                                     "updates stay float32 (master weights); not exact")
    compile: bool = option(False, "torch.compile the vectorised executor's vmapped step (a one-off compile per run)")
    eval_batched: bool = option(False, "federated evaluation of every client's split in one batched pass on the "
                                       "device instead of one pass per client")


@dataclass(frozen=True)
class TrainConfig(Declared):
    key_prefix = "train"

    rounds: int = option(50, "communication rounds T", ge=1)
    fraction: float = option(0.2, "participation per round", gt=0, le=1)
    local_epochs: int = option(3, "local epochs per round", ge=1)
    batch_size: int = option(32, "local batch size", ge=1)
    lr: float = option(0.01, "base learning rate (Table IV); FedEnt's η_i(-1)", gt=0)
    eval_every: int = option(1, "evaluate every this many rounds (and the last)", ge=1)
    eval_batch_size: int = option(1000, "batch size of evaluation")
    seed: int = option(0, "the run's seed (sampling, partition, batches)")
    device: str = option("auto", "auto | cpu | cuda | cuda:N")
    target_accuracy: float | None = option(None, "for \"rounds to reach\" in comparisons")
    local_eval: int = option(0, "evaluate this many uploaded local models per eval round (paper Fig. client_dev)",
                             ge=0)
    evaluation: Evaluation = option("server", "server: the aggregator evaluates w(t+1) on a held-out set; "
                                              "federated: every client evaluates it on its local test split and "
                                              "the run reports the sample-weighted mean")
    executor: ExecutorName = option("auto", "how the simulator runs a round's clients")
    max_parallel_clients: int | None = option(None, "vectorised: clients per chunk (null: from free device memory)",
                                              ge=1)
    precision: Precision = option("float32", "float32: exact float32 everywhere (executors and workers agree to "
                                             "~1e-6); tf32: on CUDA, convolutions and matmuls may round their "
                                             "inputs to TF32 on tensor cores, several times faster on Ampere and "
                                             "later, ~1e-3 relative per step. No effect on the CPU")
    conv: ConvPath = option("direct", "vectorised executor: direct (vmap's grouped convolution), unfold (im2col + "
                                      "one batched matmul per layer) or looped (one ordinary convolution per "
                                      "client, fedent.looped_conv); the same function, results agree to ~1e-5")
    upload_encoding: UploadEncoding = option("none", "lossy upload of w_i(t+1) - w(t) (fedent.compress), applied by "
                                                     "the simulator and the cluster alike: none, int8 (unbiased "
                                                     "stochastic 8-bit, ~4x fewer bytes), topk (the largest "
                                                     "topk_fraction of entries, with error feedback)")
    topk_fraction: float = option(0.01, "topk: fraction of each tensor's entries sent per upload", gt=0, le=1)
    evaluate_test: bool = option(True, "false (tuning runs): the test set is never evaluated, test_acc stays null and "
                                       "only the validation set (data.validation_fraction) is scored")
    perf: PerfOptions = field(default_factory=PerfOptions, metadata={"doc": "speed levers (PerfOptions)"})

    def __post_init__(self) -> None:
        if isinstance(self.perf, Mapping):  # from YAML: a mapping, built (and checked) as train.perf
            object.__setattr__(self, "perf", PerfOptions.from_mapping(self.perf))
        super().__post_init__()

    def checks(self) -> Iterable[tuple[str, str]]:
        if not isinstance(self.perf, PerfOptions):
            yield "perf", f"expected a mapping, got {self.perf!r}"
        if not (self.device in ("auto", "cpu") or self.device.startswith("cuda")):
            yield "device", "must be auto, cpu, cuda or cuda:N"


Aggregator = Literal["mean", "median", "trimmed-mean", "krum", "multi-krum"]
Attack = Literal["none", "sign-flip", "scale", "gaussian", "label-flip", "alie", "inflate-count"]


@dataclass(frozen=True)
class RobustConfig(Declared):
    """How the server combines the clients' updates, and how far it trusts what they report (fedent.rounds.robust;
    docs/algorithm.md, "Robust aggregation"). The defaults keep plain averaging and bound every client's share."""

    key_prefix = "robust"

    aggregator: Aggregator = option("mean", "mean: the strategy's own weighted mean; median | trimmed-mean: "
                                            "coordinate-wise over the updates; krum | multi-krum: keep the update(s) "
                                            "closest to their neighbours")
    trim: float = option(0.2, "trimmed-mean: the fraction cut from each end of every coordinate", ge=0, lt=0.5)
    clip_norm: float | None = option(None, "bound every update's delta w_i - w(t) to this L2 norm (null: none)", gt=0)
    krum_f: int | None = option(None, "krum/multi-krum: the Byzantine clients tolerated (null: floor((m-3)/2))",
                                ge=0)
    multi_krum_m: int | None = option(None, "multi-krum: updates kept (null: m - f)", ge=1)
    max_weight_share: float | None = option(0.25, "cap on one client's share of any weighted mean (aggregation and "
                                                   "federated evaluation); a round of m < 1/cap clients is "
                                                   "weighted uniformly; null: no cap", gt=0, le=1)
    max_client_samples: int = option(100_000_000, "largest sample or test count a client may report", ge=1)


@dataclass(frozen=True)
class AdversaryConfig(Declared):
    """Simulated attackers (fedent.rounds.adversary): a seeded ``fraction`` of the clients attacks in the client
    half, so in the cluster the workers hosting them attack. Off by default."""

    key_prefix = "adversary"

    attack: Attack = option("none", "sign-flip: -delta; scale: scale * delta; gaussian: N(0, noise_std^2) as the "
                                    "delta; label-flip: train on label C-1-y; alie: the colluding attackers "
                                    "a host trains in a round upload mean - z * std of their honest updates; "
                                    "inflate-count: report inflated_count samples and upload zeros")
    fraction: float = option(0.2, "fraction of the clients that attack (chosen from train.seed)", ge=0, le=1)
    scale: float = option(-10.0, "scale: the factor on the attacker's delta")
    noise_std: float = option(1.0, "gaussian: the standard deviation of the uploaded delta", gt=0)
    inflated_count: int = option(10**12, "inflate-count: the sample count the attacker reports", ge=1)
    z: float | None = option(None, "alie: the number of standard deviations (null: Baruch et al.'s z_max from the "
                                   "number of clients and of attackers)")



DPMode = Literal["none", "central", "local"]
SecAggRounding = Literal["nearest", "stochastic"]
SecAggThreat = Literal["honest-but-curious", "malicious"]


@dataclass(frozen=True)
class PrivacyConfig(Declared):
    """Differential privacy and secure aggregation (docs/security.md, "Privacy" and "Secure aggregation"; the
    mechanisms live in fedent/privacy/ and fedent/secagg/).

    ``central``: client-level DP at the aggregator (each client's update w_i − w(t) clipped to ``clip_norm``,
    Gaussian noise of std ``noise_multiplier`` × ``clip_norm`` added to the sum, divided by the round's sample
    size). ``local``: DP-SGD on each client (per-sample clipping and noise). Either way ε(δ) is accounted
    every round with dp-accounting and logged in metrics.jsonl under ``privacy``.
    """

    key_prefix = "privacy"

    dp: DPMode = option("none", "none | central (client-level, at the aggregator) | local (DP-SGD on each client)")
    noise_multiplier: float = option(1.0, "z: the Gaussian noise's std is z x clip_norm", ge=0)
    clip_norm: float = option(1.0, "C: L2 bound of a client's update (central) or a sample's gradient (local); "
                                   "central with adaptive_clip: the initial bound", gt=0)
    delta: float = option(1e-5, "δ of the reported (ε, δ) guarantee", gt=0, lt=1)
    adaptive_clip: bool = option(False, "central only: Andrew et al. (2021) quantile-based adaptive clipping")
    target_quantile: float = option(0.5, "adaptive_clip: γ, the fraction of updates meant to be unclipped",
                                    ge=0, le=1)
    clip_learning_rate: float = option(0.2, "adaptive_clip: η_C of the geometric update C ← C·exp(−η_C(b̄ − γ))",
                                       gt=0)
    clipped_count_stddev: float | None = option(None, "adaptive_clip: σ_b, the std of the noise on the count of "
                                                      "unclipped updates (null: sample size / 20, the paper's, "
                                                      "at least noise_multiplier)",
                                                gt=0)
    target_epsilon: float | None = option(None, "stop the run (cleanly, status says why) before a round would "
                                                "take ε past this", gt=0)
    secure_aggregation: bool = option(False, "SecAgg+: the aggregator learns only the sum of the clients' (masked) "
                                             "updates (docs/security.md, \"Secure aggregation\")")
    secagg_threshold: float = option(0.6, "fraction of a client's neighbours whose shares rebuild its secrets "
                                          "(t = ceil(fraction · degree)); up to degree − t may drop after "
                                          "masking", gt=0.5, le=1)
    secagg_degree: int = option(0, "neighbours per client (SecAgg+'s k-regular graph, rounded up to even); 0 or "
                                   ">= clients − 1: all pairs (Bonawitz et al.)", ge=0)
    secagg_frac_bits: int = option(24, "fixed point: values are rounded to multiples of 2^-frac_bits", ge=1, le=52)
    secagg_ring_bits: int = option(64, "masks and sums live in the ring Z_2^ring_bits", ge=16, le=64)
    secagg_rounding: SecAggRounding = option("nearest", "fixed-point rounding: nearest, or stochastic (unbiased, "
                                                        "seeded by (seed, round, client))")
    secagg_threat: SecAggThreat = option("malicious", "malicious: clients sign their keys and the survivor set "
                                                      "(Bonawitz et al.'s consistency check, one more round trip), so "
                                                      "a lying aggregator cannot unmask a client; honest-but-curious: "
                                                      "neither (docs/security.md, \"Secure aggregation\")")

    def checks(self) -> Iterable[tuple[str, str]]:
        if self.secagg_frac_bits >= self.secagg_ring_bits - 8:
            yield "secagg_frac_bits", (f"must leave at least 8 integer bits in the ring (< secagg_ring_bits − 8 = "
                                       f"{self.secagg_ring_bits - 8}), got {self.secagg_frac_bits}")
        if self.secure_aggregation and self.dp == "central":
            yield "secure_aggregation", ("central DP clips each update at the aggregator, which secure aggregation "
                                         "hides: use dp: local with secure aggregation, or no secure aggregation")
        if self.adaptive_clip and self.dp != "central":
            yield "adaptive_clip", f"applies to dp: central only, got dp: {self.dp}"
        if (self.adaptive_clip and self.clipped_count_stddev is not None
                and 2 * self.clipped_count_stddev <= self.noise_multiplier):
            yield "clipped_count_stddev", (f"must exceed noise_multiplier / 2 = {self.noise_multiplier / 2:g}: the "
                                           "count's noise alone would spend the whole budget")
        if self.dp != "none" and self.noise_multiplier == 0 and self.target_epsilon is not None:
            yield "target_epsilon", "noise_multiplier 0 gives no guarantee (ε is infinite)"

    @property
    def enabled(self) -> bool:
        return self.dp != "none"


def privacy_problems(privacy: PrivacyConfig, algorithm: AlgorithmConfig, train: TrainConfig,
                     robust: RobustConfig | None = None) -> list[str]:
    """Combinations secure aggregation cannot run: a strategy whose server step needs individual updates, and
    local evaluation of uploaded models (they never reach the aggregator unmasked)."""
    if not privacy.secure_aggregation:
        return []
    out = []
    from fedent.strategies.registry import strategy_class  # local: the strategies import torch

    cls = strategy_class(algorithm.name)
    if cls.secure_weighting is None:
        out.append(f"privacy.secure_aggregation: {algorithm.name} cannot run under secure aggregation: "
                   f"{cls.secure_blocker} (docs/security.md lists the strategies that can)")
    else:
        from fedent.strategies.base import sum_mismatch

        why = sum_mismatch(cls)
        if why is not None:
            out.append(f"privacy.secure_aggregation: {algorithm.name} cannot run under secure aggregation: {why}")
    if train.local_eval > 0:
        out.append("privacy.secure_aggregation: train.local_eval evaluates uploaded local models, which the "
                   "aggregator never sees under secure aggregation; set train.local_eval: 0")
    if train.upload_encoding != "none":
        out.append(f"privacy.secure_aggregation: train.upload_encoding {train.upload_encoding} sends codes the "
                   "aggregator decodes per client, which masking hides; set train.upload_encoding: none")
    if robust is not None and (robust.aggregator != "mean" or robust.clip_norm is not None):
        out.append(f"privacy.secure_aggregation: robust.aggregator {robust.aggregator}"
                   f"{' with robust.clip_norm' if robust.clip_norm is not None else ''} needs each client's update, "
                   "which secure aggregation hides; use robust.aggregator: mean without clip_norm (the weight cap "
                   "does not apply either: clients pre-scale by their own counts)")
    return out


def _bound(v: float) -> str:
    """A range bound as written: whole numbers in full (65535, 4194304), others short (1e-06)."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


def _range_text(m: Mapping[str, Any]) -> str | None:
    lo = ("(", m["gt"]) if m.get("gt") is not None else ("[", m["ge"]) if m.get("ge") is not None else None
    hi = (")", m["lt"]) if m.get("lt") is not None else ("]", m["le"]) if m.get("le") is not None else None
    if lo and hi:
        return f"must be in {lo[0]}{_bound(lo[1])}, {_bound(hi[1])}{hi[0]}"
    if lo:
        return f"must be {'>' if lo[0] == '(' else '>='} {_bound(lo[1])}"
    if hi:
        return f"must be {'<' if hi[0] == ')' else '<='} {_bound(hi[1])}"
    return None


def _in_range(v: float, m: Mapping[str, Any]) -> bool:
    return not ((m.get("gt") is not None and not v > m["gt"]) or (m.get("ge") is not None and not v >= m["ge"])
                or (m.get("lt") is not None and not v < m["lt"]) or (m.get("le") is not None and not v <= m["le"]))


@dataclass(frozen=True)
class StrategyOptions(Declared):
    """Base of every strategy's options: a ``Declared`` frozen dataclass of ``option(...)`` fields.

    Built, each field's type and range is checked (ints are stored as floats where the field is a float)
    and then ``check()`` runs the cross-field rules. Errors are ``OptionError``s keyed ``algorithm.<field>``
    (every bad field at once). ``from_mapping`` parses the flat YAML layout; ``to_dict`` writes it back.
    """

    algorithm: ClassVar[str] = ""  # the strategy name, set by each subclass (for error messages)
    key_prefix: ClassVar[str] = "algorithm"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check()

    def _fail(self, problems: list[tuple[str, str]]) -> None:
        raise OptionError(self.key_prefix, *problems[0], more=problems[1:])

    def check(self) -> None:
        """Cross-field rules (raise ``OptionError``); single fields are checked from their declarations."""

    @classmethod
    def from_mapping(cls: type[SO], raw: Mapping[str, Any] | None, prefix: str | None = None) -> SO:
        """Build from the flat YAML layout; unknown keys name the keys that are allowed. ``prefix`` keys the
        errors (default ``algorithm``; the estimator's ``params``)."""
        prefix = prefix or cls.key_prefix
        raw = dict(raw or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            allowed = ", ".join(sorted(names)) or "(none)"
            raise ConfigError(f"{prefix}: unknown key(s) {', '.join(unknown)} for {cls.algorithm or cls.__name__}"
                              f"{did_you_mean(unknown, names)}; allowed: {allowed}")
        try:
            return cls(**raw)
        except OptionError as e:
            if prefix == cls.key_prefix:
                raise
            raise e.keyed(prefix) from None

    # fields added after runs were published: written only when not at this default (a run without them keeps
    # the config, checkpoint fingerprint and reproduce cache key it had before they existed)
    quiet_defaults: ClassVar[Mapping[str, Any]] = {}

    def to_dict(self) -> dict[str, Any]:
        """Every field, in declaration order (the ``algorithm:`` section of config.yaml, besides ``name``)."""
        return _without_defaults({f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                                 self.quiet_defaults)


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
    robust: RobustConfig = field(default_factory=RobustConfig)
    adversary: AdversaryConfig = field(default_factory=AdversaryConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def __post_init__(self) -> None:
        _raise_all(privacy_problems(self.privacy, self.algorithm, self.train, self.robust))

    def validate(self) -> None:
        c = _Collect()
        c.run(self.data.validate)
        c.run(self.model.validate)
        c.run(self.train.validate)
        c.run(self.robust.validate)
        c.run(self.adversary.validate)
        c.run(self.privacy.validate)
        c.run(check_upload_encoding, self.train, self.algorithm.name)
        c.raise_any()

    def to_dict(self) -> dict[str, Any]:
        # The algorithm section keeps its flat YAML layout {name, <options>} (asdict would nest "options").
        return {
            "name": self.name,
            "data": _without_defaults(dataclasses.asdict(self.data), QUIET_DEFAULTS["data"]),
            "model": dataclasses.asdict(self.model),
            "train": _without_defaults(dataclasses.asdict(self.train), QUIET_DEFAULTS["train"]),
            "algorithm": self.algorithm.to_dict(),
            "out_dir": self.out_dir,
            "robust": dataclasses.asdict(self.robust),
            "adversary": dataclasses.asdict(self.adversary),
            # only when set: a run without DP keeps the config (and so the checkpoint fingerprint and the
            # reproduce cache key) it had before the section existed
            **({"privacy": dataclasses.asdict(self.privacy)} if self.privacy != PrivacyConfig() else {}),
        }


# Options added after runs were published: left out of to_dict at their default, so a run without them keeps the
# config (checkpoint fingerprint, reproduce cache key) it had before they existed.
QUIET_DEFAULTS: dict[str, dict[str, Any]] = {"data": {"validation_fraction": 0.0}, "train": {"evaluate_test": True}}


def _without_defaults(d: dict[str, Any], quiet: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if not (k in quiet and v == quiet[k])}


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


def dataclass_from_mapping(cls: Any, raw: Mapping[str, Any] | None, prefix: str,
                           error_type: type[ConfigError] = ConfigError) -> Any:
    """Build a frozen dataclass from a mapping; unknown keys and bad types are ``error_type``s (ConfigError),
    all reported at once; a ``Declared`` class then checks its ranges and cross-field rules when built."""
    if raw is not None and not isinstance(raw, Mapping):
        raise error_type(f"{prefix or cls.__name__}: expected a mapping")
    raw = dict(raw or {})
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    c = _Collect()
    if unknown:
        where = f"{prefix}: unknown key(s)" if prefix else f"unknown {cls.__name__} key(s)"
        c.problems.append(f"{where} {', '.join(unknown)}{did_you_mean(unknown, names)}; "
                          f"allowed: {', '.join(sorted(names))}")
    kwargs = {k: c.run(_coerce, v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in raw.items() if k in names}
    if c.problems:  # every unknown key and bad type at once
        raise error_type(problems=c.problems)
    return cls(**kwargs)


def did_you_mean(unknown: Iterable[str], allowed: Iterable[str]) -> str:
    """`` (did you mean X?)``, or ``(did you mean a -> A, b -> B?)`` for several, naming the close allowed key
    (difflib) of each misspelt one; '' when none is close."""
    choices, keys = sorted(allowed), list(unknown)
    close = {k: m[0] for k in keys if (m := difflib.get_close_matches(str(k), choices, n=1, cutoff=0.75))}
    if not close:
        return ""
    if len(keys) == 1:
        return f" (did you mean {close[keys[0]]}?)"
    return f" (did you mean {', '.join(f'{k} -> {v}' for k, v in close.items())}?)"


# top-k drops most of each update every round: FedDyn's and SCAFFOLD's client state (h_i, c_i) is updated from
# the model the client trained, the server's from the one it received, and under top-k the two drift apart;
# unbiased int8 keeps them equal in expectation and is allowed with every strategy
TOPK_UNSOUND = ("feddyn", "scaffold")


def check_upload_encoding(train: TrainConfig, algorithm: str) -> None:
    """ConfigError for an upload encoding that is not sound with the strategy (``TOPK_UNSOUND``)."""
    if train.upload_encoding == "topk" and algorithm in TOPK_UNSOUND:
        raise ConfigError(f"train.upload_encoding: topk is not sound with {algorithm} (its client state assumes "
                          "the server saw the model the client trained); use int8 or none")


def config_from_dict(raw: Mapping[str, Any]) -> ExperimentConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping")
    allowed = {"name", "data", "model", "train", "algorithm", "out_dir", "robust", "adversary", "privacy"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        listed = ", ".join(sorted(allowed))
        raise ConfigError(f"config: unknown top-level key(s) {', '.join(unknown)}{did_you_mean(unknown, allowed)}; "
                          f"allowed: {listed}")
    c = _Collect()  # every section is checked, and all their problems reported together
    data = c.run(dataclass_from_mapping, DataConfig, raw.get("data"), "data")
    model = c.run(dataclass_from_mapping, ModelConfig, raw.get("model"), "model")
    train = c.run(dataclass_from_mapping, TrainConfig, raw.get("train"), "train")
    algorithm = c.run(AlgorithmConfig.from_mapping, raw.get("algorithm"))
    robust = c.run(dataclass_from_mapping, RobustConfig, raw.get("robust"), "robust")
    adversary = c.run(dataclass_from_mapping, AdversaryConfig, raw.get("adversary"), "adversary")
    privacy = c.run(dataclass_from_mapping, PrivacyConfig, raw.get("privacy"), "privacy")
    if privacy is not None and algorithm is not None and train is not None:
        c.problems.extend(privacy_problems(privacy, algorithm, train, robust))
    if data is not None and model is not None and not c.problems:
        from fedent import plugins  # plug-ins resolve now, before any data loads

        c.run(plugins.check_names, data.name, model.name)
        c.run(plugins.check_placement, data, train)
    if train is not None and algorithm is not None:
        c.run(check_upload_encoding, train, algorithm.name)
    c.raise_any()
    return ExperimentConfig(name=str(raw.get("name", "experiment")), data=data, model=model, train=train,
                            algorithm=algorithm, out_dir=str(raw.get("out_dir", "runs")), robust=robust,
                            adversary=adversary, privacy=privacy)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``key.sub=value`` with the value parsed as YAML (so 0.1, true, null and [1,2] work)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key=value")
    key, _, value = text.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        parsed = yamlio.load(value)
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
    """Load, override and validate (the algorithm's options become its typed Options here, once).

    ``path`` is a file, or the name of a config shipped with the package (``demo``, ``mnist-iid.yaml``: the
    repository's configs/, package data), so an installed fedent without the repository has them too."""
    p = Path(path)
    if not p.is_file():
        p = packaged_config(str(path)) or p
    if not p.is_file():
        known = ", ".join(packaged_config_names()[:8])
        raise ConfigError(f"config file not found: {p} (or name a packaged config: {known}, ...)")
    try:
        raw = yamlio.load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}{yaml_position(e)}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return config_from_dict(apply_overrides(raw, overrides or []))


def packaged_config_names() -> list[str]:
    """The configs shipped inside the package (fedent/configs, the repository's configs/), by name."""
    from importlib import resources

    d = resources.files("fedent").joinpath("configs")
    return sorted(f.name[:-5] for f in d.iterdir() if f.name.endswith(".yaml")) if d.is_dir() else []


def packaged_config(name: str) -> Path | None:
    """The packaged config called ``name`` (with or without .yaml, or configs/NAME.yaml), else None."""
    from importlib import resources

    stem = name[len("configs/"):] if name.startswith("configs/") else name
    stem = stem[:-5] if stem.endswith(".yaml") else stem
    if not stem or "/" in stem or stem not in packaged_config_names():
        return None
    return Path(str(resources.files("fedent").joinpath("configs", stem + ".yaml")))


def yaml_position(e: yaml.YAMLError) -> str:
    """``:line:column`` (1-based) of a YAML error that knows where it happened, else ''."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def with_device(cfg: ExperimentConfig, device: str | None) -> ExperimentConfig:
    """The config with ``train.device`` replaced by an explicit --device, so config.yaml says what ran."""
    if device is None:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=device))
