"""The paper's experiment protocol (Section VI) as data: profiles, settings, sections, rows and the runs they need.

A *setting* is one federated problem (dataset, partition, clients, participation, Table IV training row); a
*row* is one algorithm with fixed options; a *section* is one of the paper's analyses (Table III, participation,
distance metric, deviation, β and γ sweeps) over some settings and rows. For one seed every row of a setting
trains on the identical data, partition, initial model and client sampling (all derived from the seed), so
differences come from the algorithms alone. Runs shared between sections (e.g. FedEnt β = 0.99 in the sweep is
the Table III FedEnt run) are run once.

Hyperparameters are the paper's for every algorithm (Sec. VI-A: β = γ = 0.99, μ = 0.01, α = 0.001, FedAdam
β1 0.9, β2 0.99, τ 1e-3), i.e. the strategies' defaults; nothing is tuned per algorithm.

Why ~440 lines: the plan is data (profiles, settings, sections) and reads best in one place; the report
that renders it lives in ``reproduce_report``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Protocol

import yaml

from fedent import runlog
from fedent.config import (
    AlgorithmConfig,
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    config_from_dict,
    load_config,
)
from fedent.inputs import RunInputs, load_inputs
from fedent.strategies.base import StrategyError

PROFILES = ("cpu", "medium", "full", "paper")


@dataclass(frozen=True)
class Row:
    """One table row: an algorithm with explicit options (empty = the strategy's paper defaults).

    Controls (issue 17): ``lr_scale`` multiplies the setting's base rate (FedAvg's learning-rate sweep);
    ``replay_of`` names the row whose run (same setting and seed) this FedAvg replays the logged rates of.
    """

    label: str
    algorithm: str
    options: tuple[tuple[str, Any], ...] = ()
    lr_scale: float = 1.0
    replay_of: str | None = None

    def options_dict(self) -> dict[str, Any]:
        return dict(self.options)


@dataclass(frozen=True)
class Setting:
    """A federated problem: a base config (file under configs/ or a raw mapping) plus --set style overrides."""

    key: str
    title: str
    base: str | Mapping[str, Any]
    overrides: tuple[str, ...] = ()
    paper_ref: str = ""  # which Table III column block this setting stands beside


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    settings: tuple[str, ...]
    rows: tuple[str, ...]  # row labels
    only_in: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (row, settings): a row run only there (cost)
    priority: int = 1  # 0: every seed before the other sections' later seeds; 2: after all first seeds

    def rows_for(self, setting: str) -> tuple[str, ...]:
        limits = dict(self.only_in)
        return tuple(r for r in self.rows if r not in limits or setting in limits[r])


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    settings: tuple[Setting, ...]
    rows: tuple[Row, ...]
    sections: tuple[Section, ...]
    reductions: tuple[str, ...] = ()  # human-readable: what differs from the paper's Table IV

    def setting(self, key: str) -> Setting:
        for s in self.settings:
            if s.key == key:
                return s
        raise ConfigError(f"profile {self.name}: unknown setting {key!r}")

    def row(self, label: str) -> Row:
        for r in self.rows:
            if r.label == label:
                return r
        raise ConfigError(f"profile {self.name}: unknown row {label!r}")

    def section(self, key: str) -> Section:
        for s in self.sections:
            if s.key == key:
                return s
        raise ConfigError(f"--only: unknown section {key!r}; choose from {', '.join(self.section_keys())}")

    def section_keys(self) -> list[str]:
        return [s.key for s in self.sections]


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a row on a setting for a seed, with its fully resolved config (a plain dict, picklable)."""

    setting: str
    row: str
    seed: int
    config: Mapping[str, Any] = field(repr=False)
    run_dir: Path
    after: tuple[str, ...] = ()  # keys of runs that must be complete first (a replay reads their log)

    @property
    def key(self) -> str:
        return f"{self.setting}/{self.row}-s{self.seed}"

    @property
    def rounds(self) -> int:
        return int(self.config["train"]["rounds"])


@dataclass(frozen=True)
class Plan:
    profile: Profile
    seeds: tuple[int, ...]
    sections: tuple[Section, ...]
    runs: tuple[RunSpec, ...]  # in execution order: seed-major, then section order; no duplicates


@dataclass(frozen=True)
class RunOutcome:
    key: str
    status: str  # done | skipped (already complete) | diverged (a model went non-finite) | failed | not run | cut short
    wall_s: float
    final_acc: float | None = None
    error: str | None = None


# ---- the paper's rows and analyses ---------------------------------------------------------------------

