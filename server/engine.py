"""The aggregator's side of a run: the worker registry and the remote client executor (no gRPC here).

The round loop is the core's ``fedent.rounds.RoundEngine``, the same one the simulator runs; ``ClusterRun``
is its ``ClientExecutor``: it queues tasks for the workers' Work streams and waits (event-driven, with a
deadline) for their results, which the servicer hands in through ``submit_*``. Domain errors raised here
carry the kind of failure (``ClusterError.code``) so the servicer can map them to gRPC status codes.

Why ~620 lines in one module: the registry (register, ready, heartbeats, retire) and the executor
(dispatch, gather, submit) share one lock, one condition and the open collector; a worker that goes away
must fail its clients in the phase that is waiting on them, atomically with the registry change. The
types they pass around live in ``server.work``.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fedent import runlog
from fedent.config import ExperimentConfig
from fedent.inputs import RunInputs
from fedent.rng import numpy_rng
from fedent.rounds import Gathered, RoundEngine, RoundPolicy, RunError
from fedent.rounds.evaluation import ClientEval, Evaluator
from fedent.rounds.sequential import central_source
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload, Strategy, StrategyError
from fedent.strategies.validation import check_probe, check_update
from fedent.trainer import LocalTrainer
from fedentrpc import codec, mappers
from fedentrpc.v1.aggregator_pb2 import AggregatorServiceFetchBlobResponse as BlobMessage
from server.settings import AggregatorSettings
from server.work import ClusterError, Collector, Registration, Task, WorkerHandle

security_log = logging.getLogger("fedent.security")

RPC_THREADS_SPARE = 4  # server threads kept free for unary calls while every Work stream holds one


class ClusterRun:
    """One federated run on remote workers: the registry and the executor; ``run()`` runs the rounds (in a thread)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        settings: AggregatorSettings,
        paths: runlog.RunPaths,
        inputs: RunInputs,
        strategy: Strategy,
        device: torch.device,
        worker_config: Mapping[str, Any],
        on_phase: Callable[[str], None] | None = None,
        offline: Callable[[Sequence[Tensor], Sequence[int], int], Any] | None = None,
        rebuild_strategy: Callable[[Any], Strategy] | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        run_key: str = "",
    ) -> None:
        self.cfg, self.settings, self.paths = cfg, settings, paths
        self.run_key = run_key or paths.run_id  # what workers key their state by (runlog.run_key)
        self.worker_config = worker_config
        self.offline, self.rebuild_strategy = offline, rebuild_strategy
        self.seed = cfg.train.seed
        self.sizes = inputs.client_sizes()
        self.md5 = str(inputs.partition_info.get("md5", ""))
        self.local_data = cfg.data.placement == "workers"  # sizes are what the workers report at Ready
        self.reported: dict[int, dict[str, Any]] = {}  # cid -> label_counts, data_source, num_test_samples
        self.workers: dict[str, WorkerHandle] = {}
        self.owner: dict[int, str] = {}  # cid -> worker id
        self.lock = threading.RLock()
        self.registry_changed = threading.Condition(self.lock)
        self.blobs: dict[str, codec.EncodedTensors] = {}
        self.collector: Collector | None = None
        self.task_ids = itertools.count(1)
        self.finished = threading.Event()
        self.error: str | None = None
        data = inputs.data  # the aggregator holds the test set only; training data lives with the workers
        trainer = LocalTrainer(inputs.make_model(), data.x_test[:0], data.y_test[:0], cfg.train.batch_size, device,
                               cfg.train.precision)
        federated = self.evaluate_clients if cfg.train.evaluation == "federated" else None
        evaluator = Evaluator(trainer, data.x_test, data.y_test, cfg.train.eval_batch_size, self.seed,
                              int(getattr(cfg.train, "local_eval", 0) or 0), federated)
        policy = RoundPolicy(settings.quorum, settings.round_retries, settings.checkpoint_keep)
        self.engine = RoundEngine(cfg, paths, strategy, self, evaluator, trainer.params, self.sizes,
                                  dict(inputs.partition_info), policy, on_phase=on_phase,
                                  on_round=on_round)
        self.book = self.engine.clients
        self.stop = self.engine.stop

    # ---- the engine's state, as the servicer and the dashboard read it ----------------------------
    @property
    def strategy(self) -> Strategy:
        return self.engine.strategy

    @property
    def phase(self) -> str:
        return self.engine.phase

    @property
    def rounds(self) -> int:
        return self.engine.rounds

    @property
    def round(self) -> int | None:
        return self.engine.round

    @property
    def global_params(self) -> list[Tensor]:
        return self.engine.global_params

    @property
    def on_phase(self) -> Callable[[str], None] | None:
        return self.engine.on_phase

    @on_phase.setter
    def on_phase(self, fn: Callable[[str], None] | None) -> None:
        self.engine.on_phase = fn

    def status(self, phase: str, rnd: int | None, **state: Any) -> None:
        self.engine.status(phase, rnd, **state)

    # ---- ClientExecutor -------------------------------------------------------------------------
    def bind(self, engine: RoundEngine) -> None:
        engine.clients.update(range(len(self.sizes)), state="waiting")
        if not self.local_data:
            engine.clients.update(range(len(self.sizes)), data_source=central_source(engine.partition_info))

    def status_fields(self) -> dict[str, Any]:
        with self.lock:
            workers = sum(1 for w in self.workers.values() if not w.gone)
        return {"mode": "cluster", "workers": workers}

    def start(self) -> None:
        threading.Thread(target=self._watch_heartbeats, name="heartbeats", daemon=True).start()
        self.wait_for_workers()
        if self.local_data:
            self.engine.adopt_client_data(self.sizes, self.reported_partition())

    def reported_partition(self) -> dict[str, Any]:
        """partition.json's fields from what the workers reported (label histograms where every client sent one)."""
        with self.lock:
            rows = [self.reported.get(c, {}) for c in range(len(self.sizes))]
        counts = [r.get("label_counts") or [] for r in rows]
        info: dict[str, Any] = {"sources": [r.get("data_source", "") for r in rows],
                                "test_sizes": [int(r.get("num_test_samples", 0)) for r in rows]}
        if all(counts):
            info["label_counts"] = counts
        return info

    def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                rounds: int) -> tuple[Strategy, dict[str, Any]]:
        """Algorithm 1 runs on the estimator service (the aggregator has no training data); the strategy is
        rebuilt around the estimator it returns."""
        if self.offline is None or self.rebuild_strategy is None:
            raise RunError(f"{strategy.name} needs Algorithm 1 before round 0, which runs on the estimator "
                           "service: start the aggregator with --estimator HOST:PORT")
        estimator = self.offline(global_params, sizes, rounds)
        report = getattr(estimator, "report", None)
        return self.rebuild_strategy(estimator), dict(report) if isinstance(report, dict) else {}

    def begin_round(self, rnd: int, global_params: Sequence[Tensor]) -> None:
        """w(t) encoded once for every download of the round; the previous round's blobs are dropped."""
        enc = codec.encode_tensors({codec.PARAMS_GROUP: list(global_params)}, self.settings.transfer(), BlobMessage)
        with self.lock:
            self.blobs = {model_blob(rnd): enc}

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        col = self._dispatch("probe", rnd, cids, model_blob(rnd))
        return Gathered(self._gather(col), dict(col.failed))

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        payload_blob = ""
        if payload.tensors:
            payload_blob = f"r{rnd}-payload"
            enc = codec.encode_tensors(mappers.payload_bundle(payload), self.settings.transfer(), BlobMessage)
            with self.lock:
                self.blobs[payload_blob] = enc
        with self.lock:
            hosted = [c for c in cids if self._hosted(c)]  # a down or disconnected client keeps showing why
        self.book.update(hosted, state="training")
        self.book.write()
        col = self._dispatch("fit", rnd, cids, model_blob(rnd), payload, payload_blob)
        return Gathered(self._gather(col), dict(col.failed))

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        return self.retry_clients(rnd, attempt, k, exclude)

    def finish(self, ok: bool, reason: str) -> None:
        if not ok or self.settings.stop_workers_when_done:
            self.shutdown_workers(reason, failed=not ok)

    # ---- registry (called from RPC threads); with authentication a worker acts only for itself -----------
    @staticmethod
    def _deny(action: str, identity: str, claimed: str, why: str) -> ClusterError:
        """A PERMISSION_DENIED error, logged with the call, the caller's identity and what it claimed."""
        security_log.warning("denied %s by worker %s (claimed %s): %s", action, identity, claimed, why)
        return ClusterError("permission", f"worker {identity} may not act for {claimed}: {why}")

    def register(self, name: str, token: str, cids: Sequence[int], device: str, hostname: str,
                 identity: str | None = None) -> Registration:
        """``identity``: the worker the call's credentials name (None without authentication). With one, the
        registration's name is that identity: a request naming a worker registered under another identity is
        denied, any other requested name (a display label such as ``host-pid-c0``) is replaced by it. Clients
        held by a live worker of another identity are denied instead of being a conflict, and a
        re-registration retires only the caller's own old registration."""
        if identity is not None:
            if name and name != identity:
                with self.lock:
                    claimed = any(w.identity == name or w.name == name for w in self.workers.values())
                if claimed:
                    raise self._deny("Register", identity, name, "that worker is registered by other credentials")
                security_log.info("worker %s registers as itself, not as %r (the name is its credentials')",
                                  identity, name)
            name = identity
        if self.settings.token and not hmac.compare_digest(token.encode(), self.settings.token.encode()):
            raise ClusterError("unauthenticated", "bad or missing registration token")
        if self.finished.is_set():
            raise ClusterError("precondition", f"the run is over ({self.error or 'finished'}); nothing to do")
        wanted = tuple(sorted(int(c) for c in cids))
        if not wanted:
            raise ClusterError("invalid", "a worker must host at least one client")
        if len(set(wanted)) != len(wanted):
            raise ClusterError("invalid", "duplicate client ids")
        bad = [c for c in wanted if not 0 <= c < len(self.sizes)]
        if bad:
            raise ClusterError("invalid", f"client ids {bad[:5]} out of range [0, {len(self.sizes)})")
        with self.lock:
            live = sum(1 for w in self.workers.values() if not w.gone)
            if live + RPC_THREADS_SPARE >= self.settings.max_workers:
                raise ClusterError("exhausted", f"{live} workers already hold the aggregator's "
                                                f"{self.settings.max_workers} RPC threads; raise max_workers")
            stale = {self.owner[c] for c in wanted if c in self.owner and not self.workers[self.owner[c]].gone}
            for wid in stale:  # a worker reconnecting before its old stream was noticed to be dead
                old = self.workers[wid]
                if name and old.name == name and old.cids == wanted and old.identity == identity:
                    self._retire(old, "disconnected", "worker re-registered")
            taken = [c for c in wanted if c in self.owner and not self.workers[self.owner[c]].gone]
            foreign = [c for c in taken if identity is not None and self.workers[self.owner[c]].identity != identity]
            if foreign:
                raise self._deny("Register", identity or "?", f"clients {foreign[:5]}",
                                 "they are hosted by another worker")
            if taken:
                raise ClusterError("conflict", f"clients {taken[:5]} are already hosted by a live worker")
            wid = f"w-{uuid.uuid4().hex[:10]}"
            self.workers[wid] = WorkerHandle(wid, name or wid, wanted, device, hostname, identity)
            for c in wanted:
                self.owner[c] = wid
                self.book.update([c], worker=name or wid, device=device, state="registered")
        self.book.write()
        return Registration(wid, self.run_key, self.worker_config, self.md5, self.settings.transfer(),
                            self.settings.heartbeat_s)

    def worker(self, worker_id: str, identity: str | None = None, action: str = "call") -> WorkerHandle:
        """The live registration ``worker_id``; with an ``identity``, only if that identity registered it."""
        with self.lock:
            w = self.workers.get(worker_id)
        if identity is not None and w is not None and w.identity != identity:
            raise self._deny(action, identity, worker_id, f"registered by {w.identity or 'an unauthenticated worker'}")
        if w is None or w.gone:
            raise ClusterError("not_found", f"unknown worker {worker_id!r}; register first")
        w.last_seen = time.time()
        return w

    def mark_ready(self, worker_id: str, md5: str, sizes: dict[int, int], identity: str | None = None,
                   details: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        w = self.worker(worker_id, identity, "Ready")
        if self.local_data:
            self._accept_local(w, sizes, details or {})
        elif md5 != self.md5:
            raise ClusterError("precondition", f"partition md5 {md5} differs from the aggregator's {self.md5}; "
                                               "same data, config and seed are needed")
        for cid in ([] if self.local_data else w.cids):
            if sizes.get(cid) != self.sizes[cid]:
                raise ClusterError("precondition", f"client {cid} has {sizes.get(cid)} samples, expected "
                                                   f"{self.sizes[cid]}")
        with self.registry_changed:
            w.ready = True
            for c in w.cids:
                self.book.update([c], state="idle", last_heartbeat=time.time())
            self.registry_changed.notify_all()
        self.book.write()

    def _accept_local(self, w: WorkerHandle, sizes: dict[int, int], details: Mapping[int, Mapping[str, Any]]) -> None:
        """Worker-local data: the reported sample counts become the clients' sizes (every sample-weighted rule
        uses them), with the label histogram and data source for the dashboard. An empty client, a count for a
        client the worker does not host or a histogram that does not add up is refused."""
        num_classes = int(self.engine.partition_info.get("num_classes") or 0)
        for cid in w.cids:
            n = sizes.get(cid)
            if n is None or n <= 0:
                raise ClusterError("invalid", f"client {cid}: {n or 0} samples reported; a client needs at least one")
            d = details.get(cid, {})
            counts = [int(v) for v in d.get("label_counts") or []]
            if counts and (sum(counts) != n or (num_classes and len(counts) != num_classes) or min(counts) < 0):
                raise ClusterError("invalid", f"client {cid}: label histogram {counts[:12]} does not match "
                                              f"{n} samples over {num_classes} classes")
        extra = sorted(set(sizes) - set(w.cids))
        if extra:
            raise ClusterError("invalid", f"sizes reported for clients {extra[:5]} this worker does not host")
        with self.lock:
            for cid in w.cids:
                self.sizes[cid] = int(sizes[cid])
                d = details.get(cid, {})
                self.reported[cid] = {"label_counts": [int(v) for v in d.get("label_counts") or []],
                                      "data_source": str(d.get("data_source", "")),
                                      "num_test_samples": int(d.get("num_test_samples", 0))}
                self.book.update([cid], samples=int(sizes[cid]), data_source=self.reported[cid]["data_source"]
                                 or "worker", label_counts=self.reported[cid]["label_counts"] or None)

    def attach(self, worker_id: str, identity: str | None = None) -> WorkerHandle:
        w = self.worker(worker_id, identity, "Work")
        with self.lock:
            if w.streaming:
                raise ClusterError("conflict", f"worker {worker_id} already has an open work stream")
            w.streaming = True
        return w

    def detach(self, w: WorkerHandle) -> None:
        """A worker's Work stream ended: it is gone, and its outstanding clients fail now, not at the deadline."""
        with self.registry_changed:
            w.streaming = False
            if w.gone:  # already retired (missed heartbeats, replaced by its re-registration)
                return
            w.gone = True
            self.registry_changed.notify_all()
            for c in w.cids:
                self.book.update([c], state="finished" if self.finished.is_set() or self.phase == "done"
                                 else "disconnected")
        col = self.collector
        if col is not None:
            for c in w.cids:
                col.fail(c, "worker disconnected")
        self.book.write()

    def _retire(self, w: WorkerHandle, state: str, why: str) -> None:
        """Mark ``w`` gone (clients ``state`` in clients.json), fail its open tasks now and end its Work stream."""
        with self.registry_changed:
            if w.gone:
                return
            w.gone = True
            self.registry_changed.notify_all()
            for c in w.cids:
                self.book.update([c], state=state)
        col = self.collector
        if col is not None:
            for c in w.cids:
                col.fail(c, why)
        w.tasks.put(None)

    def expire_silent_workers(self, now: float | None = None) -> list[str]:
        """Workers silent for ``heartbeat_misses`` heartbeat periods are dead: their clients go ``down`` and
        the round stops waiting for them (a hung but connected worker never closes its stream).

        Registered but never Ready workers expire by the same limit (their last sign of life is the Register,
        or the heartbeats a worker sends while it loads its data): one killed between Register and Ready has
        no Work stream whose end would retire it, and would otherwise hold its clients until the register
        timeout fails the run, refusing its own restart (``conflict``)."""
        if self.settings.heartbeat_misses <= 0:
            return []
        limit = self.settings.heartbeat_misses * self.settings.heartbeat_s
        now = time.time() if now is None else now
        with self.lock:
            silent = [w for w in self.workers.values() if not w.gone and now - w.last_seen > limit]
        for w in silent:
            self._retire(w, "down", f"missed heartbeats for {now - w.last_seen:.1f}s")
        if silent:
            self.book.write()
        return [w.worker_id for w in silent]

    def _watch_heartbeats(self) -> None:
        period = max(0.05, min(1.0, self.settings.heartbeat_s / 2))
        while not self.finished.wait(period):
            self.expire_silent_workers()

    def heartbeat(self, worker_id: str, identity: str | None = None) -> bool:
        with self.lock:
            w = self.workers.get(worker_id)
        if identity is not None and w is not None and w.identity != identity:
            raise self._deny("Heartbeat", identity, worker_id,
                             f"registered by {w.identity or 'an unauthenticated worker'}")
        if w is None or w.gone:
            return False
        w.last_seen = time.time()
        self.book.update(w.cids, last_heartbeat=w.last_seen)
        return True

    def fetch_blob(self, blob_id: str, worker_id: str = "", identity: str | None = None) -> codec.EncodedTensors:
        with self.lock:
            owner = self.workers.get(worker_id)
        if identity is not None and owner is not None and owner.identity != identity:
            # its bytes_down must not be charged to another worker
            raise self._deny("FetchBlob", identity, worker_id, f"registered by {owner.identity or 'another'}")
        with self.lock:
            enc = self.blobs.get(blob_id)
        if enc is None:
            raise ClusterError("not_found", f"no blob {blob_id!r} (it belongs to a finished round)")
        if worker_id:
            with self.lock:
                w = self.workers.get(worker_id)
                if w is not None:
                    w.bytes_down += enc.wire_bytes
        return enc

    # ---- results (called from RPC threads) -------------------------------------------------------
    def _collector(self, kind: str) -> Collector:
        col = self.collector
        if col is None or col.kind != kind:
            raise ClusterError("precondition", f"no {kind} phase is open")
        return col

    def _own(self, worker_id: str, cid: int, identity: str | None = None, action: str = "call") -> WorkerHandle:
        w = self.worker(worker_id, identity, action)
        if cid not in w.cids and identity is not None:
            raise self._deny(action, identity, f"client {cid}", f"not hosted by its worker {worker_id}")
        if cid not in w.cids:
            raise ClusterError("precondition", f"client {cid} is not hosted by worker {worker_id}")
        return w

    def submit_probes(self, worker_id: str, task_id: int, rnd: int, probes: Iterable[Probe],
                      identity: str | None = None) -> None:
        """Record every valid probe of the report; the bad ones are excluded and named in one error."""
        probes = list(probes)
        if identity is not None:  # who may submit comes before whether a phase is open
            for p in probes:
                self._own(worker_id, p.cid, identity, "SubmitProbes")
        col = self._collector("probe")
        for p in probes:
            self._own(worker_id, p.cid)
        bad: dict[int, str] = {}
        for p in probes:
            try:
                check_probe(self.strategy, p, self.sizes[p.cid])
            except StrategyError as e:
                col.fail(p.cid, f"invalid probe: {e}", task_id, rnd)
                bad[p.cid] = str(e)
            else:
                col.put(task_id, rnd, p.cid, p)
        if bad:
            raise ClusterError("invalid", f"probes of clients {sorted(bad)} rejected and excluded: "
                                          + "; ".join(bad.values()))

    def max_update_bytes(self) -> int:
        """The most an update stream may carry: the parameters plus up to three model-sized tensor groups
        (SCAFFOLD's control variate, FedDyn's state) and framing headroom; anything larger is rejected."""
        return 4 * self.engine.model_bytes + (1 << 20)

    def submit_update(self, worker_id: str, task_id: int, rnd: int, update: ClientUpdate, wire_bytes: int,
                      identity: str | None = None) -> None:
        if identity is not None:  # who may submit comes before whether a phase is open
            self._own(worker_id, update.cid, identity, "SubmitUpdate")
        col = self._collector("fit")
        w = self._own(worker_id, update.cid)
        w.bytes_up += wire_bytes
        self.book.add_bytes(update.cid, wire_bytes)
        try:  # the strategy's declared payload (fedent.strategies.validation) before the update is acknowledged
            check_update(self.strategy, update, self.global_params, self.sizes[update.cid])
        except StrategyError as e:
            col.fail(update.cid, str(e), task_id, rnd)
            raise ClusterError("invalid", f"{e}; excluded from aggregation") from None
        col.put(task_id, rnd, update.cid, update)

    def report_failure(self, worker_id: str, task_id: int, rnd: int, cid: int, message: str,
                       identity: str | None = None) -> None:
        w = self.worker(worker_id, identity, "ReportFailure")
        if identity is not None and cid >= 0 and cid not in w.cids:
            raise self._deny("ReportFailure", identity, f"client {cid}", f"not hosted by its worker {worker_id}")
        if cid < 0 and not w.ready:  # refused at start (its local data does not fit the model): free its clients
            self._retire(w, "refused", message)
            self.book.update(w.cids, data_source=f"refused: {message[:200]}")
            self.book.write()
            return
        col = self.collector
        if col is None or col.round != rnd:
            return
        for c in ([cid] if cid >= 0 else list(w.cids)):
            if c in w.cids:
                col.fail(c, f"worker failure: {message}")

    def submit_evaluation(self, worker_id: str, task_id: int, rnd: int, results: Iterable[ClientEval],
                          identity: str | None = None) -> None:
        """Federated evaluation: each client's (samples, loss, accuracy) on its local test split; a result that
        is not finite, claims more test samples than the client reported or is out of [0, 1] is excluded."""
        results = list(results)
        if identity is not None:
            for r in results:
                self._own(worker_id, r.cid, identity, "SubmitEvaluation")
        col = self._collector("evaluate")
        bad: list[str] = []
        for r in results:
            self._own(worker_id, r.cid)
            limit = self.reported.get(r.cid, {}).get("num_test_samples") if self.local_data else None
            why = ("not finite" if not (math.isfinite(r.loss) and math.isfinite(r.accuracy)) else
                   "accuracy outside [0, 1]" if not 0.0 <= r.accuracy <= 1.0 else
                   "negative sample count" if r.num_samples < 0 else
                   f"{r.num_samples} test samples, {limit} reported" if limit is not None and r.num_samples > limit
                   else None)
            if why is not None:
                col.fail(r.cid, f"invalid evaluation: {why}", task_id, rnd)
                bad.append(f"client {r.cid}: {why}")
            else:
                col.put(task_id, rnd, r.cid, r)
        if bad:
            raise ClusterError("invalid", "evaluations rejected and excluded: " + "; ".join(bad))

    def evaluate_clients(self, rnd: int, params: Sequence[Tensor]) -> Gathered[ClientEval]:
        """Federated evaluation of ``params`` (w(t+1)) by every hosted client on its local test split."""
        blob = f"r{rnd}-eval"
        enc = codec.encode_tensors({codec.PARAMS_GROUP: list(params)}, self.settings.transfer(), BlobMessage)
        with self.lock:
            self.blobs[blob] = enc
            cids = [c for c in range(len(self.sizes)) if self._hosted(c)
                    and (not self.local_data or self.reported.get(c, {}).get("num_test_samples", 0) > 0)]
        col = self._dispatch("evaluate", rnd, cids, blob)
        return Gathered(self._gather(col), dict(col.failed))

    # ---- the round loop --------------------------------------------------------------------------
    def wait_for_workers(self) -> None:
        """Block (event-driven) until every client is hosted by a ready worker; status.json shows the count."""
        deadline = time.monotonic() + self.settings.register_timeout_s
        shown = -1
        with self.registry_changed:
            while not self.stop.is_set():
                missing = [c for c in range(len(self.sizes)) if not self._hosted(c)]
                if not missing:
                    return
                if len(missing) != shown:
                    shown = len(missing)
                    self.status("starting", None, clients_hosted=len(self.sizes) - shown, clients=len(self.sizes))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{len(missing)} clients (e.g. {missing[:5]}) have no ready worker after "
                                       f"{self.settings.register_timeout_s:.0f}s")
                self.registry_changed.wait(timeout=left)
        raise RuntimeError("stopped")

    def _hosted(self, cid: int) -> bool:
        wid = self.owner.get(cid)
        return wid is not None and self.workers[wid].ready and not self.workers[wid].gone

    def _dispatch(self, kind: str, rnd: int, cids: Sequence[int], model_blob: str,
                  payload: RoundPayload | None = None, payload_blob: str = "") -> Collector:
        """Queue one task per worker holding some of ``cids``; a worker hosting several clients gets one task."""
        by_worker: dict[str, list[int]] = {}
        lost: list[int] = []
        with self.lock:
            for c in cids:
                wid = self.owner.get(c)
                if wid is None or self.workers[wid].gone:
                    lost.append(c)
                else:
                    by_worker.setdefault(wid, []).append(c)
        deadline = time.time() + self.settings.round_deadline_s
        task_of: dict[int, int] = {}
        tasks: list[tuple[WorkerHandle, Task]] = []
        for wid, mine in by_worker.items():
            tid = next(self.task_ids)
            task_of.update({c: tid for c in mine})
            tasks.append((self.workers[wid], Task(kind, tid, rnd, tuple(sorted(mine)), model_blob, payload,
                                                  payload_blob, deadline)))
        for c in lost:
            task_of[c] = 0
        col = Collector(task_of, rnd, kind)
        for c in lost:
            col.fail(c, "no live worker")
        self.collector = col
        for w, task in tasks:
            w.tasks.put(task)
        return col

    def _gather(self, col: Collector) -> dict[int, Any]:
        col.wait(time.monotonic() + self.settings.round_deadline_s, self.stop)
        self.collector = None
        if self.stop.is_set():
            raise RuntimeError("stopped")
        return dict(sorted(col.results.items()))

    def retry_clients(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        """Fresh participants for retry ``attempt`` of round ``rnd``: ``k`` clients hosted by a live worker, in
        the order of a stream derived from (seed, round, attempt), those that failed this round last. Waits
        (event-driven, up to one round deadline) until enough clients for a quorum are hosted, so a worker
        that is reconnecting can rejoin. The stream is deterministic; which clients are live is not (that is
        the fault being handled)."""
        order = [int(c) for c in numpy_rng(self.seed, "retry", rnd, attempt).permutation(len(self.sizes))]
        order = [c for c in order if c not in exclude] + [c for c in order if c in exclude]
        need = max(1, math.ceil(self.settings.quorum * k))
        deadline = time.monotonic() + self.settings.round_deadline_s
        with self.registry_changed:
            while True:
                live = [c for c in order if self._hosted(c)]
                left = deadline - time.monotonic()
                if len(live) >= need or left <= 0 or self.stop.is_set():
                    return sorted(live[:k])
                self.registry_changed.wait(timeout=left)

    def shutdown_workers(self, reason: str, failed: bool) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.tasks.put(Task("shutdown", 0, -1, (), reason=reason, failed=failed))

    def run(self) -> None:
        """The whole run; sets ``finished`` at the end whatever happens (``error`` says why it failed)."""
        try:
            self.engine.run()
        except Exception as e:  # the engine wrote status.json "failed" and released the workers
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.finished.set()
            with self.lock:
                for w in self.workers.values():
                    w.tasks.put(None)


def model_blob(rnd: int) -> str:
    return f"r{rnd}-model"
