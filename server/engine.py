"""The aggregator's round engine: worker registry, the round loop, deadlines and quorum (no gRPC here).

It drives the same strategy objects through the same steps as ``fedent.sim`` (docs/architecture.md):
sample with ``fedent.rng.sample_clients``, optional probe, ``round_payload``, fit, ``aggregate`` on the
updates sorted by cid, evaluate, log. The difference is that the client steps run on remote workers:
the engine queues tasks for the workers' Work streams and waits (event-driven, with a deadline) for
their results, which the servicer hands in through ``submit_*``. Domain errors raised here carry the
kind of failure (``ClusterError.code``) so the servicer can map them to gRPC status codes.
"""

from __future__ import annotations

import hmac
import itertools
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedent import runlog
from fedent.config import ExperimentConfig
from fedent.params import Params, all_finite, clone, num_elements
from fedent.rng import numpy_rng, sample_clients
from fedent.sim.inputs import SimInputs
from fedent.sim.simulator import is_eval_round, weighted_train_loss
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload, Strategy, StrategyError
from fedent.trainer import LocalTrainer
from fedentrpc import codec, mappers
from server.durability import resume_run, save_run_checkpoint
from server.settings import AggregatorSettings

RPC_THREADS_SPARE = 4  # server threads kept free for unary calls while every Work stream holds one