BASELINES = ("fedavg", "fedadam", "fedprox", "feddyn", "fedcos", "fednorm")
FEDENT_ROWS = ("fedent", "fedent-paper", "fedent-offline", "fedent-offline-paper")
LR_SCALES = (2, 5, 10)  # FedAvg's learning-rate sweep: base rate × 1 (the fedavg row), 2, 5, 10
# the controls (issue 17): a tuned FedAvg, FedAvg on FedEnt's own schedule, FedEnt under the first readings
CONTROL_ROWS = (*(f"fedavg-lr{k}" for k in LR_SCALES), "fedavg-replay", "fedavg-replay-mean", "fedent-first",
                "fedent-offline-first")
# spec §5's first readings: η* uncapped, the mean field at η*, Algorithm 1 over the population
FIRST_READING: tuple[tuple[str, Any], ...] = (("eta_max", None), ("phi2_rate", "star"))
BETAS = (0.5, 0.9, 0.95)  # plus 0.99 = the default FedEnt row (paper Fig. beta)
GAMMAS = (0.5, 0.9, 0.95)  # plus 0.99 (paper Fig. ex_gamma)


def paper_rows(offline_sweeps: int | None) -> tuple[Row, ...]:
    """The seven algorithms with the paper's options, FedEnt in its four modes, and the β/γ sweep rows.

    ``offline_sweeps`` caps Algorithm 1's sweeps (each costs T gradient evaluations per client); None keeps
    the strategy default.
    """
    off: tuple[tuple[str, Any], ...] = (("estimator", "offline"),)
    if offline_sweeps is not None:
        off += (("max_sweeps", offline_sweeps),)
    rows = [Row(a, a) for a in BASELINES]
    rows += [
        Row("fedent", "fedent"),  # online estimator, exact Proposition 1 root (the project default)
        Row("fedent-paper", "fedent", (("variant", "paper"),)),
        Row("fedent-offline", "fedent", off),
        Row("fedent-offline-paper", "fedent", off + (("variant", "paper"),)),
    ]
    rows += [Row(f"fedent-beta{b:g}", "fedent", (("beta", b),)) for b in BETAS]
    rows += [Row(f"fedent-gamma{g:g}", "fedent", (("gamma", g),)) for g in GAMMAS]
    rows += [Row(f"fedavg-lr{k}", "fedavg", lr_scale=float(k)) for k in LR_SCALES]
    rows += [
        Row("fedavg-replay", "fedavg", (("replay", "per_client"),), replay_of="fedent"),
        Row("fedavg-replay-mean", "fedavg", (("replay", "round_mean"),), replay_of="fedent"),
        Row("fedent-first", "fedent", FIRST_READING),
        Row("fedent-offline-first", "fedent", off + FIRST_READING + (("offline_clients", "population"),)),
    ]
    return tuple(rows)


CONTROLS_TITLE = "Controls: a tuned FedAvg, FedAvg on FedEnt's rates, FedEnt's first readings (issue 17)"


def controls_section(settings: tuple[str, ...], priority: int = 0) -> Section:
    return Section("controls", CONTROLS_TITLE, settings,
                   # FedEnt and its replays early, so that a cut-short run still has the central comparison
                   ("fedent", "fedavg", "fedent-first", "fedavg-replay-mean", "fedavg-lr5", "fedavg-lr10", "fedavg-lr2",
                    "fedavg-replay", "fedadam", "feddyn", "fedent-offline", "fedent-offline-first"),
                   priority=priority)


def paper_sections(main_settings: tuple[str, ...], offline_in: tuple[str, ...] | None = None,
                   extra: tuple[Section, ...] = ()) -> tuple[Section, ...]:
    """The paper's analyses; ``offline_in`` limits the Algorithm 1 rows to those settings (None: all)."""
    seven = (*BASELINES, "fedent")
    five = ("fedavg", "fedadam", "fedprox", "feddyn", "fedent")
    limit = () if offline_in is None else tuple((r, offline_in) for r in FEDENT_ROWS if "offline" in r)
    return (
        Section("main", "Accuracy on non-IID data (paper Table III)", main_settings, (*BASELINES, *FEDENT_ROWS),
                limit, priority=0),
        Section("deviation", "Local-model deviation (paper Fig. client_dev)", ("pathological",), seven),
        Section("distance", "Distance metric: cosine, norm, entropy (paper Figs. ex_mnist_similarity)",
                ("iid", "pathological"), ("fedavg", "fedcos", "fednorm", "fedent")),
        Section("beta", "FedEnt aggregation weight β (paper Fig. beta)", ("pathological",),
                (*(f"fedent-beta{b:g}" for b in BETAS), "fedent")),
        Section("gamma", "FedEnt decay weight γ (paper Fig. ex_gamma)", ("pathological",),
                (*(f"fedent-gamma{g:g}" for g in GAMMAS), "fedent")),
        Section("participation", "Participation ratio (paper Figs. cifar10_100*100, cifar10_20*200)",
                ("full100", "p20of200"), five, priority=2),
        *extra,
    )


