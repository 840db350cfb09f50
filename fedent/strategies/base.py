"""The one strategy interface that the simulator and the distributed aggregator both drive.

A round has up to three steps, each a method here:

1. optional probe (client side, ``needs_probe``): each participant reports scalars computed at w(t),
   e.g. FedEnt's (a_i, b_i, D_i) from one random batch;
2. ``round_payload`` (server side): what the round's clients receive besides w(t) — e.g. FedEnt's
   φ2(t+1) from the estimator, SCAFFOLD's server control variate;
3. ``fit`` (client side) then ``aggregate`` (server side).

Client state (FedDyn h_k, SCAFFOLD c_i, FedEnt η_i(t-1)) lives in ``ClientState`` objects that the
caller stores per client and passes back in; strategies keep no per-client dicts of their own, so a
worker process can persist and restore them. Server state is exposed by ``server_state`` /
``load_server_state`` for checkpoints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from fedent.params import Params, clone, weighted_sum
from fedent.trainer import GradHook, LocalTrainer, TrainResult


class StrategyError(ValueError):
    """A domain error raised by a strategy (bad update, inconsistent inputs)."""


@dataclass
class ClientState:
    """Per-client state that persists across rounds and restarts (serialisable: tensors and floats)."""

    tensors: dict[str, Params] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientTask:
    """What a client needs to run its part of one round."""

    cid: int
    round: int
    indices: Tensor  # the client's sample indices into the trainer's data tensors
    lr: float  # base learning rate (Table IV)
    epochs: int
    seed: int  # run seed; batches come from fedent.rng.torch_generator(seed, "train", round, cid)

    @property
    def num_samples(self) -> int:
        return int(self.indices.numel())


@dataclass(frozen=True)
class Probe:
    cid: int
    num_samples: int
    scalars: dict[str, float]


@dataclass
class RoundPayload:
    """Broadcast to the round's clients besides the global model (same bytes for every client)."""

    round: int
    tensors: dict[str, Params] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    per_client: dict[int, dict[str, float]] = field(default_factory=dict)  # small per-client scalars


@dataclass
class ClientUpdate:
    """A client's upload: its full local model w_i(t+1), plus algorithm extras and diagnostics."""

    cid: int
    params: Params
    num_samples: int
    train_loss: float
    tensors: dict[str, Params] = field(default_factory=dict)  # e.g. SCAFFOLD's Δc_i
    scalars: dict[str, float] = field(default_factory=dict)  # e.g. FedEnt's eta, eta_star
    # secure aggregation (fedent.secagg): the client's masked ring vector (uint64); ``params`` and ``tensors``
    # are then empty, what stays in the clear is the sample count, the train loss and the scalars
    masked: Any = None
    # the upload encoding's codes for params (fedent.compress; empty: params travel as they are): a worker sends
    # these instead, the aggregator rebuilds params from them and w(t)
    codes: dict[str, Params] = field(default_factory=dict)


@dataclass
class SecureSum:
    """What the server learns of a round under secure aggregation: sums, never one client's vectors.

    ``params`` = Σ s_i w_i and ``tensors[g]`` = Σ s_i t_i over the survivors, with s_i = n_i (``samples``
    weighting, ``weight`` = Σ n_i) or 1 (``uniform``, ``weight`` = the number of survivors); ``clients``: each
    survivor's clear part (cid, sample count, train loss, scalars; no params). A reduced round of a
    ``reduce_by_statistic`` strategy has s_i = its ``reduce_weights`` (``weight`` = their sum, about 1 for FedCos)
    and ``stats``, each client's statistic. Where the sum was taken in the clear
    (the multi-process simulator's reduced rounds): ``norms``, each client's ‖w_i‖², and ``deltas``,
    Σ s_i (w_i − w(t)) summed in float64 (``params`` − ``weight``·w(t) in float32 would cancel); both None under
    secure aggregation."""

    round: int
    params: Params
    tensors: dict[str, Params]
    weight: float
    clients: list[ClientUpdate]
    norms: dict[int, float] | None = None
    deltas: Params | None = None
    stats: dict[int, float] | None = None  # each client's ``reduce_statistic`` (``reduce_by_statistic`` strategies)

    def mean(self, group: str | None = None) -> Params:
        """The weighted mean Σ s_i x_i / Σ s_i of the model (or of a tensor group)."""
        if not self.weight > 0:
            raise StrategyError("cannot aggregate: the secure sum holds no weight")
        src = self.params if group is None else self.tensors[group]
        return [p / self.weight for p in src]


