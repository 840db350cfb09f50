"""The cluster's client executor: it dispatches each phase's tasks to the workers and gathers their answers.

The round engine asks it to probe, fit and evaluate; it queues one task per worker holding some of the
clients (``WorkerHandle.tasks``, drained by that worker's Work stream), then waits (event-driven, with the
round deadline) while the servicer hands the answers in through ``submit_*``. What counts as an acceptable
upload is the engine's rule (``RoundEngine.acceptance``), asked here as each upload arrives so the worker
hears INVALID_ARGUMENT for it; who may submit is the registry's one ownership check. Each worker runs the
core's ``ClientHost`` for its clients, the one the simulator runs. No gRPC here.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from fedent.rounds import Gathered, RunError
from fedent.rounds.evaluation import ClientEval
from fedent.rounds.inprocess import central_source
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload, Strategy
from fedentrpc import codec, mappers, model_delta
from fedentrpc.v1.aggregator_pb2 import AggregatorServiceFetchBlobResponse as BlobMessage
from server.downloads import DeltaDownloads
from server.registry import WorkerRegistry
from server.settings import AggregatorSettings
from server.uploads import UploadBook
from server.work import ClusterError, Collector, Task, WorkerHandle

if TYPE_CHECKING:
    from fedent.rounds.engine import RoundEngine


def model_blob(rnd: int) -> str:
    return f"r{rnd}-model"


class OfflineRunner(Protocol):
    """(w(0), client sizes, rounds, owners) -> the estimator to inject into FedEnt (Algorithm 1 on the
    service); ``owners``: client id -> the worker identity bound to it (``WorkerRegistry.bound_identities``),
    so the estimator sends a client's gradient tasks only to that identity's Oracle streams."""

    def __call__(self, w0: Sequence[Tensor], sizes: Sequence[int], rounds: int,
                 owners: Mapping[int, str] | None = None) -> Any: ...


class RemoteExecutor:
    """The ``ClientExecutor`` over the registry's workers; ``submit_*`` are called from RPC threads."""

    engine: RoundEngine

    def __init__(self, registry: WorkerRegistry, settings: AggregatorSettings,
                 offline: OfflineRunner | None = None,
                 rebuild_strategy: Callable[[Any], Strategy] | None = None) -> None:
        self.registry, self.settings = registry, settings
        self.offline, self.rebuild_strategy = offline, rebuild_strategy
        self.blobs: dict[str, codec.EncodedTensors] = {}
        self.blob_lock = threading.Lock()
        self.collector: Collector | None = None
        self.task_ids = itertools.count(1)
        self.uploads = UploadBook()  # partial uploads of cut streams, resumed by the workers
        self.traffic = self._no_traffic()  # this round's payload bytes and downloads (round_diagnostics)
        self.round_model: tuple[int, list[Tensor]] | None = None
        # --download-encoding delta: the recent models a worker's download may be a delta from
        self.deltas = (DeltaDownloads(settings.transfer(), settings.delta_history)
                       if settings.download_encoding == "delta" else None)
        registry.on_gone = self.worker_gone

    def worker_gone(self, w: WorkerHandle, why: str) -> None:
        """A worker left: its clients fail now in the phase waiting on them, not at the deadline."""
        col = self.collector
        if col is not None:
            for c in w.cids:
                col.fail(c, why)

    def wake(self) -> None:
        """Wake the phase waiting on answers (the run is stopping)."""
        col = self.collector
        if col is not None:
            with col.cond:
                col.cond.notify_all()

    # ---- ClientExecutor -------------------------------------------------------------------------------
    def bind(self, engine: RoundEngine) -> None:
        self.engine = engine
        self.registry.bind(engine.clients, engine.stop)
        engine.clients.update(range(len(self.registry.sizes)), state="waiting")
        if not self.registry.local_data:
            engine.clients.update(range(len(self.registry.sizes)), data_source=central_source(engine.partition_info))

    def status_fields(self) -> dict[str, Any]:
        return {"mode": "cluster", "workers": self.registry.live_workers()}

    def start(self) -> None:
        threading.Thread(target=self.registry.watch_heartbeats, name="heartbeats", daemon=True).start()
        self.registry.wait_for_workers()
        if self.registry.local_data:
            self.engine.adopt_client_data(self.registry.sizes, self.registry.reported_partition())

    def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                rounds: int) -> tuple[Strategy, dict[str, Any]]:
        """Algorithm 1 runs on the estimator service (the aggregator has no training data); the strategy is
        rebuilt around the estimator it returns."""
        if self.offline is None or self.rebuild_strategy is None:
            raise RunError(f"{strategy.name} needs Algorithm 1 before round 0, which runs on the estimator "
                           "service: start the aggregator with --estimator HOST:PORT")
        estimator = self.offline(global_params, sizes, rounds, owners=self.registry.bound_identities())
        report = getattr(estimator, "report", None)
        return self.rebuild_strategy(estimator), dict(report) if isinstance(report, dict) else {}

    def resumed(self, first: int | None, error: BaseException | None) -> None:
        """The aggregator is one process (the workers restore their own client state): nothing to agree on."""

    def begin_round(self, rnd: int, global_params: Sequence[Tensor]) -> None:
        """w(t) encoded once for every download of the round; the previous round's blobs are dropped."""
        enc = codec.encode_tensors({codec.PARAMS_GROUP: list(global_params)}, self.settings.transfer(), BlobMessage)
        if self.deltas is not None:
            self.deltas.publish(rnd, model_blob(rnd), global_params)
        with self.blob_lock:
            self.blobs = {model_blob(rnd): enc}
            self.traffic = self._no_traffic()
            self.round_model = (rnd, [p.detach().cpu() for p in global_params])

    def _no_traffic(self) -> dict[str, int]:
        """``bytes_up`` / ``bytes_down``: payload bytes received / served; the downloads started (a resumed one
        is not counted again) whole (``downloads_full``) or as a delta (``downloads_delta``)."""
        return {"bytes_up": 0, "bytes_down": 0, **({"downloads_full": 0, "downloads_delta": 0}
                                                   if self.settings.download_encoding == "delta" else {})}

    def base_of(self, rnd: int) -> list[Tensor]:
        """w(rnd), which an encoded upload of that round is a delta from (``train.upload_encoding``)."""
        with self.blob_lock:
            got = self.round_model
        if got is None or got[0] != rnd:
            raise ClusterError("precondition", f"round {rnd} is not the open round: its encoded update cannot be "
                                               "decoded")
        return got[1]

    def round_diagnostics(self, rnd: int) -> dict[str, Any]:
        """The round's payload bytes on the wire (``transfer``: uploads received, blob bytes served as they were
        sent, a delta download's bytes for a delta), for metrics.jsonl: on a capped link these, not compute, set
        a round's time."""
        with self.blob_lock:
            return {"transfer": dict(self.traffic)}

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
            with self.blob_lock:
                self.blobs[payload_blob] = enc
        with self.registry.lock:
            hosted = [c for c in cids if self.registry.hosted(c)]  # a down or disconnected client keeps showing why
        self.engine.clients.update(hosted, state="training")
        self.engine.clients.write()
        col = self._dispatch("fit", rnd, cids, model_blob(rnd), payload, payload_blob)
        return Gathered(self._gather(col), dict(col.failed))

    def secure_exchange(self, rnd: int, requests: Mapping[int, bytes]) -> Gathered[bytes]:
        """One secure-aggregation step over the work stream: a ``secagg`` task per worker with its clients'
        messages; the answers come back through ``submit_secagg``. The aggregator only routes bytes (the shares
        in them are sealed to their receiving client)."""
        col = self._dispatch("secagg", rnd, sorted(requests), "", secagg=requests)
        return Gathered(self._gather(col), dict(col.failed))

    def submit_secagg(self, worker_id: str, task_id: int, rnd: int, responses: Mapping[int, bytes],
                      identity: str | None = None) -> None:
        self.registry.own(worker_id, list(responses), identity, "SubmitSecAgg")  # before any phase check
        col = self._collector("secagg")
        for cid, data in responses.items():
            col.put(task_id, rnd, int(cid), bytes(data))

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        return self.registry.retry_clients(rnd, attempt, k, exclude)

    def finish(self, ok: bool, reason: str) -> None:
        if not ok or self.settings.stop_workers_when_done:
            self.registry.shutdown_workers(reason, failed=not ok)

    def fetch_blob(self, blob_id: str, worker_id: str = "", identity: str | None = None,
                   start_chunk: int = 0, held: model_delta.HeldRef | None = None) -> codec.EncodedTensors:
        """The stream to serve for ``blob_id``: the blob, or (``--download-encoding delta``, the caller holding a
        kept model) its delta from ``held``; its bytes from ``start_chunk`` on are counted as sent."""
        with self.registry.lock:
            owner = self.registry.workers.get(worker_id)
        if identity is not None and owner is not None and owner.identity != identity:
            # its bytes_down must not be charged to another worker
            raise self.registry.deny("FetchBlob", identity, worker_id, f"registered by {owner.identity or 'another'}")
        with self.blob_lock:
            enc = self.blobs.get(blob_id)
        if enc is None:
            raise ClusterError("not_found", f"no blob {blob_id!r} (it belongs to a finished round)")
        delta = None
        is_model = self.deltas is not None and self.deltas.digest_of(blob_id) is not None  # not a payload blob
        if self.deltas is not None and held is not None:
            delta = self.deltas.serve(blob_id, held, enc.wire_bytes)
            enc = delta or enc
        sent = max(0, enc.wire_bytes - start_chunk * self.settings.chunk_bytes)  # a resumed download: the rest
        with self.blob_lock:
            self.traffic["bytes_down"] += sent
            if is_model and start_chunk == 0:
                self.traffic["downloads_delta" if delta is not None else "downloads_full"] += 1
        if worker_id:
            with self.registry.lock:
                w = self.registry.workers.get(worker_id)
                if w is not None:
                    w.bytes_down += sent
        return enc

    def _collector(self, kind: str) -> Collector:
        col = self.collector
        if col is None or col.kind != kind:
            raise ClusterError("precondition", f"no {kind} phase is open")
        return col

    def submit_probes(self, worker_id: str, task_id: int, rnd: int, probes: Iterable[Probe],
                      identity: str | None = None) -> None:
        """Record every valid probe of the report; the bad ones are excluded and named in one error."""
        probes = list(probes)
        self.registry.own(worker_id, [p.cid for p in probes], identity, "SubmitProbes")  # before any phase check
        col = self._collector("probe")
        bad: dict[int, str] = {}
        for p in probes:  # the engine's acceptance rule, asked early so the worker hears why
            why = self.engine.acceptance.probe_problem(p.cid, p)
            if why is not None:
                col.fail(p.cid, why, task_id, rnd)
                bad[p.cid] = why
            else:
                col.put(task_id, rnd, p.cid, p)
        if bad:
            raise ClusterError("invalid", f"probes of clients {sorted(bad)} rejected and excluded: "
                                          + "; ".join(bad.values()))

    def max_update_bytes(self) -> int:
        """The most an update stream may carry: the parameters plus up to three model-sized tensor groups
        (SCAFFOLD's control variate, FedDyn's state) and framing headroom; anything larger is rejected."""
        return 4 * self.engine.model_bytes + (1 << 20)

    def max_update_tensors(self) -> int:
        """The most tensors an update stream may declare: the model's, in up to eight groups (an encoded upload's
        two code groups and the extra groups of ``max_update_bytes``), and headroom; a header declaring more would
        only make its decode cost more."""
        return 8 * len(self.engine.global_params) + 64

    def refuse_update(self, worker_id: str, task_id: int, rnd: int, cid: int, why: str,
                      identity: str | None = None) -> None:
        """An upload that arrived whole but does not decode to an update: the client's result this round is a
        failure, as for an update the acceptance rule refuses, so the same stream cannot be sent again."""
        self.registry.own(worker_id, [cid], identity, "SubmitUpdate")
        self._collector("fit").fail(cid, why, task_id, rnd)

    def expect_update(self, worker_id: str, task_id: int, rnd: int, cid: int, identity: str | None = None) -> None:
        """An upload stream's header, checked before the stream may touch the upload book: the caller owns the
        client and that client's fit task of this round is open. A header naming another round or task would let
        a peer drop other workers' kept chunks (a later round drops earlier partials) or fill the book."""
        self.registry.own(worker_id, [cid], identity, "SubmitUpdate")
        self._collector("fit").check_open(task_id, rnd, cid)

    def submit_update(self, worker_id: str, task_id: int, rnd: int, update: ClientUpdate, wire_bytes: int,
                      identity: str | None = None) -> None:
        w = self.registry.own(worker_id, [update.cid], identity, "SubmitUpdate")  # before any phase check
        col = self._collector("fit")
        w.bytes_up += wire_bytes
        with self.blob_lock:
            self.traffic["bytes_up"] += wire_bytes
        self.engine.clients.add_bytes(update.cid, wire_bytes)
        why = self.engine.acceptance.update_problem(update.cid, update)  # early: the worker hears why
        if why is not None:
            col.fail(update.cid, why, task_id, rnd)
            raise ClusterError("invalid", f"{why}; excluded from aggregation")
        col.put(task_id, rnd, update.cid, update)

    def report_failure(self, worker_id: str, task_id: int, rnd: int, cid: int, message: str,
                       identity: str | None = None) -> None:
        w = self.registry.own(worker_id, [cid] if cid >= 0 else [], identity, "ReportFailure")  # -1: all its clients
        if cid < 0 and not w.ready:  # refused at start (its local data does not fit the model): free its clients
            self.registry.retire(w, "refused", message)
            self.engine.clients.update(w.cids, data_source=f"refused: {message[:200]}")
            self.engine.clients.write()
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
        self.registry.own(worker_id, [r.cid for r in results], identity, "SubmitEvaluation")
        col = self._collector("evaluate")
        bad: list[str] = []
        for r in results:
            limit = self.registry.reported.get(r.cid, {}).get("num_test_samples") if self.registry.local_data else None
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
        if self.deltas is not None:  # w(t+1): the next round's w(t) is a delta of nothing from it
            self.deltas.publish(rnd, blob, params)
        with self.blob_lock:
            self.blobs[blob] = enc
        reg = self.registry
        with reg.lock:
            cids = [c for c in range(len(reg.sizes)) if reg.hosted(c)
                    and (not reg.local_data or reg.reported.get(c, {}).get("num_test_samples", 0) > 0)]
        col = self._dispatch("evaluate", rnd, cids, blob)
        return Gathered(self._gather(col), dict(col.failed))

    def _dispatch(self, kind: str, rnd: int, cids: Sequence[int], model_blob: str,
                  payload: RoundPayload | None = None, payload_blob: str = "",
                  secagg: Mapping[int, bytes] | None = None) -> Collector:
        """Queue one task per worker holding some of ``cids``; a worker hosting several clients gets one task."""
        by_worker: dict[str, list[int]] = {}
        lost: list[int] = []
        with self.registry.lock:
            for c in cids:
                wid = self.registry.owner.get(c)
                if wid is None or self.registry.workers[wid].gone:
                    lost.append(c)
                else:
                    by_worker.setdefault(wid, []).append(c)
        deadline = time.time() + self.settings.round_deadline_s
        task_of: dict[int, int] = {}
        tasks: list[tuple[WorkerHandle, Task]] = []
        for wid, mine in by_worker.items():
            tid = next(self.task_ids)
            task_of.update({c: tid for c in mine})
            mine_msgs = None if secagg is None else {c: secagg[c] for c in mine}
            tasks.append((self.registry.workers[wid], Task(kind, tid, rnd, tuple(sorted(mine)), model_blob, payload,
                                                  payload_blob, deadline, secagg=mine_msgs)))
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
        col.wait(time.monotonic() + self.settings.round_deadline_s, self.engine.stop)
        self.collector = None
        if self.engine.stop.is_set():
            self.engine.check_stop()  # Stopped (status "stopped") when the aggregator was signalled
            raise RuntimeError("stopped")
        return dict(sorted(col.results.items()))