# The cpu profile: Fashion-MNIST + MNIST-CNN, Table IV's MNIST row (lr 0.01, batch 32, 3 local epochs) for
# every setting, on a seeded 10% subsample of the training set and fewer rounds.
CPU_BASE = "fmnist-mnist-pathological.yaml"
CPU_COMMON = ("train.rounds=12", "train.eval_every=2", "data.max_train_samples=3000",
              "data.max_test_samples=1000", "train.device=cpu")
DIR = ("data.partition=dirichlet", "data.dirichlet_flavour=client")


def cpu_profile() -> Profile:
    settings = (
        Setting("pathological", "Fashion-MNIST, pathological (2 shards/client), 20% of 100", CPU_BASE,
                (*CPU_COMMON, "train.local_eval=2"), "mnist"),
        Setting("dir1.0", "Fashion-MNIST, Dirichlet α_d = 1.0, 20% of 100", CPU_BASE,
                (*CPU_COMMON, *DIR, "data.alpha=1.0"), "alpha1.0"),
        Setting("dir0.5", "Fashion-MNIST, Dirichlet α_d = 0.5, 20% of 100", CPU_BASE,
                (*CPU_COMMON, *DIR, "data.alpha=0.5"), "alpha0.5"),
        Setting("iid", "Fashion-MNIST, IID, 20% of 100", CPU_BASE, (*CPU_COMMON, "data.partition=iid")),
        Setting("full100", "Fashion-MNIST, Dirichlet α_d = 0.5, 100% of 100 (5 rounds)", CPU_BASE,
                (*CPU_COMMON, *DIR, "data.alpha=0.5", "train.fraction=1.0", "train.rounds=5")),
        Setting("p20of200", "Fashion-MNIST, Dirichlet α_d = 0.5, 20% of 200", CPU_BASE,
                (*CPU_COMMON, *DIR, "data.alpha=0.5", "data.num_clients=200")),
        Setting("pathological-x4", "Fashion-MNIST, pathological, 20% of 100, 4x the images, 20 rounds", CPU_BASE,
                (*CPU_COMMON, "data.max_train_samples=12000", "train.rounds=20"), "mnist"),
    )
    scale = Section("scale", "Check: more local data (120 images per client: 12 local steps per round) and 20 "
                    "rounds", ("pathological-x4",), (*BASELINES, "fedent", "fedent-paper"), priority=3)
    return Profile(
        "cpu", "Fashion-MNIST + MNIST-CNN sized for about an hour on 2 CPU cores",
        settings, paper_rows(offline_sweeps=2),
        paper_sections(("pathological", "dir1.0", "dir0.5"), ("pathological",),
                       (scale, controls_section(("pathological",), priority=3))),
        reductions=(
            "dataset: Fashion-MNIST (the Debian copy) instead of MNIST/CIFAR10/EMNIST-L/CIFAR100, model MNIST-CNN",
            "training set: a seeded subsample of 3,000 of 60,000 images (30 per client on average, so one "
            "batch of 32 per local epoch: 3 local SGD steps per round; the paper has 600 per client); test set: "
            "a seeded 1,000 of 10,000 (binomial standard error about 1.3 points at 80%)",
            "rounds: 12 instead of 50 (100% of 100 clients: 5 rounds); test accuracy every 2 rounds and after "
            "the last",
            "Dirichlet settings use Table IV's MNIST row (lr 0.01, batch 32, 3 local epochs) because the model "
            "is MNIST-CNN; the paper used the CIFAR10/EMNIST/CIFAR100 rows with their own models",
            "participation analysis on Dirichlet α_d = 0.5 Fashion-MNIST (the paper used CIFAR10)",
            "FedEnt offline (Algorithm 1): at most 2 fixed-point sweeps (the default is 20; each sweep costs "
            "T gradient evaluations for each of the N clients), and only in the pathological setting",
            "deviation analysis: 2 of the round's uploaded local models per evaluated round are tested",
            "an extra check the paper does not have: the pathological table again with 4x the images (120 per "
            "client) and 20 rounds, to see whether the ranking survives more local work",
        ),
    )