@dataclass(frozen=True)
class Capabilities:
    """What a strategy needs from whoever runs its rounds; runners read this, never the algorithm's name."""

    probe: bool = False  # clients report scalars at w(t) before the round's payload is built
    oracle: bool = False  # before round 0 it needs a gradient oracle over every client (Algorithm 1)
    phi2_estimator: Literal["online", "offline"] | None = None  # FedEnt's φ2(t+1) source (estimator service)
    client_state: bool = False  # clients keep state across rounds (persisted by the worker)


@dataclass(frozen=True)
class PayloadSpec:
    """What a strategy's probe and update carry; the aggregator checks an upload against it before accepting it
    (fedent.strategies.validation). Scalars must be exactly these names and finite; every tensor group in
    ``update_tensors`` is shaped like the model's parameters and finite, and no other group may be sent; a scalar
    with a declared range must lie in it."""

    probe_scalars: tuple[str, ...] = ()
    update_scalars: tuple[str, ...] = ()
    update_tensors: tuple[str, ...] = ()  # groups shaped like the model's parameters (SCAFFOLD's delta_c)
    # name -> [lo, hi]: the values a probe or update scalar of that name may take (both ends included); a value
    # outside rejects that client's upload (fedent.rounds.acceptance), never the run. Every built-in strategy
    # declares one for each of its scalars (tests/fedent/strategies/test_validation.py).
    ranges: tuple[tuple[str, float, float], ...] = ()

    def range_of(self, name: str) -> tuple[float, float] | None:
        for n, lo, hi in self.ranges:
            if n == name:
                return lo, hi
        return None


FinishFit = Callable[[Params, TrainResult], ClientUpdate]  # (w_i after training, its result) -> the upload


@dataclass
class LocalFit:
    """A client's local training, decided before it runs (Step 3 of the paper).

    E epochs of minibatch SGD at the fixed rate ``lr`` from w(t), on the gradient
    ∇F_i(w) + ``weight_coef`` · w + ``linear`` (FedProx's proximal term, SCAFFOLD's and FedDyn's
    corrections are all of this form), then ``finish`` turns the trained model into the upload and
    updates the client's state. Because the plan is data, an executor may run one client at a time
    (``Strategy.fit``) or many clients in one vectorised step (fedent.rounds.vectorised) with the same
    arithmetic.
    """

    lr: float
    finish: FinishFit
    weight_coef: float = 0.0
    linear: Params | None = None  # on the trainer's device, shaped like the model's parameters

    def grad_hook(self) -> GradHook | None:
        """The correction as a hook for ``LocalTrainer.train``; None when there is none (bit-for-bit SGD)."""
        coef, linear = self.weight_coef, self.linear
        if coef == 0.0 and linear is None:
            return None

        def hook(params: Sequence[Tensor], grads: Sequence[Tensor]) -> None:
            with torch.no_grad():  # in-place adds, no temporaries
                g = list(grads)
                if coef != 0.0:
                    torch._foreach_add_(g, list(params), alpha=coef)
                if linear is not None:
                    torch._foreach_add_(g, list(linear))

        return hook


@dataclass(frozen=True)
class ProbePlan:
    """A client's probe, decided before it runs: one gradient at w(t) on a batch of at most ``batch_size``
    samples drawn with ``generator`` (``LocalTrainer.gradient``; None = the training batch size), then
    ``finish`` turns it into the ``Probe`` (and may note what it needs in the client's state). Because the plan
    is data, the vectorised executor takes every participant's gradient in one step."""

    generator: torch.Generator
    batch_size: int | None
    finish: Callable[[Params], Probe]


@dataclass
class AggregateResult:
    params: Params
    diagnostics: dict[str, Any] = field(default_factory=dict)  # goes into metrics.jsonl


