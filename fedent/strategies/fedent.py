"""FedEnt (Algorithm 2): per-client adaptive rates from the entropy objective via mean-field terms.

Round t: each participant probes g_i at w(t) on one random batch and reports (a_i, b_i, D_i)
(Algorithm 2, line 4); the server asks the estimator for φ2(t+1) and broadcasts (φ2', c, ΣD); each
client solves η*_i by Proposition 1 (Eq. (eta_solve_t_1)), decays it with its own previous rate
(Eq. (eta_deacy)), runs E epochs of SGD at that fixed rate, and the server takes the θ-weighted mean.

Controls (issue 29, option ``rates``): ``shuffled`` trains each client at another participant's η_j(t) (the
server re-solves every participant's η_i(t) from the probes, exactly as the client does, and sends the seeded
permutation in ``RoundPayload.per_client``: same multiset, random assignment); ``fixed`` trains at the base rate.
In both, each client's own η_i(t) is still solved, decayed (its state chain) and logged; only the rate the SGD
steps use changes, and the round's record says which (``rates``, ``trained_rates``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from fedent.meanfield.decay import ETA_STATE_KEY, decayed_rate, previous_rate
from fedent.meanfield.diagnostics import ParticipantReport, fedent_round_record
from fedent.meanfield.estimator import OfflinePhi2Estimator, OnlinePhi2Estimator, Phi2Estimator
from fedent.meanfield.fixed_point import GradientOracle, solve_fixed_point
from fedent.meanfield.lr import solve_eta
from fedent.params import Params, dot, norm_sq
from fedent.rng import numpy_rng, torch_generator
from fedent.strategies.base import (
    AggregateResult,
    Capabilities,
    ClientState,
    ClientTask,
    ClientUpdate,
    LocalFit,
    PayloadSpec,
    Probe,
    ProbePlan,
    RoundPayload,
    SecureSum,
    Strategy,
    StrategyError,
    upload,
    weighted_average,
)
from fedent.strategies.options import FedEntOptions
from fedent.trainer import LocalTrainer

_PROBE_ROUND = "probe_round"
PROBE_SCALARS = ("a", "b", "eta_prev")  # what probe reports (eta_prev: η_i(t−1), for phi2_rate "used")
UPDATE_SCALARS = ("eta_star", "eta", "eta_prev", "a", "b", "c", "theta", "phi2_next", "guarded")  # what fit uploads
# What each scalar may be (PayloadSpec.ranges): rates are >= 0 (bounded far above any eta_max or base rate), b, c
# squared norms, θ >= 0 (above 1 under a weight cap), guarded a flag; a and φ2 signed.
# Far outside, a client is rejected, not the run.
RATE_MAX, MAGNITUDE_MAX = 1e6, 1e15
SCALAR_RANGES = (("eta_star", 0.0, RATE_MAX), ("eta", 0.0, RATE_MAX), ("eta_prev", 0.0, RATE_MAX),
                 ("a", -MAGNITUDE_MAX, MAGNITUDE_MAX), ("b", 0.0, MAGNITUDE_MAX), ("c", 0.0, MAGNITUDE_MAX),
                 ("theta", 0.0, MAGNITUDE_MAX), ("phi2_next", -MAGNITUDE_MAX, MAGNITUDE_MAX), ("guarded", 0.0, 1.0))


class FedEnt(Strategy):
    name = "fedent"
    needs_probe = True
    keeps_client_state = True
    payload_spec = PayloadSpec(probe_scalars=PROBE_SCALARS, update_scalars=UPDATE_SCALARS, ranges=SCALAR_RANGES)
    Options = FedEntOptions
    secure_weighting = "samples"  # Σθ_i w_i(t+1); the probe and update scalars stay in the clear

    def __init__(self, options: FedEntOptions | None = None, estimator: Phi2Estimator | None = None) -> None:
        self.options = o = options or FedEntOptions()
        self._injected = estimator is not None
        if estimator is not None:
            self.estimator: Phi2Estimator | None = estimator
        elif o.estimator == "online":
            self.estimator = OnlinePhi2Estimator(o.beta, o.variant, eta_max=o.eta_max, phi2_rate=o.phi2_rate,
                                                 gamma=o.gamma)
        else:
            self.estimator = None  # installed by prepare() or load_server_state()
        self.schedule: list[list[int]] | None = None  # every round's sampled clients (set_run_plan)
        self.base_lr: float | None = None
        self._estimates: dict[int, dict[str, Any]] = {}  # the round's estimator report, for its diagnostics
        self._assigned: dict[int, dict[int, float]] = {}  # rates shuffled: the round's cid -> rate trained with

    def set_run_plan(self, schedule: Sequence[Sequence[int]], base_lr: float) -> None:
        """Algorithm 1 simulates each round's sampled clients with the run's base rate η_i(−1) (spec §5)."""
        self.schedule = [sorted(int(c) for c in r) for r in schedule]
        self.base_lr = float(base_lr)

    @property
    def capabilities(self) -> Capabilities:
        """Offline mode needs Algorithm 1's gradient oracle before round 0 (unless an estimator was injected)."""
        mode = self.options.estimator
        return Capabilities(probe=True, oracle=mode == "offline" and not self._injected,
                            phi2_estimator="offline" if mode == "offline" else "online", client_state=True)

    # ---- server side -------------------------------------------------------------------------
    def prepare(
        self, oracle: Any, global_params: Sequence[Tensor], client_sizes: Sequence[int], rounds: int
    ) -> dict[str, Any]:
        """Offline mode: Algorithm 1 for T = ``rounds`` over each round's sampled clients (``offline_clients:
        participants``, needs ``set_run_plan``) or over all clients every round (``population``)."""
        if self.options.estimator != "offline" or self._injected:
            return {}
        total = float(sum(client_sizes))
        if total <= 0:
            raise StrategyError("offline estimator: the clients hold no samples")
        cids = [i for i, n in enumerate(client_sizes) if n > 0]
        thetas = [client_sizes[i] / total for i in cids]
        oracle_: GradientOracle = oracle
        o = self.options
        schedule = None
        if o.offline_clients == "participants":
            if self.schedule is None:
                raise StrategyError("fedent offline_clients 'participants' needs the run's client schedule "
                                    "(set_run_plan) before prepare")
            held = set(cids)
            schedule = [[c for c in r if c in held] for r in self.schedule[:rounds]]
        base_lr = self.base_lr if self.base_lr is not None else 0.0
        if o.phi2_rate == "used" and self.base_lr is None:
            raise StrategyError("fedent phi2_rate 'used' needs the base rate η_i(−1) (set_run_plan) before prepare")
        try:
            res = solve_fixed_point(
                oracle_, global_params, cids, thetas, rounds, o.beta, o.variant, o.eps1, o.eps2, o.max_sweeps,
                schedule=schedule, eta_max=o.eta_max, phi2_rate=o.phi2_rate, gamma=o.gamma, base_lr=base_lr,
            )
        except ValueError as e:
            raise StrategyError(f"fedent offline estimator: {e}") from None
        self.estimator = OfflinePhi2Estimator.from_result(res, schedule)
        return {"phi2": [float(v) for v in res.phi2], **res.report.to_dict(), "offline_clients": o.offline_clients,
                "phi2_rate": o.phi2_rate, "eta_max": o.eta_max}

    def round_payload(self, rnd: int, global_params: Sequence[Tensor], probes: Sequence[Probe]) -> RoundPayload:
        if self.estimator is None:
            raise StrategyError("fedent: the offline estimator needs prepare() (Algorithm 1) before round 0")
        if not probes:
            raise StrategyError("fedent: round_payload needs the participants' probes")
        total = float(sum(p.num_samples for p in probes))
        if total <= 0:
            raise StrategyError("fedent: the round's participants hold no samples")
        try:
            a = [float(p.scalars["a"]) for p in probes]
            b = [float(p.scalars["b"]) for p in probes]
            eta_prev = [float(p.scalars["eta_prev"]) for p in probes]
        except KeyError as e:
            raise StrategyError(f"fedent: a probe lacks scalar {e}") from None
        c = norm_sq(global_params)
        thetas = [p.num_samples / total for p in probes]
        try:
            est = self.estimator.estimate(rnd, c, thetas, a, b, cids=[p.cid for p in probes], eta_prev=eta_prev)
        except ValueError as e:
            raise StrategyError(f"fedent estimator: {e}") from None
        self._estimates = {rnd: dict(est.report)}
        scalars = {"phi2_next": est.phi2_next, "c": c, "total_samples": total}
        if self.options.rates != "shuffled":
            return RoundPayload(round=rnd, scalars=scalars)
        cids = [p.cid for p in probes]
        own = [self._used_rate(a[i], b[i], c, thetas[i], est.phi2_next, eta_prev[i]) for i in range(len(probes))]
        perm = numpy_rng(self.options.shuffle_seed, "fedent-shuffle", rnd).permutation(len(own))
        assigned = {cid: own[int(j)] for cid, j in zip(cids, perm, strict=True)}
        self._assigned = {rnd: assigned}
        return RoundPayload(round=rnd, scalars=scalars, per_client={c_: {"rate": r} for c_, r in assigned.items()})

    def _used_rate(self, a: float, b: float, c: float, theta: float, phi2: float, eta_prev: float) -> float:
        """η_i(t) as client i solves it in ``plan_fit`` (Proposition 1 on [0, U_i], then the decay)."""
        o = self.options
        sol = solve_eta(a, b, c, theta, phi2, o.beta, o.variant, eta_max=o.eta_max)
        return decayed_rate(eta_prev, float(sol.eta_star[0]), o.gamma)

    def aggregate(
        self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]
    ) -> AggregateResult:
        params = weighted_average(updates)
        o = self.options
        parts = [ParticipantReport(u.cid, u.num_samples, norm_sq(u.params), u.scalars) for u in updates]
        try:
            record = fedent_round_record(parts, o.beta, o.gamma, o.variant, o.eta_max, o.phi2_rate)
        except KeyError as e:
            raise StrategyError(f"fedent: an update lacks scalar {e}") from None
        est = self._estimates.pop(rnd, None)
        if est is not None:
            record["estimate"] = est
        self._control_record(rnd, record)
        return AggregateResult(params, {"fedent": record})

    def _control_record(self, rnd: int, record: dict[str, Any]) -> None:
        """The rate control of the round, when not plain FedEnt: ``rates`` and the rates trained with."""
        if self.options.rates == "adaptive":
            return
        record["rates"] = self.options.rates
        assigned = self._assigned.pop(rnd, None)
        if assigned is not None:
            record["trained_rates"] = {str(c): r for c, r in sorted(assigned.items())}

    def aggregate_sum(self, rnd: int, global_params: Sequence[Tensor], total: SecureSum) -> AggregateResult:
        """The θ-weighted mean from the secure sum; the record keeps every rate's inputs (clear scalars), and
        φ2_actual and the entropy term only where the sum came with each client's ‖w_i(t+1)‖² (``total.norms``: a
        reduced multi-process round; null under secure aggregation)."""
        o = self.options
        norms = total.norms or {}
        parts = [ParticipantReport(u.cid, u.num_samples, norms.get(u.cid, 0.0), u.scalars) for u in total.clients]
        try:
            record = fedent_round_record(parts, o.beta, o.gamma, o.variant, o.eta_max, o.phi2_rate)
        except KeyError as e:
            raise StrategyError(f"fedent: an update lacks scalar {e}") from None
        if total.norms is None:
            record.update(phi2_actual=None, entropy=None)
        est = self._estimates.pop(rnd, None)
        if est is not None:
            record["estimate"] = est
        self._control_record(rnd, record)
        return AggregateResult(total.mean(), {"fedent": record})

    def server_state(self) -> dict[str, Any]:
        if isinstance(self.estimator, OfflinePhi2Estimator):
            return {"offline": self.estimator.state()}
        return {}

    def load_server_state(self, state: dict[str, Any]) -> None:
        unknown = sorted(set(state) - {"offline"})
        if unknown:
            raise StrategyError(f"fedent: unknown server state keys {unknown}")
        if "offline" in state:
            off = state["offline"]
            self.estimator = OfflinePhi2Estimator(off["phi2"], off.get("report"), off.get("schedule"))

    # ---- client side -------------------------------------------------------------------------
    def _probe_scalars(
        self, trainer: LocalTrainer, global_params: Sequence[Tensor], task: ClientTask
    ) -> tuple[float, float]:
        """(a, b) = (⟨w(t), g⟩, ‖g‖²) with g on one random batch at w(t) (Algorithm 2, line 4)."""
        trainer.load(global_params)
        gen = torch_generator(task.seed, "probe", task.round, task.cid)
        g = trainer.gradient(task.indices, gen, self.options.probe_batch_size)
        return dot(global_params, g), norm_sq(g)

    def plan_probe(self, global_params: Sequence[Tensor], task: ClientTask, state: ClientState) -> ProbePlan:
        """g_i at w(t) on one random batch (Algorithm 2, line 4), reported as (a, b) = (⟨w(t), g⟩, ‖g‖²)."""
        gen = torch_generator(task.seed, "probe", task.round, task.cid)

        def finish(g: Params) -> Probe:
            a, b = dot(global_params, g), norm_sq(g)
            state.scalars.update({"a": a, "b": b, _PROBE_ROUND: float(task.round)})
            return Probe(task.cid, task.num_samples,
                         {"a": a, "b": b, "eta_prev": previous_rate(state.scalars, task.lr)})

        return ProbePlan(gen, self.options.probe_batch_size, finish)

    def plan_fit(
        self,
        trainer: LocalTrainer,
        global_params: Sequence[Tensor],
        payload: RoundPayload,
        task: ClientTask,
        state: ClientState,
    ) -> LocalFit:
        """η*_i by Proposition 1 on [0, min(B_i, eta_max)], decayed with η_i(t−1) (Eq. (eta_deacy)); then plain
        SGD at η_i."""
        try:
            phi2, c, total = (float(payload.scalars[k]) for k in ("phi2_next", "c", "total_samples"))
        except KeyError as e:
            raise StrategyError(f"fedent: the round payload lacks {e}") from None
        if total <= 0:
            raise StrategyError("fedent: payload total_samples must be > 0")
        if state.scalars.get(_PROBE_ROUND) == float(task.round) and "a" in state.scalars:
            a, b = state.scalars["a"], state.scalars["b"]
        else:  # e.g. a worker restarted between probe and fit: the probe batch is deterministic
            a, b = self._probe_scalars(trainer, global_params, task)
        theta = task.num_samples / total
        o = self.options
        sol = solve_eta(a, b, c, theta, phi2, o.beta, o.variant, eta_max=o.eta_max)
        eta_star = float(sol.eta_star[0])
        eta_prev = previous_rate(state.scalars, task.lr)
        eta = decayed_rate(eta_prev, eta_star, o.gamma)
        state.scalars[ETA_STATE_KEY] = eta
        scalars = {
            "eta_star": eta_star, "eta": eta, "eta_prev": eta_prev, "a": a, "b": b, "c": c, "theta": theta,
            "phi2_next": phi2, "guarded": float(sol.guards),
        }
        return LocalFit(self._trained_rate(eta, payload, task), upload(task, scalars))

    def _trained_rate(self, eta: float, payload: RoundPayload, task: ClientTask) -> float:
        """The rate the SGD steps use: η_i(t), or under a control the permuted one or the base rate."""
        if self.options.rates == "fixed":
            return float(task.lr)
        if self.options.rates == "shuffled":
            got = payload.per_client.get(task.cid, {}).get("rate")
            if got is None:
                raise StrategyError(f"fedent rates shuffled: the round payload holds no rate for client {task.cid}")
            return float(got)
        return eta


STRATEGY = FedEnt