def paper_profile(paper_datasets: bool = False) -> Profile:
    """Table IV unchanged; Fashion-MNIST twins of each config unless ``paper_datasets`` (needs the data)."""
    pre = "" if paper_datasets else "fmnist-"
    settings = (
        Setting("pathological", "MNIST-CNN, pathological, 20% of 100", f"{pre}mnist-pathological.yaml",
                ("train.local_eval=5",), "mnist"),
        Setting("dir1.0", "CIFAR10-CNN setting, Dirichlet α_d = 1.0", f"{pre}cifar10-dir1.0.yaml", (), "alpha1.0"),
        Setting("dir0.5", "CIFAR10-CNN setting, Dirichlet α_d = 0.5", f"{pre}cifar10-dir0.5.yaml", (), "alpha0.5"),
        Setting("emnist-dir1.0", "EMNIST-L setting, α_d = 1.0", f"{pre}emnist-dir1.0.yaml", (), "alpha1.0"),
        Setting("emnist-dir0.5", "EMNIST-L setting, α_d = 0.5", f"{pre}emnist-dir0.5.yaml", (), "alpha0.5"),
        Setting("cifar100-dir1.0", "CIFAR100 setting, α_d = 1.0", f"{pre}cifar100-dir1.0.yaml", (), "alpha1.0"),
        Setting("cifar100-dir0.5", "CIFAR100 setting, α_d = 0.5", f"{pre}cifar100-dir0.5.yaml", (), "alpha0.5"),
        Setting("iid", "MNIST-CNN, IID, 20% of 100", f"{pre}mnist-iid.yaml"),
        Setting("full100", "CIFAR10 setting, 100% of 100", f"{pre}cifar10-100of100.yaml"),
        Setting("p20of200", "CIFAR10 setting, 20% of 200", f"{pre}cifar10-20of200.yaml"),
    )
    main = ("pathological", "dir1.0", "dir0.5", "emnist-dir1.0", "emnist-dir0.5", "cifar100-dir1.0",
            "cifar100-dir0.5")
    data = "the paper's datasets" if paper_datasets else "Fashion-MNIST twins of the paper's configs"
    return Profile("paper", f"Table IV settings unchanged ({data}); for a GPU machine", settings,
                   paper_rows(offline_sweeps=None), paper_sections(main),
                   reductions=() if paper_datasets else ("dataset: Fashion-MNIST twins (configs/fmnist-*.yaml)",))


# The medium profile: the cpu profile's pathological setting with every client's full data (600 images, 57 local
# steps per round), one seed, the central controls; the rounds are what fits ~90 minutes on 2 shared cores at the
# rate measured on this box: 9.6 client SGD steps/s per worker (first round of its run of 2026-11-26, 2 workers,
# with other jobs on the box; an earlier smoke test under heavier load gave 2.4). The whole profile then took
# 80 min beside a full test suite and a transfer benchmark (docs/results.md "Profiles").
MEDIUM_ROUNDS = 10
MEDIUM_ROWS = ("fedent", "fedavg", "fedent-first", "fedavg-replay-mean", "fedavg-lr5", "fedavg-lr10")


def medium_profile() -> Profile:
    setting = Setting("pathological", f"Fashion-MNIST, pathological, 20% of 100, full data, {MEDIUM_ROUNDS} rounds",
                      CPU_BASE, (f"train.rounds={MEDIUM_ROUNDS}", "train.eval_every=2", "data.max_test_samples=2000",
                                 "train.device=cpu"), "mnist")
    return Profile(
        "medium", "Fashion-MNIST + MNIST-CNN, Table IV's MNIST row on every client's full data, one seed, ~90 min "
                  "on 2 CPU cores", (setting,), paper_rows(offline_sweeps=2),
        (Section("controls", CONTROLS_TITLE, ("pathological",), MEDIUM_ROWS, priority=0),),
        reductions=(
            "dataset: Fashion-MNIST (the Debian copy), model MNIST-CNN; the pathological split only",
            f"rounds: {MEDIUM_ROUNDS} instead of 50 (what fits ~90 minutes on 2 shared cores with these rows); test "
            "accuracy every 2 rounds on a seeded 2,000 of the 10,000 test images",
            "rows: FedEnt (revised and first readings), FedAvg at the base rate x 1, 5, 10 and on FedEnt's round-mean "
            "rate (no offline FedEnt: Algorithm 1 adds sweeps of gradients per round)",
        ),
    )


# The full profile: Table IV unchanged on the Fashion-MNIST twins of the Table III settings, every algorithm and
# control, 3 seeds, for one GPU call. What is dropped first when it does not fit: ``drop_order``.
FULL_MAIN = ("pathological", "dir1.0", "dir0.5", "emnist-dir1.0", "emnist-dir0.5", "cifar100-dir1.0",
             "cifar100-dir0.5")
# On a GPU, executor auto is the vectorised one (a round's clients in one vmapped step, chunks sized from free GPU
# memory); on a CPU it stays the sequential one. TF32 convolutions and matmuls on the GPU (PyTorch's own default for
# cuDNN convolutions, ~1e-3 relative per step, far below the seed-to-seed spread): several times the throughput.
FULL_TRAIN: tuple[str, ...] = ("train.device=auto", "train.executor=auto", "train.precision=tf32")