class Strategy(ABC):
    """Base class; one subclass per algorithm, one file per subclass."""

    name: ClassVar[str]
    needs_probe: ClassVar[bool] = False
    keeps_client_state: ClassVar[bool] = False
    payload_spec: ClassVar[PayloadSpec] = PayloadSpec()  # what its probe and update carry (checked on upload)
    # secure aggregation (docs/security.md): how a client scales its vector before masking ("samples": by n_i,
    # "uniform": by 1), or None where the server step needs more than the sum (then ``secure_blocker`` says why)
    secure_weighting: ClassVar[Literal["samples", "uniform"] | None] = None
    secure_blocker: ClassVar[str] = "it does not declare how it aggregates a secure sum (secure_weighting)"
    # a reduced multi-process round (fedent.rounds.distributed) whose weights are not ``secure_weighting``'s but come
    # from each client's own update, normalised over the round (FedCos's cosines): ``reduce_statistic`` is taken
    # where the client trained, ``reduce_weights`` turns every client's number and count into the round's weights
    reduce_by_statistic: ClassVar[bool] = False

    @property
    def capabilities(self) -> Capabilities:
        """Overridden where options change the needs (FedEnt's offline estimator needs an oracle)."""
        return Capabilities(probe=self.needs_probe, client_state=self.keeps_client_state)

    # ---- server side -------------------------------------------------------------------------
    def setup(self, global_params: Sequence[Tensor], client_sizes: Sequence[int]) -> None:
        """Called once before round 0 with the initial model and every client's sample count."""

    def set_run_plan(self, schedule: Sequence[Sequence[int]], base_lr: float) -> None:
        """Called before ``prepare`` with every round's sampled clients (sampling is a pure function of (seed,
        round), ``fedent.rng.sample_clients``) and the base rate; FedEnt's Algorithm 1 simulates them."""

    def prepare(
        self, oracle: Any, global_params: Sequence[Tensor], client_sizes: Sequence[int], rounds: int
    ) -> dict[str, Any]:
        """Called before round 0, when ``capabilities.oracle``, with a gradient oracle over all clients
        (fedent.meanfield.oracle); FedEnt's offline mode runs Algorithm 1 here. Returns a report."""
        return {}

    def round_payload(self, rnd: int, global_params: Sequence[Tensor], probes: Sequence[Probe]) -> RoundPayload:
        return RoundPayload(round=rnd)

    @abstractmethod
    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult: ...

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        """``aggregate`` from the secure sum alone (strategies with a ``secure_weighting``)."""
        raise StrategyError(f"{self.name} cannot run under secure aggregation: {self.secure_blocker}")

    def reduce_statistic(self, global_params: Sequence[Tensor], update: ClientUpdate) -> float:
        """The number a reduced round keeps of ``update`` to weigh it (``reduce_by_statistic`` strategies)."""
        raise NotImplementedError(f"{self.name} does not weigh a reduced round by a statistic")

    def reduce_weights(self, stats: Sequence[float], counts: Sequence[int]) -> list[float]:
        """The round's weights s_i from every accepted client's statistic and (capped) count, in cid order."""
        raise NotImplementedError(f"{self.name} does not weigh a reduced round by a statistic")

    def server_state(self) -> dict[str, Any]:
        return {}

    def load_server_state(self, state: dict[str, Any]) -> None:
        if state:
            raise StrategyError(f"{self.name} has no server state but was given {sorted(state)}")

    # ---- client side -------------------------------------------------------------------------
    def init_client_state(self, cid: int, num_samples: int) -> ClientState:
        return ClientState()

    def plan_probe(self, global_params: Sequence[Tensor], task: ClientTask, state: ClientState) -> ProbePlan:
        """The probe as a ``ProbePlan``; strategies with ``needs_probe`` implement this or ``probe``."""
        raise NotImplementedError(f"{self.name} has no probe step")

    def probe(
        self, trainer: LocalTrainer, global_params: Sequence[Tensor], task: ClientTask, state: ClientState
    ) -> Probe:
        """One client's probe on ``trainer``: its plan's gradient at w(t), then its finish."""
        plan = self.plan_probe(global_params, task, state)
        trainer.load(global_params)
        return plan.finish(trainer.gradient(task.indices, plan.generator, plan.batch_size))

    @property
    def plans_probe(self) -> bool:
        """Whether the probe is a ``ProbePlan`` (what the vectorised executor needs to batch it)."""
        return type(self).plan_probe is not Strategy.plan_probe

    def plan_fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> LocalFit:
        """The client's local training as a ``LocalFit`` (rate, gradient correction, how to finish).

        ``trainer`` may be used before training (e.g. FedNorm's probe gradient at w(t)); its model's
        parameters are not assumed to survive this call. Every built-in strategy implements it; a
        strategy that overrides ``fit`` instead runs only on executors that call ``fit``.
        """
        raise NotImplementedError(f"{self.name} defines no plan_fit")

    def fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> ClientUpdate:
        """One client's round on ``trainer``: its plan, then E epochs of SGD from w(t), then the upload."""
        plan = self.plan_fit(trainer, global_params, payload, task, state)
        trainer.load(global_params)
        res = trainer.train(task.indices, plan.lr, task.epochs, train_generator(task), grad_hook=plan.grad_hook())
        return plan.finish(clone(trainer.params), res)

    @property
    def plans_fit(self) -> bool:
        """Whether the client step is a ``LocalFit`` plan (what the vectorised executor needs)."""
        return type(self).plan_fit is not Strategy.plan_fit


