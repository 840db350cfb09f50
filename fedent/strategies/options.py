"""Every strategy's options: typed, one doc line per field, validated once when built.

Kept apart from the strategy modules (which import torch) so that loading a config, reading a run
directory's config.yaml and the estimator service's request checks reach them without importing the
strategies; the strategies take these classes as their ``Options`` (a test checks the two registries
agree). The YAML layout is flat: ``algorithm: {name: fedent, beta: 0.99, gamma: 0.99, ...}``.

Declarations only: each field's type (``Literal`` for choices) and ``option(..., gt=/ge=/lt=/le=)`` range
are checked by ``fedent.config.StrategyOptions``; ``check()`` holds rules that span fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedent.config import StrategyOptions, option
from fedent.meanfield.lr import Variant

EstimatorMode = Literal["online", "offline"]
Phi2Rate = Literal["used", "star"]
OfflineClients = Literal["participants", "population"]
RateControl = Literal["adaptive", "shuffled", "fixed"]


ReplayMode = Literal["per_client", "round_mean"]


@dataclass(frozen=True)
class FedAvgOptions(StrategyOptions):
    """FedAvg has no hyperparameters; ``replay_rates`` makes it a control that trains on another run's schedule."""

    algorithm = "fedavg"
    replay_rates: str | None = option(None, "a FedEnt run's metrics.jsonl: client i trains in round t at the rate "
                                            "η_i(t) that run logged (same seed: same clients and batches); null: "
                                            "the base rate train.lr")
    replay: ReplayMode = option("per_client", "with replay_rates: per_client (each client's own η_i(t)) or "
                                              "round_mean (the round's θ-weighted mean rate for every client: the "
                                              "rate's level without its per-client adaptation)")


@dataclass(frozen=True)
class FedAdamOptions(StrategyOptions):
    """Reddi et al.'s server-side Adam (no bias correction); the paper fixes β1, β2 and τ."""

    algorithm = "fedadam"
    server_lr: float = option(0.01, "η_s, the server learning rate (not given by the paper; from Reddi et al.'s grid)",
                              gt=0)
    beta1: float = option(0.9, "β1, decay of the first moment m", ge=0, lt=1)
    beta2: float = option(0.99, "β2, decay of the second moment v", ge=0, lt=1)
    tau: float = option(1e-3, "τ, the adaptivity (v starts at τ²)", gt=0)


@dataclass(frozen=True)
class FedYogiOptions(FedAdamOptions):
    """Same fields and ranges as FedAdam's (server_lr, beta1, beta2, tau)."""

    algorithm = "fedyogi"


@dataclass(frozen=True)
class FedProxOptions(StrategyOptions):
    algorithm = "fedprox"
    mu: float = option(0.01, "μ, weight of the proximal term (μ/2)‖w − w(t)‖² (paper: 0.01; 0 is FedAvg)", ge=0)


@dataclass(frozen=True)
class FedDynOptions(StrategyOptions):
    algorithm = "feddyn"
    alpha: float = option(0.001, "α, the dynamic regulariser's weight; client k uses α/(n_k/n̄) (paper: 0.001)", gt=0)


@dataclass(frozen=True)
class FedCosOptions(StrategyOptions):
    """FedCos has no hyperparameters (cosine weights, clipped at 0)."""

    algorithm = "fedcos"


@dataclass(frozen=True)
class ScaffoldOptions(StrategyOptions):
    algorithm = "scaffold"
    global_lr: float = option(1.0, "η_g, the server step on the mean model change", gt=0)


def _beta(doc: str) -> float:
    return option(0.99, doc, gt=0, lt=1)


def _gamma() -> float:
    return option(0.99, "γ, the rate decay η_i(t) = γη_i(t−1) + (1 − γ)η*_i (Eq. (eta_deacy))", ge=0, le=1)


def _probe_batch_size() -> int | None:
    return option(None, "batch size of the probe gradient g_i at w(t) (Algorithm 2, line 4); null: train.batch_size",
                  ge=1)


@dataclass(frozen=True)
class FedNormOptions(StrategyOptions):
    algorithm = "fednorm"
    beta: float = _beta("β, weight of the norm term in FedNorm's objective (Eq. (norm_objective))")
    gamma: float = _gamma()
    probe_batch_size: int | None = _probe_batch_size()


@dataclass(frozen=True)
class FedEntOptions(StrategyOptions):
    """FedEnt (Algorithm 2). eps1, eps2 and max_sweeps matter only with the offline estimator (Algorithm 1)."""

    algorithm = "fedent"
    beta: float = _beta("β, weight of the entropy term against the loss; K_i = βθ_i / ((1 − β)φ2')")
    gamma: float = _gamma()
    variant: Variant = option("exact", "η*_i of Proposition 1: exact (smallest root of the fixed point) or paper "
                                       "(the paper's closed form)")
    estimator: EstimatorMode = option("online", "φ2(t+1): online (a scalar fixed point per round) or offline "
                                                "(Algorithm 1 before round 0)")
    eps1: float = option(1e-3, "ε1, Algorithm 1 stops when φ1's largest relative change is below it (and φ2's "
                               "below ε2)", gt=0)
    eps2: float = option(1e-3, "ε2, the same test on φ2", gt=0)
    max_sweeps: int = option(20, "Algorithm 1 stops after this many sweeps (each costs T gradients per client)",
                             ge=1)
    probe_batch_size: int | None = _probe_batch_size()
    eta_max: float | None = option(1.0, "cap on η*_i: the paper's domain η ∈ [0, 1] (spec §5); the solve runs on "
                                        "[0, min(B_i, eta_max)]; null: no cap (the first reading, B_i only)", gt=0)
    phi2_rate: Phi2Rate = option("used", "the rate the mean field φ2(t+1) steps with: used (the decayed rate the "
                                         "client trains with, spec §5) or star (η*_i, the first reading)")
    offline_clients: OfflineClients = option("participants", "whom Algorithm 1 simulates in round t: participants "
                                                              "(the round's sampled clients, θ over them as in "
                                                              "training, spec §5) or population (every client, "
                                                              "the first reading)")
    rates: RateControl = option("adaptive", "the rate each client trains with: adaptive (its own η_i(t), FedEnt), "
                                            "shuffled (control: the round's η_i(t) permuted across its clients, "
                                            "seeded) or fixed (control: the base rate train.lr, no adaptation); "
                                            "η_i(t) is solved, decayed and logged as usual in every mode")
    shuffle_seed: int = option(0, "rates shuffled: the permutation of round t is drawn from (shuffle_seed, t)")

    quiet_defaults: ClassVar[Mapping[str, Any]] = {"rates": "adaptive", "shuffle_seed": 0}


OPTIONS: dict[str, type[StrategyOptions]] = {
    cls.algorithm: cls
    for cls in (FedAvgOptions, FedAdamOptions, FedYogiOptions, FedProxOptions, FedDynOptions, FedCosOptions,
                FedNormOptions, FedEntOptions, ScaffoldOptions)
}