def full_profile() -> Profile:
    base = paper_profile(False)
    settings = tuple(Setting(s.key, s.title, s.base, (*s.overrides, *FULL_TRAIN), s.paper_ref)
                     for s in base.settings if s.key in FULL_MAIN)
    rows = (*BASELINES, *FEDENT_ROWS, *CONTROL_ROWS)
    return Profile(
        "full", "Table IV settings unchanged on the Fashion-MNIST twins, every algorithm and control, 3 seeds; one "
                "GPU call", settings, paper_rows(offline_sweeps=None),
        (Section("main", "Accuracy on non-IID data (paper Table III) with the controls", FULL_MAIN, rows,
                 priority=0),),
        reductions=("dataset: Fashion-MNIST twins (configs/fmnist-*.yaml), model MNIST-CNN for every setting",),
    )


def get_profile(name: str, paper_datasets: bool = False) -> Profile:
    if paper_datasets and name != "paper":
        raise ConfigError("--paper-datasets: only with --profile paper")
    if name == "cpu":
        return cpu_profile()
    if name == "medium":
        return medium_profile()
    if name == "full":
        return full_profile()
    if name == "paper":
        return paper_profile(paper_datasets)
    raise ConfigError(f"--profile: must be one of {', '.join(PROFILES)}")


# ---- building the plan -----------------------------------------------------------------------------------