def _defined_in(cls: type, name: str) -> type:
    return next(k for k in cls.__mro__ if name in k.__dict__)


def sum_mismatch(cls: type[Strategy]) -> str | None:
    """Why ``cls``'s sum path (secure aggregation, a reduced multi-process round) would not be its ``aggregate``: a
    subclass (e.g. a plug-in) overriding ``aggregate`` but inheriting its parent's capability and ``aggregate_sum``,
    or a half-declared ``reduce_by_statistic``; None when the two agree as declared."""
    agg, agg_sum = _defined_in(cls, "aggregate"), _defined_in(cls, "aggregate_sum")
    if agg_sum is Strategy or not issubclass(agg_sum, agg):
        return (f"{cls.name} overrides aggregate ({agg.__name__}) without its own aggregate_sum "
                f"({agg_sum.__name__}'s), so a sum would not aggregate as it does")
    if cls.reduce_by_statistic and Strategy in (_defined_in(cls, "reduce_statistic"),
                                                _defined_in(cls, "reduce_weights")):
        return f"{cls.name} sets reduce_by_statistic but does not define reduce_statistic and reduce_weights"
    return None


def upload(task: ClientTask, scalars: dict[str, float] | None = None) -> FinishFit:
    """The ``finish`` of a plan whose upload is the trained model (plus diagnostics ``scalars``) and nothing else."""
    return lambda params, res: ClientUpdate(task.cid, params, task.num_samples, res.loss, scalars=dict(scalars or {}))


class LocalSGDStrategy(Strategy):
    """Strategies whose client step is FedAvg's: E epochs of SGD from w(t) at ``local_rate``, upload w_i.

    FedAvg, FedAdam/FedYogi (server-side optimiser) and FedCos (server-side weights) differ only in
    ``aggregate``; they share this plan.
    """

    def local_rate(self, task: ClientTask) -> float:
        """The client's SGD rate: the base rate (FedAvg's replay control overrides it)."""
        return task.lr

    def plan_fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> LocalFit:
        return LocalFit(self.local_rate(task), upload(task))


def sample_weights(updates: Sequence[ClientUpdate]) -> list[float]:
    """θ_i = D_i / Σ_j D_j over the given updates (Eq. w_global_static_update)."""
    total = float(sum(u.num_samples for u in updates))
    if total <= 0:
        raise StrategyError("cannot aggregate: the updates hold no samples")
    return [u.num_samples / total for u in updates]


def weighted_average(updates: Sequence[ClientUpdate]) -> Params:
    """FedAvg's Σθ_i w_i, in the order given (callers sort by cid for determinism)."""
    if not updates:
        raise StrategyError("cannot aggregate zero updates")
    return weighted_sum([u.params for u in updates], sample_weights(updates))


def train_generator(task: ClientTask) -> torch.Generator:
    from fedent.rng import torch_generator

    return torch_generator(task.seed, "train", task.round, task.cid)


def tensor_lists_from_state(state: dict[str, Any], keys: Sequence[str], owner: str) -> dict[str, Params]:
    """Validate a checkpointed server state made of tensor lists under exactly ``keys``; return copies."""
    if set(state) != set(keys):
        raise StrategyError(f"{owner} server state needs keys {sorted(keys)}, got {sorted(state)}")
    out: dict[str, Params] = {}
    for k in keys:
        val = state[k]
        if not isinstance(val, (list, tuple)) or not all(isinstance(t, Tensor) for t in val):
            raise StrategyError(f"{owner} server state {k!r} must be a list of tensors")
        out[k] = [t.detach().clone() for t in val]
    if len({len(v) for v in out.values()}) > 1:
        raise StrategyError(f"{owner} server state tensor lists differ in length")
    return out


def align_state(state: Sequence[Tensor], like: Sequence[Tensor], what: str) -> Params:
    """``state`` checked against the model's shapes and moved to its device (checkpoints load on the CPU)."""
    if len(state) != len(like) or any(a.shape != b.shape for a, b in zip(state, like, strict=True)):
        raise StrategyError(f"{what} does not match the model's parameter shapes")
    return [a if a.device == b.device else a.to(b.device) for a, b in zip(state, like, strict=True)]
