"""The multi-process executor: P processes run the same round engine, each training its share of every round.

Every rank holds the whole run (the same config, data, strategy and seeded streams), so every rank's engine
samples the same participants and builds the same payload. ``DistributedExecutor`` wraps the rank's
in-process executor: of each phase's clients it runs only those it owns (``World.owner``: cid mod P, fixed
for the run, so a client's state never moves), then all-gathers the results so every rank hands the engine
the same sorted ``Gathered`` and aggregates the same updates: P processes reproduce one (a client's
training depends only on its own seeded stream). Algorithm 1's oracle is split the same way
(``DistributedOracle``), and so is evaluation (``DistributedEvaluator``: each rank scores a slice of the
test set, or its own clients' local splits, and the sums are gathered). The gathers pickle only the small
fields; tensors and arrays travel as one flat byte tensor per rank (``fedent.rounds.flatgather``).

Where the strategy's server step needs only the weighted sum of the updates (its ``secure_weighting``, the same
property secure aggregation needs, or weights from a per-client statistic: ``reduce_by_statistic``) and nothing
else looks at single updates (no central DP, no robust rule, no local evaluation: ``sum_blocker``), a round is
*reduced* instead (``World.reduce``, ``auto`` by default): each rank screens its own clients' updates with the
engine's acceptance rule, the ranks gather only the clear parts (cid, count, loss, scalars, ‖w_i‖², the
statistic), and all-reduce Σ s_i w_i in float64 (``fit_sum``): one model's worth of traffic a round instead of
every update (NCCL where each rank has a GPU of its own). The engine then aggregates that
sum (``Strategy.aggregate_sum``); the model equals one process's to float rounding (the gathered path: bit for bit).

Only rank 0 writes the run directory the user asked for; the simulator points the other ranks' engines at
``<run>/.ranks/<r>/`` (their checkpoints and client state, so a multi-process run resumes too).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from fedent.distributed import World, WorldError, raise_failures, said
from fedent.meanfield.fixed_point import gradients_at
from fedent.meanfield.oracle import TrainerOracle
from fedent.params import Params, norm_sq, num_elements
from fedent.rounds import robust
from fedent.rounds.evaluation import ClientEval, Evaluator, FederatedEval, evaluate_shards, test_shards
from fedent.rounds.executor import Gathered
from fedent.rounds.flatgather import Buffers, all_gather_flat
from fedent.rounds.inprocess import InProcessExecutor, update_bytes
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload, SecureSum, Strategy, sum_mismatch
from fedent.trainer import LocalTrainer

if TYPE_CHECKING:
    from fedent.config import ExperimentConfig, RobustConfig
    from fedent.inputs import RunInputs
    from fedent.rounds.engine import RoundEngine

T = TypeVar("T")
R = TypeVar("R")
RANKS_DIR = ".ranks"  # <run>/.ranks/<r>/: the engine files of rank r > 0


def _moved(params: Sequence[Tensor], device: torch.device) -> Params:
    return [p.detach().to(device) for p in params]


def update_to(update: ClientUpdate, device: torch.device) -> ClientUpdate:
    """The update with its tensors on ``device`` (the CPU to travel between ranks, the run's device after); every
    other field travels as it is (secure aggregation's masked vector, which a rebuilt update once lost: the round
    then failed with "not masked"), except the upload encoding's codes, already decoded into params."""
    return dataclasses.replace(update, params=_moved(update.params, device),
                               tensors={k: _moved(v, device) for k, v in update.tensors.items()},
                               scalars=dict(update.scalars), codes={})


def merge(world: World, local: Gathered[T] | None, buffers: Buffers | None = None,
          error: BaseException | None = None) -> Gathered[T]:
    """Every rank's results and failures in one ``Gathered`` (sorted by cid), the same on every rank; the
    tensors and arrays inside the results travel as one flat buffer per rank (``all_gather_flat``; ``buffers``:
    the caller's, kept for its next gather). ``error``: this rank failed before the gather (not one client: the
    rank's own work); it still takes part, so every rank raises now, this one its error and the others
    ``RanksFailed`` naming it (``local`` is None then). (gloo notices a peer that exits within a second or so, but
    not who failed or why; NCCL's collectives, the reduced sum's, wait for ``TIMEOUT_S``.)"""
    local = Gathered() if local is None else local
    out: Gathered[T] = Gathered()
    for results, failed in all_gather_flat(world, (local.results, local.failed), buffers, error):
        out.results.update(results)
        out.failed.update(failed)
    return Gathered(out.results, out.failed)


def attempted(work: Callable[[], R]) -> tuple[R | None, Exception | None]:
    """``work()``'s result, or its exception (to be carried through the next collective by ``merge``)."""
    try:
        return work(), None
    except Exception as e:  # noqa: BLE001 - any failure must reach the peers before they wait on this rank
        return None, e


Accept = Callable[[Gathered[ClientUpdate]], Gathered[ClientUpdate]]  # the engine's acceptance rule for updates


def sum_blocker(cfg: ExperimentConfig, strategy: Strategy | type[Strategy], local_eval: int) -> str | None:
    """Why a round's updates cannot be reduced to their weighted sum over the ranks (None: they can); ``strategy``:
    the run's, or its class (what it declares is a class property)."""
    if strategy.secure_weighting is None and not strategy.reduce_by_statistic:
        return f"{strategy.name} needs more than the updates' weighted sum: {strategy.secure_blocker}"
    why = sum_mismatch(strategy if isinstance(strategy, type) else type(strategy))
    if why is not None:
        return why
    if cfg.privacy.secure_aggregation:
        return "secure aggregation sums the masked updates itself"
    if cfg.privacy.dp == "central":
        return "central DP clips and noises every update before the sum"
    if cfg.robust.aggregator != "mean" or cfg.robust.clip_norm is not None:
        return f"robust.aggregator {cfg.robust.aggregator} (or robust.clip_norm) looks at every update"
    if local_eval > 0:
        return "train.local_eval evaluates uploaded local models"
    return None


@dataclass
class Summed:
    """A reduced round's fit: the clear parts (no params) of the accepted updates and the failures, the weighted
    sum the strategy aggregates, and the weight cap's diagnostics (as ``robust.apply`` gives them)."""

    updates: Gathered[ClientUpdate]
    total: SecureSum
    diagnostics: dict[str, Any] = field(default_factory=dict)


class DistributedOracle:
    """Algorithm 1's gradient oracle over P ranks: each rank computes its own clients' gradients (batched
    where its host's oracle is), and all-gathers them, so every rank's fixed point sees every gradient."""

    def __init__(self, inner: TrainerOracle, world: World, device: torch.device) -> None:
        self.inner, self.world, self.device = inner, world, device
        self.buffers = Buffers()  # Algorithm 1 gathers every client's gradient once a sweep

    def gradient(self, t: int, cid: int, point: Sequence[Tensor]) -> Params:
        owner = self.world.owner(cid)
        got, error = (attempted(lambda: _moved(self.inner.gradient(t, cid, point), torch.device("cpu")))
                      if owner == self.world.rank else (None, None))
        g, why = self.world.broadcast((got, said(error)), src=owner)  # the owner's failure reaches every rank
        raise_failures(self.world.size, error, [(owner, why)])
        assert g is not None
        return _moved(g, self.device)

    def gradients(self, t: int, cids: Sequence[int], point: Sequence[Tensor]) -> list[Params]:
        mine = self.world.mine(cids)
        local, error = attempted(lambda: Gathered(dict(zip(
            mine, (_moved(g, torch.device("cpu")) for g in gradients_at(self.inner, t, mine, point)), strict=True))))
        every = merge(self.world, local, self.buffers, error)
        return [_moved(every.results[int(c)], self.device) for c in cids]


class DistributedExecutor:
    """The rank's in-process executor, asked only about the clients this rank owns; results all-gathered."""

    def __init__(self, inner: InProcessExecutor, world: World, sums: bool = False) -> None:
        self.inner, self.world = inner, world
        self.sums = sums  # the engine asks ``fit_sum`` instead of ``fit`` (a reduced run: sum_blocker said None)
        self.host = inner.host
        self.host.on_update = None  # uploads are booked after the gather, for every client, on every rank
        self.engine: RoundEngine | None = None
        self.on_client: Callable[[int, int], None] | None = None
        self.gather_s = 0.0  # wall time in the all-gathers of probes and updates (waiting for peers included)
        self.gather_cpu_s = 0.0  # this process's CPU time in them (all its threads: packing, copies, gloo's)
        self.buffers = Buffers()  # the updates' byte buffers, the same size every round: kept, not re-faulted

    def bind(self, engine: RoundEngine) -> None:
        self.engine = engine
        self.inner.bind(engine)
        for c in self.host.hosted:
            engine.clients.update([c], worker=f"simulator rank {self.world.owner(c)}/{self.world.size}")

    def status_fields(self) -> dict[str, Any]:
        return {**self.inner.status_fields(), "processes": self.world.size, "backend": self.world.backend,
                "reduce": "sum" if self.sums else "gather",
                "gather_s": round(self.gather_s, 3), "gather_cpu_s": round(self.gather_cpu_s, 3)}

    def _merge(self, local: Gathered[T] | None, error: BaseException | None = None) -> Gathered[T]:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return merge(self.world, local, self.buffers, error)
        finally:
            self.gather_s += time.perf_counter() - t0
            self.gather_cpu_s += time.process_time() - c0

    def start(self) -> None:
        """Every rank holds its clients already; counts a simulated attacker reports are adopted as in one process
        (every rank alike: the host's reports are a function of the config), so it is rejected at its report,
        not at each upload."""
        self.inner.start()

    def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                rounds: int) -> tuple[Strategy, dict[str, Any]]:
        with self.host.lock:
            oracle = DistributedOracle(self.host.oracle(), self.world, self.host.trainer.device)
            return strategy, dict(strategy.prepare(oracle, global_params, sizes, rounds) or {})

    def resumed(self, first: int | None, error: BaseException | None) -> None:
        """Every rank resumed, and at the same round: a rank whose own checkpoint failed to load says so (every rank
        raises, this one its error, the others ``RanksFailed`` naming it, instead of waiting in the first round's
        gather); a resume that found different checkpoints on different ranks (a kill between two ranks' saves)
        would train different models and is refused."""
        got = self.world.all_gather((first, said(error)))
        raise_failures(self.world.size, error, [(r, why) for r, (_, why) in enumerate(got)])
        firsts = [f for f, _ in got]
        if len(set(firsts)) != 1:
            raise WorldError(f"the ranks would start at different rounds {firsts} (their checkpoints differ); "
                             "remove the run directory's newest checkpoint or start a new run")

    def begin_round(self, rnd: int, global_params: Sequence[Tensor]) -> None:
        """Every rank holds w(t) already (each aggregates the same round)."""

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        return self._merge(*attempted(lambda: self.inner.probe(rnd, self.world.mine(cids), global_params, strategy)))

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        cpu, device = torch.device("cpu"), self.host.trainer.device

        def local() -> Gathered[ClientUpdate]:
            mine = self.inner.fit(rnd, self.world.mine(cids), global_params, strategy, payload)
            return Gathered({c: update_to(u, cpu) for c, u in mine.results.items()}, mine.failed)

        every = self._merge(*attempted(local))
        every.results = {c: update_to(u, device) for c, u in every.results.items()}
        if self.engine is not None:
            now = time.time()
            for u in every.results.values():
                self.engine.clients.add_bytes(u.cid, update_bytes(u))
                self.engine.clients.update([u.cid], last_heartbeat=now)
        if self.on_client is not None:
            self.on_client(len(cids), len(cids))
        return every

    def fit_sum(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
                payload: RoundPayload, accept: Accept, bounds: RobustConfig) -> Summed:
        """``fit``, reduced: each rank screens its own clients' updates with ``accept``, the ranks gather the clear
        parts of the accepted ones (and the failures, and every upload's size for clients.json, rejected ones
        included, as ``fit`` books them), cap their counts (``robust.apply`` with the run's ``bounds``: only the
        weight cap acts, ``sum_blocker`` ruled out the rest), and all-reduce Σ s_i w_i and each tensor group's
        Σ s_i t_i in float64, s_i the capped count (``samples`` weighting), 1 (``uniform``) or the strategy's
        ``reduce_weights`` of its clients' statistics (``reduce_by_statistic``: FedCos's normalised cosines),
        summed in cid order on each rank. Σ s_i (w_i − w(t)) is taken from the float64 sum too
        (``SecureSum.deltas``: FedDyn's Σλ increment without float32 cancellation). A rank that fails in its own
        part (not a client's: those are failures) makes every rank raise at the next collective, never wait:
        before the gather through ``merge``, after it through the sum's last element (a count of failed ranks)."""
        by_stat = strategy.reduce_by_statistic
        groups = strategy.payload_spec.update_tensors
        like = list(global_params)

        def screened() -> tuple[Gathered[ClientUpdate], Gathered[tuple[Any, int]], Tensor]:
            raw = self.inner.fit(rnd, self.world.mine(cids), global_params, strategy, payload)
            local = accept(raw)
            clear = {c: (ClientUpdate(c, [], u.num_samples, u.train_loss, scalars=dict(u.scalars)),
                         norm_sq(u.params), strategy.reduce_statistic(global_params, u) if by_stat else 0.0)
                     for c, u in local.results.items()}
            travelling = Gathered({c: (clear.get(c), update_bytes(u)) for c, u in raw.results.items()}, local.failed)
            # allocated before the gather, so running out of memory here is a failure the peers hear of
            buf = torch.zeros(num_elements(like) * (1 + len(groups)) + 1, dtype=torch.float64, device=like[0].device)
            return local, travelling, buf

        done, error = attempted(screened)
        local, travelling, buf = done if done is not None else (Gathered(), None, None)
        every = self._merge(travelling, error)
        if buf is None:  # unreachable: merge raised this rank's error
            raise WorldError("the reduced round's buffer is missing")
        got = {c: v[0] for c, v in every.results.items() if v[0] is not None}
        t0, c0 = time.perf_counter(), time.process_time()

        def fill() -> tuple[tuple[list[ClientUpdate], dict[str, Any]], dict[int, float]]:
            # the cap and the statistic's weights see the same gathered values on every rank; adding one's own
            # clients into the sum is the rank's alone
            capped_clients, diag = robust.apply(bounds, global_params, [got[c][0] for c in got])
            capped = [u.num_samples for u in capped_clients]
            if by_stat:
                s_i: Sequence[float] = strategy.reduce_weights([got[c][2] for c in got], capped) if got else []
            else:
                s_i = capped if strategy.secure_weighting == "samples" else [1] * len(got)
            w_i = {c: float(s) for c, s in zip(got, s_i, strict=True)}
            for c, u in local.results.items():
                off = 0
                for src in (u.params, *(u.tensors[g] for g in groups)):
                    for p in src:
                        n = p.numel()
                        buf[off:off + n].add_(p.detach().reshape(-1), alpha=w_i[c])
                        off += n
            return (capped_clients, diag), w_i

        filled, failed = attempted(fill)
        if failed is not None:  # still in the all-reduce (the peers wait there), its last element counting failures
            buf.zero_()
            buf[-1] = 1.0
        self.world.all_reduce_sum(buf)
        if buf[-1].item() != 0.0:  # every rank sees the count: all say who failed and why, then raise
            self.world.agree(failed)
        assert filled is not None  # agree raised otherwise
        (clients, diagnostics), weights = filled
        weight = float(sum(weights.values()))
        parts: list[Params] = []
        deltas: Params = []  # Σ s_i (w_i − w(t)) = Σ s_i w_i − W·w(t), the difference taken in float64
        off = 0
        for g in range(1 + len(groups)):
            one = []
            for p in like:
                part = buf[off:off + p.numel()].reshape(p.shape)
                if g == 0:
                    deltas.append((part - weight * p.detach().double()).to(p.dtype))
                one.append(part.to(p.dtype))
                off += p.numel()
            parts.append(one)
        self.gather_s += time.perf_counter() - t0
        self.gather_cpu_s += time.process_time() - c0
        total = SecureSum(rnd, parts[0], dict(zip(groups, parts[1:], strict=True)), weight, clients,
                          norms={c: got[c][1] for c in got}, deltas=deltas,
                          stats={c: got[c][2] for c in got} if by_stat else None)
        if self.engine is not None:
            now = time.time()
            for c, (_, size) in every.results.items():
                self.engine.clients.add_bytes(c, size)
                self.engine.clients.update([c], last_heartbeat=now)
        if self.on_client is not None:
            self.on_client(len(cids), len(cids))
        return Summed(Gathered({c: got[c][0] for c in got}, every.failed), total, diagnostics)

    def secure_exchange(self, rnd: int, requests: Mapping[int, bytes]) -> Gathered[bytes]:
        """A secure-aggregation step: each rank's clients answer theirs, and every rank gets every answer."""
        mine = set(self.world.mine(list(requests)))
        return self._merge(*attempted(lambda: self.inner.secure_exchange(
            rnd, {c: r for c, r in requests.items() if c in mine})))

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        return self.inner.replacements(rnd, attempt, k, exclude)

    def finish(self, ok: bool, reason: str) -> None:
        self.inner.finish(ok, reason)