class ClusterError(Exception):
    """A rejected request; ``code``: invalid, conflict, unauthenticated, precondition, not_found, exhausted."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class RoundFailedError(RuntimeError):
    """A round missed its quorum on every allowed retry: the run stops (status.json ``failed``)."""


@dataclass(frozen=True)
class Task:
    """One unit of work pushed to a worker: probe or fit ``cids`` at the model blob of ``round``."""

    kind: str  # "probe" | "fit" | "shutdown"
    task_id: int
    round: int
    cids: tuple[int, ...]
    model_blob: str = ""
    payload: RoundPayload | None = None
    payload_blob: str = ""
    deadline_unix: float = 0.0
    reason: str = ""
    failed: bool = False


@dataclass
class WorkerHandle:
    worker_id: str
    name: str
    cids: tuple[int, ...]
    device: str
    hostname: str
    tasks: queue.Queue[Task | None] = field(default_factory=queue.Queue)
    ready: bool = False
    streaming: bool = False
    gone: bool = False
    last_seen: float = field(default_factory=time.time)
    bytes_down: int = 0
    bytes_up: int = 0


class Collector:
    """Results of one phase of one round; wakes the engine when every expected client has answered."""

    def __init__(self, task_ids: dict[int, int], rnd: int, kind: str) -> None:
        self.task_of = dict(task_ids)  # cid -> task id
        self.round = rnd
        self.kind = kind
        self.results: dict[int, Any] = {}
        self.failed: dict[int, str] = {}
        self.cond = threading.Condition()

    def _check(self, task_id: int, rnd: int, cid: int) -> None:
        if rnd != self.round or self.task_of.get(cid) != task_id:
            raise ClusterError("precondition", f"no open {self.kind} task {task_id} for client {cid} in round {rnd}")
        if cid in self.results or cid in self.failed:
            raise ClusterError("conflict", f"client {cid} already reported for round {rnd}")

    def put(self, task_id: int, rnd: int, cid: int, value: Any) -> None:
        with self.cond:
            self._check(task_id, rnd, cid)
            self.results[cid] = value
            self.cond.notify_all()

    def fail(self, cid: int, why: str, task_id: int | None = None, rnd: int | None = None) -> None:
        with self.cond:
            if task_id is not None and rnd is not None:
                self._check(task_id, rnd, cid)
            if cid in self.task_of and cid not in self.results and cid not in self.failed:
                self.failed[cid] = why
                self.cond.notify_all()

    def done(self) -> bool:
        return len(self.results) + len(self.failed) >= len(self.task_of)

    def wait(self, deadline_mono: float, stop: threading.Event) -> None:
        with self.cond:
            while not self.done() and not stop.is_set():
                left = deadline_mono - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(timeout=left)
            for cid in self.task_of:
                if cid not in self.results and cid not in self.failed:
                    self.failed[cid] = "deadline"


@dataclass(frozen=True)
class Registration:
    worker_id: str
    run_id: str
    config_yaml: str
    partition_md5: str
    transfer: codec.TransferSpec
    heartbeat_s: float


class ClusterRun:
    """One federated run on remote workers; ``run()`` is the round loop (call it in a thread)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        settings: AggregatorSettings,
        paths: runlog.RunPaths,
        inputs: SimInputs,
        strategy: Strategy,
        device: torch.device,
        config_yaml: str,
        on_phase: Callable[[str], None] | None = None,
        offline: Callable[[Sequence[Tensor], Sequence[int], int], Any] | None = None,
        rebuild_strategy: Callable[[Any], Strategy] | None = None,
    ) -> None:
        self.cfg, self.settings, self.paths, self.inputs = cfg, settings, paths, inputs
        self.strategy, self.device, self.config_yaml = strategy, device, config_yaml
        self.on_phase = on_phase
        self.offline, self.rebuild_strategy = offline, rebuild_strategy
        self.seed = cfg.train.seed
        self.rounds = cfg.train.rounds
        self.sizes = inputs.client_sizes()
        self.md5 = str(inputs.partition_info.get("md5", ""))
        data = inputs.data
        self.trainer = LocalTrainer(inputs.make_model(), data.x_test[:0], data.y_test[:0],
                                    cfg.train.batch_size, device)
        self.x_test = data.x_test.to(device)
        self.y_test = data.y_test.to(device)
        self.global_params: Params = clone(self.trainer.params)
        self.model_bytes = num_elements(self.global_params) * self.global_params[0].element_size()
        self.workers: dict[str, WorkerHandle] = {}
        self.owner: dict[int, str] = {}  # cid -> worker id
        self.lock = threading.RLock()
        self.registry_changed = threading.Condition(self.lock)
        self.blobs: dict[str, codec.EncodedTensors] = {}
        self.collector: Collector | None = None
        self.task_ids = itertools.count(1)
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.phase = "starting"
        self.round: int | None = None
        self.error: str | None = None
        self.records: list[dict[str, Any]] = []
        self.metrics = runlog.MetricsLog(paths.metrics)
        self.started_at = time.time()
        self.t_start = time.perf_counter()
        self.trajectory: list[dict[str, Any]] = []
        self.estimator_report: dict[str, Any] = {}  # Algorithm 1's report (offline mode), as the simulator's
        self.local_eval = int(getattr(cfg.train, "local_eval", 0) or 0)
        self.clients: list[dict[str, Any]] = [
            runlog.client_row(cid, state="waiting", samples=n, participation=0, bytes=0)
            for cid, n in enumerate(self.sizes)
        ]

    # ---- files ---------------------------------------------------------------------------------
    def status(self, phase: str, rnd: int | None, **state: Any) -> None:
        self.phase, self.round = phase, rnd
        with self.lock:
            workers = sum(1 for w in self.workers.values() if not w.gone)
        runlog.atomic_write_json(self.paths.status, runlog.status_record(
            self.paths.run_id, self.strategy.name, phase, rnd, self.rounds, self.started_at,
            {"device": str(self.device), "mode": "cluster", "workers": workers, **state}))
        if self.on_phase is not None:
            self.on_phase(phase)

    def write_clients(self) -> None:
        with self.lock:
            rows = [dict(r) for r in self.clients]
        runlog.write_clients(self.paths.clients, rows)

    def write_estimator(self) -> None:
        """estimator.json in the simulator's layout: Algorithm 1's report and the per-round φ2 trajectory."""
        runlog.atomic_write_json(self.paths.estimator, {"algorithm": self.strategy.name,
                                                        "report": self.estimator_report,
                                                        "trajectory": self.trajectory})

    def write_start_files(self) -> None:
        runlog.write_config(self.paths.config, self.cfg.to_dict())
        runlog.atomic_write_json(self.paths.partition, self.inputs.partition_info)
        self.write_clients()
        self.status("starting", None)

    # ---- registry (called from RPC threads) ------------------------------------------------------
    def register(self, name: str, token: str, cids: Sequence[int], device: str, hostname: str) -> Registration:
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
                if name and old.name == name and old.cids == wanted:
                    self._retire(old, "disconnected", "worker re-registered")
            taken = [c for c in wanted if c in self.owner and not self.workers[self.owner[c]].gone]
            if taken:
                raise ClusterError("conflict", f"clients {taken[:5]} are already hosted by a live worker")
            wid = f"w-{uuid.uuid4().hex[:10]}"
            self.workers[wid] = WorkerHandle(wid, name or wid, wanted, device, hostname)
            for c in wanted:
                self.owner[c] = wid
                self.clients[c].update(worker=name or wid, device=device, state="registered")
        self.write_clients()
        return Registration(wid, self.paths.run_id, self.config_yaml, self.md5, self.settings.transfer(),
                            self.settings.heartbeat_s)

    def worker(self, worker_id: str) -> WorkerHandle:
        with self.lock:
            w = self.workers.get(worker_id)
        if w is None or w.gone:
            raise ClusterError("not_found", f"unknown worker {worker_id!r}; register first")
        w.last_seen = time.time()
        return w

    def mark_ready(self, worker_id: str, md5: str, sizes: dict[int, int]) -> None:
        w = self.worker(worker_id)
        if md5 != self.md5:
            raise ClusterError("precondition", f"partition md5 {md5} differs from the aggregator's {self.md5}; "
                                               "same data, config and seed are needed")
        for cid in w.cids:
            if sizes.get(cid) != self.sizes[cid]:
                raise ClusterError("precondition", f"client {cid} has {sizes.get(cid)} samples, expected "
                                                   f"{self.sizes[cid]}")
        with self.registry_changed:
            w.ready = True
            for c in w.cids:
                self.clients[c].update(state="idle", last_heartbeat=time.time())
            self.registry_changed.notify_all()
        self.write_clients()

    def attach(self, worker_id: str) -> WorkerHandle:
        w = self.worker(worker_id)
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
                self.clients[c]["state"] = "finished" if self.finished.is_set() or self.phase == "done" \
                    else "disconnected"
        col = self.collector
        if col is not None:
            for c in w.cids:
                col.fail(c, "worker disconnected")
        self.write_clients()

    def _retire(self, w: WorkerHandle, state: str, why: str) -> None:
        """Mark ``w`` gone (clients ``state`` in clients.json), fail its open tasks now and end its Work stream."""
        with self.registry_changed:
            if w.gone:
                return
            w.gone = True
            self.registry_changed.notify_all()
            for c in w.cids:
                self.clients[c]["state"] = state
        col = self.collector
        if col is not None:
            for c in w.cids:
                col.fail(c, why)
        w.tasks.put(None)

    def expire_silent_workers(self, now: float | None = None) -> list[str]:
        """Workers silent for ``heartbeat_misses`` heartbeat periods are dead: their clients go ``down`` and
        the round stops waiting for them (a hung but connected worker never closes its stream)."""
        if self.settings.heartbeat_misses <= 0:
            return []
        limit = self.settings.heartbeat_misses * self.settings.heartbeat_s
        now = time.time() if now is None else now
        with self.lock:
            silent = [w for w in self.workers.values() if not w.gone and w.ready and now - w.last_seen > limit]
        for w in silent:
            self._retire(w, "down", f"missed heartbeats for {now - w.last_seen:.1f}s")
        if silent:
            self.write_clients()
        return [w.worker_id for w in silent]

    def _watch_heartbeats(self) -> None:
        period = max(0.05, min(1.0, self.settings.heartbeat_s / 2))
        while not self.finished.wait(period):
            self.expire_silent_workers()

    def heartbeat(self, worker_id: str) -> bool:
        with self.lock:
            w = self.workers.get(worker_id)
        if w is None or w.gone:
            return False
        w.last_seen = time.time()
        for c in w.cids:
            self.clients[c]["last_heartbeat"] = w.last_seen
        return True

    def fetch_blob(self, blob_id: str, worker_id: str = "") -> codec.EncodedTensors:
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

    def _own(self, worker_id: str, cid: int) -> WorkerHandle:
        w = self.worker(worker_id)
        if cid not in w.cids:
            raise ClusterError("precondition", f"client {cid} is not hosted by worker {worker_id}")
        return w

    def submit_probes(self, worker_id: str, task_id: int, rnd: int, probes: Iterable[Probe]) -> None:
        """Record every valid probe of the report; the bad ones are excluded and named in one error."""
        col = self._collector("probe")
        probes = list(probes)
        for p in probes:
            self._own(worker_id, p.cid)
        bad = []
        for p in probes:
            if all(math.isfinite(v) for v in p.scalars.values()):
                col.put(task_id, rnd, p.cid, p)
            else:
                col.fail(p.cid, "non-finite probe", task_id, rnd)
                bad.append(p.cid)
        if bad:
            raise ClusterError("invalid", f"probes of clients {bad} have non-finite scalars; excluded")

    def max_update_bytes(self) -> int:
        """The most an update stream may carry: the parameters plus up to three model-sized tensor groups
        (SCAFFOLD's control variate, FedDyn's state) and framing headroom; anything larger is rejected."""
        return 4 * self.model_bytes + (1 << 20)

    def submit_update(self, worker_id: str, task_id: int, rnd: int, update: ClientUpdate, wire_bytes: int) -> None:
        col = self._collector("fit")
        w = self._own(worker_id, update.cid)
        w.bytes_up += wire_bytes
        self.clients[update.cid]["bytes"] = (self.clients[update.cid]["bytes"] or 0) + wire_bytes
        try:
            codec.check_shapes(update.params, self.global_params, f"update of client {update.cid}")
            if not all_finite(update.params):
                raise codec.WireError(f"update of client {update.cid} is not finite (NaN/inf)")
            if update.num_samples != self.sizes[update.cid]:
                raise codec.WireError(f"update of client {update.cid} claims {update.num_samples} samples, "
                                        f"expected {self.sizes[update.cid]}")
        except codec.WireError as e:
            col.fail(update.cid, str(e), task_id, rnd)
            raise ClusterError("invalid", f"{e}; excluded from aggregation") from None
        col.put(task_id, rnd, update.cid, update)

    def report_failure(self, worker_id: str, task_id: int, rnd: int, cid: int, message: str) -> None:
        w = self.worker(worker_id)
        col = self.collector
        if col is None or col.round != rnd:
            return
        for c in ([cid] if cid >= 0 else list(w.cids)):
            if c in w.cids:
                col.fail(c, f"worker failure: {message}")

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

    def _quorum(self, got: int, asked: int) -> bool:
        return got >= max(1, math.ceil(self.settings.quorum * asked))

    def setup(self) -> None:
        """Strategy setup; FedEnt offline first runs Algorithm 1 on the estimator service (Steps 1-2)."""
        if self.offline is not None and self.rebuild_strategy is not None:
            self.status("estimating", None)
            estimator = self.offline(self.global_params, self.sizes, self.rounds)
            self.strategy = self.rebuild_strategy(estimator)
            report = getattr(estimator, "report", None)
            self.estimator_report = dict(report) if isinstance(report, dict) else {}
            self.write_estimator()
        self.strategy.setup(self.global_params, self.sizes)

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

    def _attempt(self, rnd: int, participants: list[int], model_blob: str) -> tuple[list[ClientUpdate],
                                                                                     dict[str, Any]]:
        """One try at round ``rnd`` with ``participants``: probe (if the strategy needs it) and fit; returns the
        updates sorted by cid and the skip diagnostics (``skipped`` present when the quorum was missed)."""
        skipped: dict[str, Any] = {}
        fit_cids = list(participants)
        probes: list[Probe] = []
        if self.strategy.needs_probe:
            self.status("estimating", rnd)
            got = self._gather(self._dispatch("probe", rnd, participants, model_blob))
            probes = list(got.values())
            fit_cids = sorted(got)
            if not self._quorum(len(fit_cids), len(participants)):
                skipped = {"skipped": f"{len(fit_cids)}/{len(participants)} probes before the deadline"}
        updates: list[ClientUpdate] = []
        if not skipped:
            payload = self.strategy.round_payload(rnd, self.global_params, probes)
            payload_blob = ""
            if payload.tensors:
                payload_blob = f"r{rnd}-payload"
                with self.lock:
                    self.blobs[payload_blob] = codec.encode_tensors(mappers.payload_bundle(payload),
                                                                      self.settings.transfer())
            self.status("training", rnd)
            with self.lock:
                for c in fit_cids:
                    if self._hosted(c):  # a down or disconnected client keeps showing why
                        self.clients[c]["state"] = "training"
            self.write_clients()
            col = self._dispatch("fit", rnd, fit_cids, model_blob, payload, payload_blob)
            got_updates = self._gather(col)
            updates = list(got_updates.values())  # sorted by cid, as the simulator aggregates
            if not self._quorum(len(updates), len(participants)):
                skipped = {"skipped": f"{len(updates)}/{len(participants)} updates before the deadline"}
            failures = {str(c): why for c, why in sorted(col.failed.items())}
            if failures:
                skipped["failed_clients"] = failures
        return updates, skipped

    def run_round(self, rnd: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        participants = sample_clients(self.seed, rnd, len(self.sizes), self.cfg.train.fraction)
        model_blob = f"r{rnd}-model"
        with self.lock:
            self.blobs = {model_blob: codec.encode_tensors({codec.PARAMS_GROUP: self.global_params},
                                                             self.settings.transfer())}
        failed_before: set[int] = set()
        retries: list[dict[str, Any]] = []
        for attempt in itertools.count():
            updates, skipped = self._attempt(rnd, participants, model_blob)
            if "skipped" not in skipped or self.settings.round_retries < 0:
                break
            failed_before.update(int(c) for c in skipped.get("failed_clients", {}))
            retries.append({"clients": participants, "why": skipped["skipped"]})
            if attempt >= self.settings.round_retries:
                raise RoundFailedError(f"round {rnd} missed its quorum in {attempt + 1} attempt(s), last: "
                                       f"{skipped['skipped']}")
            participants = self.retry_clients(rnd, attempt + 1, len(participants), failed_before)
        if retries:
            skipped["retried"] = retries
        fedent_diag = None
        diagnostics: dict[str, Any] = {}
        if updates and "skipped" not in skipped:
            self.status("aggregating", rnd)
            result = self.strategy.aggregate(rnd, self.global_params, updates)
            if not all_finite(result.params):
                raise RuntimeError(f"the global model is not finite after round {rnd} ({self.strategy.name}); "
                                   "lower train.lr")
            self.global_params = list(result.params)
            diagnostics = dict(result.diagnostics)
            fedent_diag = diagnostics.pop("fedent", None)
        diagnostics.update(skipped)
        test_loss = test_acc = None
        if is_eval_round(rnd, self.rounds, self.cfg.train.eval_every):
            self.status("evaluating", rnd)
            if self.local_eval > 0 and updates:
                diagnostics.update(self._evaluate_local(rnd, updates))
            test_loss, test_acc = self._evaluate(self.global_params)
        now = time.perf_counter()
        rec = runlog.metrics_record(
            round=rnd, algorithm=self.strategy.name, test_acc=test_acc, test_loss=test_loss,
            train_loss=weighted_train_loss(updates) if updates else None, clients=participants,
            num_clients=len(participants), wall_s=now - t0, elapsed_s=now - self.t_start, fedent=fedent_diag,
            diagnostics=diagnostics)
        self.metrics.append(rec)
        self.records.append(rec)
        self._record_clients(rnd, updates)
        if isinstance(fedent_diag, dict):
            self.trajectory.append({"round": rnd, **{k: fedent_diag.get(k) for k in
                                                     ("phi2_pred", "phi2_actual", "entropy", "guards")}})
            self.write_estimator()
        return rec

    def _evaluate(self, params: Sequence[Tensor]) -> tuple[float, float]:
        self.trainer.load(params)
        return self.trainer.evaluate(self.x_test, self.y_test, self.cfg.train.eval_batch_size)

    def _evaluate_local(self, rnd: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        k = min(self.local_eval, len(updates))
        pick = sorted(int(i) for i in numpy_rng(self.seed, "eval", rnd).choice(len(updates), size=k, replace=False))
        accs = [self._evaluate(updates[i].params)[1] for i in pick]
        return {"local_acc": accs, "local_clients": [updates[i].cid for i in pick]}

    def _record_clients(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        taken = {u.cid: u for u in updates}
        with self.lock:
            for row in self.clients:
                u = taken.get(row["cid"])
                if u is None:
                    if row["state"] in ("training", "done"):
                        row["state"] = "idle"
                    continue
                row["state"] = "done"
                row["participation"] += 1
                row["bytes"] = (row["bytes"] or 0) + self.model_bytes
                row["eta"] = u.scalars.get("eta", row["eta"])
                row["eta_star"] = u.scalars.get("eta_star", row["eta_star"])
                row["last_round"] = rnd
        self.write_clients()

    def shutdown_workers(self, reason: str, failed: bool) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.tasks.put(Task("shutdown", 0, -1, (), reason=reason, failed=failed))

    def run(self) -> None:
        """The whole run; sets ``finished`` at the end whatever happens (``error`` says why it failed)."""
        try:
            self.write_start_files()
            threading.Thread(target=self._watch_heartbeats, name="heartbeats", daemon=True).start()
            self.wait_for_workers()
            self.setup()
            first = resume_run(self) if self.settings.checkpoint_keep > 0 else 0
            for rnd in range(first, self.rounds):
                if self.stop.is_set():
                    raise RuntimeError("stopped")
                self.run_round(rnd)
                if self.settings.checkpoint_keep > 0:
                    save_run_checkpoint(self, rnd, keep=self.settings.checkpoint_keep)
            torch.save([p.detach().cpu() for p in self.global_params], self.paths.model)
            last = runlog.final_accuracy(self.records)
            self.status("done", self.rounds - 1, final_acc=last)
            if self.settings.stop_workers_when_done:
                self.shutdown_workers("run finished", failed=False)
        except (Exception, StrategyError) as e:  # noqa: B014 - StrategyError named for the reader
            self.error = f"{type(e).__name__}: {e}"
            try:
                self.status("failed", self.round, error=self.error)
            finally:
                self.shutdown_workers(f"run failed: {self.error}", failed=True)
        finally:
            self.finished.set()
            with self.lock:
                for w in self.workers.values():
                    w.tasks.put(None)