def setting_config(setting: Setting, config_dir: Path, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The setting's resolved, validated config as a plain dict (algorithm section removed: rows set it);
    ``extra`` are --set overrides applied after the profile's own."""
    if isinstance(setting.base, str):
        cfg = load_config(config_dir / setting.base, [*setting.overrides, *extra])
    else:
        cfg = config_from_dict(apply_overrides(dict(setting.base), [*setting.overrides, *extra]))
    raw = cfg.to_dict()
    raw.pop("algorithm", None)
    return raw


def run_config(base: Mapping[str, Any], setting: str, row: Row, seed: int,
               replay_log: Path | None = None) -> dict[str, Any]:
    raw = json.loads(json.dumps(base))  # deep copy of plain data
    raw["name"] = f"reproduce-{setting}-{row.label}"
    raw["train"]["seed"] = int(seed)
    if row.lr_scale != 1.0:
        raw["train"]["lr"] = float(raw["train"]["lr"]) * row.lr_scale
    raw["algorithm"] = {"name": row.algorithm, **row.options_dict()}
    if row.replay_of is not None:
        if replay_log is None:
            raise ConfigError(f"row {row.label} replays {row.replay_of}: needs that run's metrics.jsonl")
        raw["algorithm"]["replay_rates"] = str(replay_log)
    return raw


def build_plan(profile: Profile, seeds: Sequence[int], out_dir: str | Path, config_dir: str | Path,
               only: Sequence[str] | None = None, rows: Sequence[str] | None = None,
               rounds: int | None = None, overrides: Sequence[str] = ()) -> Plan:
    """Every run the chosen sections need, deduplicated, seed-major so an early stop leaves whole seeds.
    ``overrides`` (``--set key=value``) apply to every setting, e.g. the device's precision or conv path."""
    if not seeds:
        raise ConfigError("--seeds: at least one seed")
    sections = tuple(profile.section(k) for k in only) if only else profile.sections
    if rows:  # only these rows (a replay still brings the run it replays)
        for label in rows:
            profile.row(label)
        sections = tuple(Section(s.key, s.title, s.settings, tuple(r for r in s.rows if r in rows), s.only_in,
                                 s.priority) for s in sections)
        sections = tuple(s for s in sections if s.rows)
        if not sections:
            raise ConfigError("--rows: none of these rows is in the chosen sections")
    out, cdir = Path(out_dir), Path(config_dir)
    bases: dict[str, dict[str, Any]] = {}
    if rounds is not None and rounds < 1:
        raise ConfigError("--rounds: must be >= 1")
    for key in overrides:
        if key.split("=", 1)[0].strip() in ("algorithm", "train.seed") or key.startswith("algorithm."):
            raise ConfigError(f"--set {key}: rows set the algorithm and seeds the seed; --set is for the settings")
    for sec in sections:
        for key in sec.settings:
            if key not in bases:
                bases[key] = setting_config(profile.setting(key), cdir, overrides)
                if rounds is not None:  # a smoke test of the profile
                    bases[key]["train"]["rounds"] = int(rounds)
        for label in sec.rows:
            row = profile.row(label)
            AlgorithmConfig.from_mapping({"name": row.algorithm, **row.options_dict()})  # fail before any run
    order = sorted(((run_tier(sec.priority, i), i, j) for i in range(len(seeds)) for j, sec in enumerate(sections)))
    runs: dict[str, RunSpec] = {}

    def add(key: str, label: str, seed: int) -> str:
        row = profile.row(label)
        run_dir = out / "runs" / key / f"{label}-s{seed}"
        after: tuple[str, ...] = ()
        log = None
        if row.replay_of is not None:  # the replayed run comes first (added here if no section has it)
            dep = add(key, row.replay_of, seed)
            after, log = (dep,), runlog.RunPaths(runs[dep].run_dir).metrics
        spec = RunSpec(key, label, seed, run_config(bases[key], key, row, seed, log), run_dir, after)
        runs.setdefault(spec.key, spec)
        return spec.key

    for _, i, j in order:
        seed, sec = int(seeds[i]), sections[j]
        for key in sec.settings:
            for label in sec.rows_for(key):
                add(key, label, seed)
    return Plan(profile, tuple(int(s) for s in seeds), sections, tuple(runs.values()))


def run_tier(priority: int, seed_index: int) -> int:
    """Execution order, so that an early stop leaves the most useful whole tables: the first seed of every
    analysis except the costly ones (priority 2); the main table's second seed; the costly analyses' first
    seed; the main table's further seeds; the first seed of the extra checks (priority 3); then the other
    analyses' further seeds."""
    if seed_index == 0:
        return {0: 0, 1: 0, 2: 2}.get(priority, 4)
    if priority == 0:
        return 1 if seed_index == 1 else 3
    return {1: 5, 2: 6}.get(priority, 7)


# ---- size: client SGD steps, and what is dropped first when a budget does not hold them ----------------------

TRAIN_IMAGES = {"fashion-mnist": 60_000, "mnist": 60_000, "cifar10": 50_000, "cifar100": 50_000, "emnist-l": 124_800}


def client_steps(config: Mapping[str, Any]) -> int:
    """SGD steps a run trains (summed over clients): rounds × clients per round × E × ⌈D_i/B⌉ with D_i the mean
    client size, plus Algorithm 1's gradient evaluations (max_sweeps × T × clients per round) for offline FedEnt."""
    data, train, algo = config["data"], config["train"], config.get("algorithm") or {}
    n = int(data["num_clients"])
    images = data.get("max_train_samples") or TRAIN_IMAGES.get(str(data["name"]), data.get("synthetic_train") or 0)
    per_round = max(1, int(round(float(train["fraction"]) * n)))
    batches = max(1, -(-int(images) // n // int(train["batch_size"])))
    steps = int(train["rounds"]) * per_round * int(train["local_epochs"]) * batches
    if algo.get("name") == "fedent":
        steps += int(train["rounds"]) * per_round  # the probe gradient each round
        if algo.get("estimator") == "offline":
            steps += int(algo.get("max_sweeps") or 20) * int(train["rounds"]) * per_round
    return steps


def drop_order(plan: Plan) -> list[tuple[str, int]]:
    """(setting, seed) units in the order they are dropped to fit a budget, never silently: the last seed of
    every setting first (costliest setting first), then the next-to-last seed, ...; then the first seed of the
    settings, costliest first; the first setting of the profile (the paper's MNIST pathological row) stays."""
    cost: dict[str, int] = {}
    for spec in plan.runs:
        cost[spec.setting] = cost.get(spec.setting, 0) + client_steps(spec.config)
    settings = sorted(cost, key=lambda k: -cost[k])
    keep = plan.profile.settings[0].key
    units = [(st, sd) for sd in reversed(plan.seeds[1:]) for st in settings]
    units += [(st, plan.seeds[0]) for st in settings if st != keep]
    return units


def trim_plan(plan: Plan, budget_steps: int, cost: Callable[[RunSpec], int] | None = None,
              keep: Collection[tuple[str, int]] = ()) -> tuple[Plan, list[tuple[str, int]]]:
    """The plan without the first units of ``drop_order`` that must go for its client steps to fit the budget
    (``cost``: a run's steps, default ``client_steps`` of its config; a time budget counts done runs as 0;
    ``keep``: units never dropped, e.g. those a time budget has started)."""
    size = cost or (lambda r: client_steps(r.config))
    runs = list(plan.runs)
    dropped: list[tuple[str, int]] = []
    for unit in drop_order(plan):
        if unit in keep:
            continue
        if sum(size(r) for r in runs) <= budget_steps:
            break
        runs = [r for r in runs if (r.setting, r.seed) != unit]
        dropped.append(unit)
    return Plan(plan.profile, plan.seeds, plan.sections, tuple(runs)), dropped


def validate_plan_configs(plan: Plan) -> None:
    """Fail before any training if a run's config does not validate (strategy options included)."""
    for spec in plan.runs:
        config_from_dict(spec.config)


# ---- running ---------------------------------------------------------------------------------------------

def is_complete(run_dir: Path, rounds: int) -> bool:
    """A run counts as done when its metrics.jsonl holds every round 0..rounds-1 (resume skips it)."""
    recs = runlog.read_metrics(runlog.RunPaths(run_dir).metrics)
    return sorted(int(r.get("round", -1)) for r in recs) == list(range(rounds))


def diverged(run_dir: Path) -> str | None:
    """The engine's error when the run stopped because a model went non-finite, else None. Such a run has
    settled: training is deterministic per seed, so running it again diverges again (resume skips it)."""
    status = runlog.read_json(runlog.RunPaths(run_dir).status, default=None)
    if not isinstance(status, dict) or status.get("phase") != "failed":
        return None
    error = str((status.get("state") or {}).get("error") or status.get("error") or "")
    return error if "not finite" in error else None


def settled(spec: RunSpec) -> bool:
    """Complete, or diverged, with this spec's config: nothing left to run."""
    return ((is_complete(spec.run_dir, spec.rounds) or diverged(spec.run_dir) is not None)
            and same_config(spec.run_dir, spec.config))


def same_config(run_dir: Path, config: Mapping[str, Any]) -> bool:
    """True when the run dir's config.yaml is this spec's config (a changed profile must not be skipped)."""
    path = runlog.RunPaths(run_dir).config
    try:
        written = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    want = json.loads(json.dumps(runlog.jsonable(config_from_dict(config).to_dict())))
    return bool(written == want)


@lru_cache(maxsize=2)
def _cached_inputs(key: str) -> RunInputs:
    """Data + partition + model factory per (data, model, seed), reused by a worker's consecutive runs."""
    return load_inputs(config_from_dict(json.loads(key)))


def _inputs_key(cfg: Mapping[str, Any]) -> str:
    return json.dumps({"data": cfg["data"], "model": cfg["model"], "train": {"seed": cfg["train"]["seed"]}},
                      sort_keys=True)


InputsFor = Callable[[ExperimentConfig], RunInputs]


def execute(spec: RunSpec, inputs_for: InputsFor | None = None, progress: bool = True) -> RunOutcome:
    """Run one spec into its run dir (a partial dir from an interrupted run is cleared first).

    ``progress``: one line per round on stdout when it is not a terminal (on a terminal, the per-run lines
    of ``fedent reproduce`` are enough)."""
    from fedent.sim.simulator import SimulationError, run_simulation

    t0 = time.perf_counter()
    if is_complete(spec.run_dir, spec.rounds) and same_config(spec.run_dir, spec.config):
        recs = runlog.read_metrics(runlog.RunPaths(spec.run_dir).metrics)
        return RunOutcome(spec.key, "skipped", 0.0, runlog.final_accuracy(recs))
    if (blew := diverged(spec.run_dir)) is not None and same_config(spec.run_dir, spec.config):
        return RunOutcome(spec.key, "diverged", 0.0, None, f"(before) {blew}")
    if spec.run_dir.exists():
        shutil.rmtree(spec.run_dir)
    cfg = config_from_dict(spec.config)
    inputs = inputs_for(cfg) if inputs_for is not None else _cached_inputs(_inputs_key(spec.config))
    try:
        # no bar (parallel runs would draw over each other); a line per round where there is no terminal
        res = run_simulation(cfg, spec.run_dir, progress=progress, bar=False, inputs=inputs, plots=False,
                             label=spec.key)
    except (SimulationError, StrategyError, ValueError, RuntimeError) as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        status = "diverged" if diverged(spec.run_dir) is not None else "failed"  # an outcome, not an error
        return RunOutcome(spec.key, status, time.perf_counter() - t0, None, f"{type(e).__name__}: {msg}")
    return RunOutcome(spec.key, "done", time.perf_counter() - t0, res.final_acc)


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    _die_with_parent()


def _die_with_parent() -> None:
    """On Linux, ask the kernel to end this pool worker when the process that started it dies: a
    ``fedent reproduce`` killed by a timeout or by hand otherwise leaves its workers training on, into run
    directories a restarted reproduce is writing again (seen: a killed medium profile's workers interleaved
    their rounds into the new runs' logs). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request was in place
        os._exit(1)


def _execute_safely(spec: RunSpec) -> RunOutcome:
    """Pool entry point: an unexpected crash of one run becomes a failed outcome, not a dead pool."""
    try:
        return execute(spec)
    except Exception as e:  # noqa: BLE001 - reported per run, the others go on
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return RunOutcome(spec.key, "failed", 0.0, None, last)


def _cut_short(pool: ProcessPoolExecutor, futures: dict[Future[RunOutcome], RunSpec],
               status: dict[str, str]) -> Iterator[RunOutcome]:
    """End the runs still going when a time budget is spent: their processes are killed (a run's directory keeps
    the rounds it logged; a later call with more time redoes it), and each is reported as cut short."""
    for proc in list(getattr(pool, "_processes", {}).values()):  # no public API stops a running task
        proc.kill()
    for fut, spec in list(futures.items()):
        futures.pop(fut)
        status[spec.key] = "cut short"
        rounds = len(runlog.read_metrics(runlog.RunPaths(spec.run_dir).metrics))
        yield RunOutcome(spec.key, "cut short", 0.0, None, f"the time budget ended it after {rounds} of "
                         f"{spec.rounds} rounds")
    pool.shutdown(wait=False, cancel_futures=True)


def _unmet(spec: RunSpec) -> str:
    return f"needs {', '.join(spec.after)}, which failed or did not run"


class Admission(Protocol):
    """What ``run_plan`` asks before starting a run (``budget.TimeBudget``): None to start it, else why not."""

    def admit(self, spec: RunSpec, running: Sequence[RunSpec] = ()) -> str | None: ...

    def finished(self, spec: RunSpec, status: str) -> None: ...

    def time_left(self) -> float: ...


def run_plan(plan: Plan, workers: int = 2, threads: int = 1, inputs_for: InputsFor | None = None,
             budget: Admission | None = None) -> Iterator[RunOutcome]:
    """Execute the plan's runs in order, yielding outcomes as runs finish.

    ``workers`` > 1 uses a process pool (spawned, each with ``threads`` torch threads): on a small CPU box
    independent runs in separate processes beat one process with more threads (see docs/results.md).
    ``budget``: a run starts only when it admits it; a run it never admits ends as ``not run`` with the reason
    (with a pool, a refused run waits and is asked again as slots free up, so a faster measured rate can
    still admit it).
    """
    if workers < 1 or threads < 1:
        raise ConfigError("--workers/--threads: must be >= 1")
    if workers == 1:
        _init_worker(threads)
        failed: set[str] = set()
        for spec in plan.runs:  # plan order puts a replayed run before its replay
            why = budget.admit(spec) if budget is not None else None
            if why is not None:
                o = RunOutcome(spec.key, "not run", 0.0, None, why)
            elif failed & set(spec.after):
                o = RunOutcome(spec.key, "failed", 0.0, None, _unmet(spec))
            else:
                o = execute(spec, inputs_for)
                if budget is not None:
                    budget.finished(spec, o.status)
            if o.status in ("failed", "not run", "diverged"):
                failed.add(o.key)
            yield o
        return
    if inputs_for is not None:
        raise ConfigError("injected inputs need workers=1 (they are not sent to worker processes)")
    ctx = get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(threads,)) as pool:
        # a run waits for the runs it replays (``after``); the others are submitted in plan order, and with a
        # budget only as workers free up (so that it decides with the latest rate)
        waiting = list(plan.runs)
        status: dict[str, str] = {}
        refused: dict[str, str] = {}
        futures: dict[Future[RunOutcome], RunSpec] = {}

        def release() -> Iterator[RunOutcome]:
            for spec in list(waiting):
                if budget is not None and len(futures) >= workers:
                    return
                deps = [status.get(k) for k in spec.after]
                if any(d in ("failed", "not run", "cut short", "diverged") for d in deps):
                    waiting.remove(spec)
                    status[spec.key] = "failed"
                    yield RunOutcome(spec.key, "failed", 0.0, None, _unmet(spec))
                elif all(d is not None for d in deps):
                    why = budget.admit(spec, list(futures.values())) if budget is not None else None
                    if why is not None:
                        refused[spec.key] = why
                        continue
                    waiting.remove(spec)
                    futures[pool.submit(_execute_safely, spec)] = spec
        try:
            yield from release()
            while futures:
                left = budget.time_left() if budget is not None else None
                finished, _ = wait(list(futures), timeout=None if left is None else max(left, 0.0),
                                   return_when=FIRST_COMPLETED)
                if not finished:  # the budget is spent: stop the runs still going, report them cut short
                    yield from _cut_short(pool, futures, status)
                    refused.update({s.key: "the time budget ended before it started" for s in waiting})
                    break
                for done in finished:
                    spec = futures.pop(done)
                    o = done.result()
                    status[o.key] = o.status
                    if budget is not None:
                        budget.finished(spec, o.status)
                    yield o
                yield from release()
            for spec in waiting:  # never admitted (or waiting on a run that was not)
                status[spec.key] = "not run"
                yield RunOutcome(spec.key, "not run", 0.0, None, refused.get(spec.key, "not admitted"))
        except BaseException:
            for f in futures:
                f.cancel()
            raise