def _slice(n: int, world: World) -> slice:
    """Rank ``world.rank``'s contiguous share of ``n`` test samples."""
    bounds = np.linspace(0, n, world.size + 1).round().astype(int)
    return slice(int(bounds[world.rank]), int(bounds[world.rank + 1]))


class DistributedEvaluator(Evaluator):
    """Server-side evaluation split over the ranks: each scores a contiguous slice of the test set and the
    sample-weighted sums are gathered (the loss agrees with one process to float64 rounding, the accuracy
    exactly)."""

    def __init__(self, world: World, trainer: LocalTrainer, x_test: Tensor, y_test: Tensor, batch_size: int,
                 seed: int, local_models: int = 0, federated: FederatedEval | None = None, *,
                 validation: tuple[Tensor, Tensor] | None = None, test: bool = True) -> None:
        super().__init__(trainer, x_test, y_test, batch_size, seed, local_models, federated, validation=validation,
                         test=test)
        self.world = world

    def evaluate(self, params: Sequence[Tensor]) -> tuple[float, float]:
        part = _slice(int(self.y_test.shape[0]), self.world)
        x, y = self.x_test[part], self.y_test[part]
        n = int(y.shape[0])

        def score() -> tuple[float, float]:
            if not n:
                return 0.0, 0.0
            self.trainer.load(params)
            return self.trainer.evaluate(x, y, self.batch_size)

        got, error = attempted(score)
        loss, acc = got or (0.0, 0.0)
        sums = self.world.all_gather((loss * n, round(acc * n), n, said(error)))  # a failure reaches every rank
        raise_failures(self.world.size, error, [(r, s[3]) for r, s in enumerate(sums)])
        total = sum(s[2] for s in sums)
        return sum(s[0] for s in sums) / max(total, 1), sum(s[1] for s in sums) / max(total, 1)


def distributed_federated(world: World, trainer: LocalTrainer, x_test: Tensor, y_test: Tensor, num_clients: int,
                          seed: int, batch_size: int) -> FederatedEval:
    """Federated evaluation over the ranks: each rank evaluates its own clients' local splits (the same
    ``test_shards`` as one process) and the per-client results are gathered."""
    shards = dict(enumerate(test_shards(int(y_test.shape[0]), num_clients, seed)))
    x, y = x_test.to(trainer.device), y_test.to(trainer.device)

    def run(rnd: int, params: Sequence[Tensor]) -> Gathered[ClientEval]:
        mine = world.mine(range(num_clients))
        got, error = attempted(lambda: Gathered(evaluate_shards(trainer, x, y, shards, mine, params, batch_size)))
        return merge(world, got, error=error)

    return run


def distributed_engine_parts(world: World, executor: InProcessExecutor, cfg: ExperimentConfig, inputs: RunInputs,
                             trainer: LocalTrainer, local_eval: int,
                             strategy: Strategy) -> tuple[DistributedExecutor, Evaluator]:
    """The simulator's executor and evaluator for one rank of a multi-process run; its rounds are reduced to
    sums where ``world.reduce`` and the run allow (``reduce: sum`` where the run does not is an error)."""
    why = sum_blocker(cfg, strategy, local_eval) if world.reduce != "gather" else "gather asked for"
    if world.reduce == "sum" and why is not None:
        raise WorldError(f"--reduce sum: this run cannot be reduced to sums: {why} (use --reduce auto or gather)")
    tr, data = cfg.train, inputs.data
    federated = None
    if tr.evaluation == "federated" and tr.evaluate_test:
        federated = distributed_federated(world, trainer, data.x_test, data.y_test, inputs.num_clients, tr.seed,
                                          tr.eval_batch_size)
    evaluator = DistributedEvaluator(world, trainer, data.x_test, data.y_test, tr.eval_batch_size, tr.seed,
                                     local_eval, federated, test=tr.evaluate_test)  # validation: every rank alike
    if inputs.validation_indices is not None:
        sel = torch.from_numpy(inputs.validation_indices)
        evaluator.validation = (data.x_train[sel].to(trainer.device), data.y_train[sel].to(trainer.device))
    return DistributedExecutor(executor, world, sums=why is None), evaluator
