"""The worker: hosts one or more simulated clients and runs their client-side steps for the aggregator.

It only dials out (works behind NAT): Register -> rebuild the partition locally from the config and seed
the aggregator sends (data never leaves the machine) and check its md5 -> Ready -> open the Work stream
and execute each pushed task. With ``--data`` (``data.placement: workers``) each client's data comes from
this machine's files instead: read and checked before dialling, fitted to the run's model after Register,
and its sample counts (label histograms unless ``--no-label-histogram``) reported at Ready.

Per-client state (``ClientState``) lives here across rounds. The global
model is fetched once per round per worker (FetchBlob, cached by blob id), however many of the round's
clients this worker hosts.

Why ~600 lines in one module: the worker is one state machine (register, ready, work stream, oracle
stream, reconnect) over one channel and one client-state store; its parts are methods of that machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch
from torch import Tensor

from client.settings import WorkerSettings
from fedent.client_store import ClientStateStore, ClientStoreError
from fedent.config import ExperimentConfig, config_from_dict
from fedent.data.local import LocalData, LocalDataError, LocalDataSpec, RawLocal, prepare_local, read_local
from fedent.inputs import RunInputs, load_inputs, model_factory, model_input
from fedent.params import Params
from fedent.rounds.evaluation import evaluate_shards, test_shards
from fedent.strategies.base import ClientState, ClientTask, RoundPayload, Strategy
from fedent.strategies.registry import build_strategy
from fedent.trainer import LocalTrainer, resolve_device
from fedentrpc import codec, mappers
from fedentrpc.backoff import backoff_delay
from fedentrpc.options import grpc_options
from fedentrpc.security.flags import ClientSecurity
from fedentrpc.security.tls import open_channel
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc

log = logging.getLogger("fedent.worker")


class WorkerError(RuntimeError):
    """The worker cannot go on (bad registration, partition mismatch, lost aggregator); one-line message."""


class LocalDataRefused(WorkerError):
    """This worker's local data does not fit the run (shape, labels): refused before any data is used."""


class AggregatorLostError(WorkerError):
    """The link to the aggregator broke (UNAVAILABLE, a cut stream, forgotten by missed heartbeats): retryable."""


class RunOverError(WorkerError):
    """The aggregator's run has already ended: nothing to do (a worker started, or restarted, after it)."""


# the FAILED_PRECONDITION detail of an aggregator whose run finished successfully (server.engine, server.finished);
# a failed run says "the run is over (<error>)": the worker then fails too, and restarts with the aggregator
RUN_OVER_PREFIX = "the run is over (finished)"

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN,
                       grpc.StatusCode.RESOURCE_EXHAUSTED})


def parse_client_ids(text: str) -> tuple[int, ...]:
    """``0-9``, ``3,5,7`` or ``0-4,10-14`` -> sorted unique ids; a clear error otherwise."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"bad client id list {text!r}: use e.g. 0-9 or 1,4,7") from None
    if not out or min(out) < 0:
        raise ValueError(f"bad client id list {text!r}: ids must be >= 0 and at least one is needed")
    return tuple(sorted(out))


def config_from_register(msg: pb.RegisterResponse, data_root: str | None) -> ExperimentConfig:
    """The aggregator's resolved config (RegisterResponse.config), with this worker's data root if given."""
    raw = mappers.config_from_struct(msg.config)
    if data_root is not None:
        raw.setdefault("data", {})["root"] = data_root
    return config_from_dict(raw)


class Worker:
    """Connects, registers, and serves tasks until the aggregator says the run is over."""

    def __init__(self, settings: WorkerSettings, inputs: RunInputs | None = None) -> None:
        self.settings = settings
        self._inputs_override = inputs
        self.name = settings.name or f"{socket.gethostname()}-{os.getpid()}-c{settings.client_ids[0]}"
        self.device = resolve_device(settings.device)
        self.security = settings.security or ClientSecurity(insecure=True)
        self.channel = open_channel(settings.aggregator, self.security, grpc_options(keepalive=True))
        self.store: ClientStateStore | None = None
        self.stub = pb_grpc.AggregatorServiceStub(self.channel)
        self.worker_id = ""
        self.transfer = codec.TransferSpec()
        self.states: dict[int, ClientState] = {}
        self._blob_cache: dict[str, codec.Bundle] = {}
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")
        self._stop = threading.Event()
        self.tasks_done = 0
        self.run_id = ""
        self._trainer_lock = threading.Lock()
        self._oracle_outbox: queue.Queue[est_pb.OracleRequest | None] | None = None
        self._loaded: tuple[bytes, str] | None = None  # (config, partition md5) the data was built for
        self.reconnects = 0
        self.md5 = ""
        self.local: LocalData | None = None
        self.raw_local: RawLocal | None = None
        if settings.data is not None:  # read and checked now, before anything is sent (LocalDataError)
            self.raw_local = read_local(LocalDataSpec.parse(settings.data), settings.client_ids)

    # ---- setup ---------------------------------------------------------------------------------
    def connect(self) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=self.settings.connect_timeout_s)
        except grpc.FutureTimeoutError:
            raise WorkerError(f"cannot reach the aggregator at {self.settings.aggregator} "
                              f"within {self.settings.connect_timeout_s:.0f}s") from None

    def register(self) -> None:
        s = self.settings
        reply = self._call(self.stub.Register, pb.RegisterRequest(
            worker_name=self.name, token=s.token, client_ids=list(s.client_ids), device=str(self.device),
            hostname=socket.gethostname(), pid=os.getpid(), version="1"))
        self.worker_id = reply.worker_id
        self.run_id = reply.run_id
        if s.state_dir:
            self.store = ClientStateStore(Path(s.state_dir) / (self.run_id or "run"))
        self.transfer = mappers.transfer_from_msg(reply.transfer)
        self.heartbeat_s = reply.heartbeat_s
        loaded = (reply.config.SerializeToString(deterministic=True), reply.partition_md5)
        if self._loaded == loaded:  # a re-registration: data already here
            self._ready(reply.partition_md5)
            return
        with self._heartbeats_while_loading():
            try:
                self._load(reply)
            except LocalDataRefused as e:  # tell the aggregator at once, so it frees these clients
                self._refuse(str(e))
                raise
        self._ready(self.md5)

    def _refuse(self, message: str) -> None:
        try:
            self.stub.ReportFailure(pb.ReportFailureRequest(worker_id=self.worker_id, task_id=0, round=-1, cid=-1,
                                                            message=message[:500]), timeout=10)
        except grpc.RpcError:
            pass

    @contextlib.contextmanager
    def _heartbeats_while_loading(self) -> Iterator[None]:
        """Heartbeats between Register and Ready: the aggregator expires a registration that stays silent for
        ``heartbeat_misses`` periods, ready or not, and loading a large dataset may take longer than that."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.heartbeat_s):
                try:
                    self.stub.Heartbeat(pb.HeartbeatRequest(worker_id=self.worker_id), timeout=10)
                except grpc.RpcError:
                    continue

        if self.heartbeat_s > 0:
            threading.Thread(target=beat, name="heartbeat-loading", daemon=True).start()
        try:
            yield
        finally:
            done.set()

    def _load(self, reply: pb.RegisterResponse) -> None:
        """This worker's data, model and strategy for the run ``reply`` describes (no RPC)."""
        s = self.settings
        loaded = (reply.config.SerializeToString(deterministic=True), reply.partition_md5)
        try:
            self.cfg = config_from_register(reply, s.data_root)
        except ValueError as e:
            raise WorkerError(f"the aggregator's config is not usable here: {e}") from None
        if self.cfg.data.placement == "workers":
            self._load_local()
        else:
            self._load_central(reply.partition_md5)
        self.strategy: Strategy = build_strategy(self.cfg.algorithm)
        self._loaded = loaded

    def _load_central(self, md5_expected: str) -> None:
        """The whole dataset from --data-root, the partition rebuilt from the config and checked by md5."""
        s = self.settings
        if self.raw_local is not None:
            raise LocalDataRefused("this run reads the dataset centrally (data.placement: central); start the "
                                   "worker without --data (or run with data.placement: workers)")
        self.inputs = self._inputs_override or load_inputs(self.cfg)
        self.md5 = str(self.inputs.partition_info.get("md5", ""))
        if self.md5 != md5_expected:
            raise WorkerError(f"partition md5 {self.md5} differs from the aggregator's {md5_expected}: "
                              "check the dataset files (--data-root) and the package version")
        if max(s.client_ids) >= self.inputs.num_clients:
            raise WorkerError(f"client ids up to {max(s.client_ids)} but the run has {self.inputs.num_clients}")
        data = self.inputs.data
        self.trainer = LocalTrainer(self.inputs.make_model(), data.x_train, data.y_train, self.cfg.train.batch_size,
                                    self.device, self.cfg.train.precision)
        self.indices: dict[int, Tensor] = {
            c: torch.from_numpy(np.array(self.inputs.client_indices[c], dtype=np.int64)) for c in s.client_ids}
        shards = test_shards(int(data.y_test.shape[0]), self.inputs.num_clients, self.cfg.train.seed)
        self.test = (data.x_test, data.y_test, {c: shards[c] for c in s.client_ids})
        self.sources = {c: f"central ({self.inputs.partition_info.get('source', '')})" for c in s.client_ids}

    def _load_local(self) -> None:
        """Each hosted client's data from this machine (--data), checked against the run's model input."""
        s = self.settings
        if self.raw_local is None:
            raise LocalDataRefused("this run keeps each client's data on its worker (data.placement: workers): "
                                   "start the worker with --data DIR (a folder per client) or --data split:PATH")
        if max(s.client_ids) >= self.cfg.data.num_clients:
            raise LocalDataRefused(f"client ids up to {max(s.client_ids)} but the run has {self.cfg.data.num_clients}")
        try:
            num_classes, c, size = model_input(self.cfg)
            self.local = prepare_local(self.raw_local, self.cfg, (c, size, size), num_classes)
        except (LocalDataError, ValueError) as e:
            raise LocalDataRefused(str(e)) from None
        local = self.local
        self.trainer = LocalTrainer(model_factory(self.cfg)(), local.x_train, local.y_train,
                                    self.cfg.train.batch_size, self.device, self.cfg.train.precision)
        self.indices = {cid: torch.from_numpy(ix) for cid, ix in local.train_indices.items()}
        self.test = (local.x_test, local.y_test, dict(local.test_indices))
        self.sources = dict(local.sources)
        self.md5 = ""

    def _ready(self, md5: str) -> None:
        cids = self.settings.client_ids
        hist = self.local is not None and self.settings.label_histogram
        sizes = [mappers.client_info_to_msg(c, int(self.indices[c].numel()),
                                            self.local.label_counts(c) if hist and self.local else [],
                                            self.sources.get(c, ""), len(self.test[2].get(c, ())))
                 for c in cids]
        self._call(self.stub.Ready, pb.ReadyRequest(worker_id=self.worker_id, partition_md5=md5, clients=sizes))
        log.info("worker %s ready: %d clients on %s", self.worker_id, len(cids), self.device)

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.settings.connect_timeout_s)
        except grpc.RpcError as e:
            kind = AggregatorLostError if e.code() in RETRYABLE else WorkerError
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION and (e.details() or "").startswith(RUN_OVER_PREFIX):
                kind = RunOverError
            raise kind(f"{type(request).__name__[:-7] or 'call'} rejected by the aggregator: "
                              f"{e.code().name}: {e.details()}") from None

    def state_of(self, cid: int, rnd: int | None = None) -> ClientState:
        """The client's state entering round ``rnd``: from the store when persisting (a replayed round after
        an aggregator resume gets the state saved before it), else kept in memory."""
        if self.store is not None and rnd is not None:
            saved = self.store.load(cid, before_round=rnd)
            if saved is None:
                return self.strategy.init_client_state(cid, int(self.indices[cid].numel()))
            return ClientState({k: [x.to(self.device) for x in v] for k, v in saved.tensors.items()}, saved.scalars)
        st = self.states.get(cid)
        if st is None:
            st = self.strategy.init_client_state(cid, int(self.indices[cid].numel()))
            self.states[cid] = st
        return st

    # ---- tasks ---------------------------------------------------------------------------------
    def fetch(self, blob_id: str) -> codec.Bundle:
        """A blob from the aggregator, fetched once and cached (the round's model for all hosted clients)."""
        got = self._blob_cache.get(blob_id)
        if got is None:
            stream = self.stub.FetchBlob(pb.AggregatorServiceFetchBlobRequest(blob_id=blob_id,
                                                                              worker_id=self.worker_id))
            got = codec.decode_tensors(stream)
            prefix = blob_id.split("-", 1)[0]  # "r<round>": older rounds' blobs are dropped
            self._blob_cache = {k: v for k, v in self._blob_cache.items() if k.split("-", 1)[0] == prefix}
            self._blob_cache[blob_id] = got
        return got

    def _model(self, blob_id: str) -> Params:
        return [t.to(self.device) for t in self.fetch(blob_id)[codec.PARAMS_GROUP]]

    def _task(self, h: pb.TaskHeader, cid: int) -> ClientTask:
        tr = self.cfg.train  # the run's config: the TaskHeader no longer carries lr, epochs, seed
        return ClientTask(cid=cid, round=h.round, indices=self.indices[cid], lr=tr.lr, epochs=tr.local_epochs,
                          seed=tr.seed)

    def _check_cids(self, h: pb.TaskHeader) -> list[int]:
        cids = [int(c) for c in h.client_ids]
        unknown = [c for c in cids if c not in self.indices]
        if unknown:
            raise WorkerError(f"task {h.task_id} names clients {unknown} this worker does not host")
        return cids

    def do_probe(self, t: pb.ProbeTask) -> None:
        h = t.task
        cids = self._check_cids(h)
        w = self._model(h.model_blob)
        probes = []
        for c in cids:
            try:  # like fit: one client's failure (a damaged state file, ...) is that client's, not the task's
                probes.append(self.strategy.probe(self.trainer, w, self._task(h, c), self.state_of(c, h.round)))
            except Exception as e:
                self._client_failed(h, c, "probe", e)
        if probes:
            self._call(self.stub.SubmitProbes, pb.SubmitProbesRequest(
                worker_id=self.worker_id, task_id=h.task_id, round=h.round,
                probes=[mappers.probe_to_msg(p) for p in probes]))

    def do_evaluate(self, t: pb.EvaluateTask) -> None:
        """Federated evaluation: the global model on each named client's local test split."""
        h = t.task
        cids = self._check_cids(h)
        x, y, shards = self.test
        got = evaluate_shards(self.trainer, x, y, shards, cids, self._model(h.model_blob),
                              self.cfg.train.eval_batch_size)
        self._call(self.stub.SubmitEvaluation, pb.SubmitEvaluationRequest(
            worker_id=self.worker_id, task_id=h.task_id, round=h.round,
            results=[mappers.evaluation_to_msg(r) for r in got.values()]))

    def do_fit(self, t: pb.FitTask) -> list[Future[None]]:
        h = t.task
        cids = self._check_cids(h)
        w = self._model(h.model_blob)
        tensors = self.fetch(t.payload.tensors_blob) if t.payload.tensors_blob else {}
        tensors = {k: [x.to(self.device) for x in v] for k, v in tensors.items()}
        payload: RoundPayload = mappers.payload_from_msg(t.payload, tensors)
        pending = []
        for c in cids:
            try:
                state = self.state_of(c, h.round)
                update = self.strategy.fit(self.trainer, w, payload, self._task(h, c), state)
                if self.store is not None:
                    self.store.save(c, state, h.round)
            except Exception as e:  # one client's failure must not lose the others' updates
                self._client_failed(h, c, "fit", e)
                continue
            update.params = [p.detach().cpu() for p in update.params]
            update.tensors = {k: [x.detach().cpu() for x in v] for k, v in update.tensors.items()}
            meta = mappers.UpdateMeta(self.worker_id, h.task_id, h.round)
            pending.append(self._uploader.submit(self._upload, update, meta))  # overlaps with the next client
        return pending

    def _upload(self, update: Any, meta: mappers.UpdateMeta) -> None:
        parts: Iterator[pb.SubmitUpdateRequest] = mappers.update_to_parts(update, meta, self.transfer)
        try:
            self.stub.SubmitUpdate(parts, timeout=self.settings.connect_timeout_s * 10)
        except grpc.RpcError as e:
            log.warning("update of client %d rejected: %s: %s", update.cid, e.code().name, e.details())

    def _client_failed(self, h: pb.TaskHeader, cid: int, what: str, e: Exception) -> None:
        """Report one client's failure (the aggregator records it in the round's failed_clients); a damaged
        state file is a known condition (one line), anything else gets its traceback."""
        if isinstance(e, ClientStoreError):
            log.error("client %d failed its %s in round %d: %s", cid, what, h.round, e)
        else:
            log.exception("client %d failed its %s in round %d", cid, what, h.round)
        self._report(h, cid, f"{type(e).__name__}: {e}")

    def _report(self, h: pb.TaskHeader, cid: int, message: str) -> None:
        try:
            self.stub.ReportFailure(pb.ReportFailureRequest(worker_id=self.worker_id, task_id=h.task_id,
                                                            round=h.round, cid=cid, message=message[:500]), timeout=10)
        except grpc.RpcError:
            pass

    # ---- Algorithm 1's gradient oracle (FedEnt offline mode) ---------------------------------------
    def wants_oracle(self) -> bool:
        """The strategy needs Algorithm 1's gradient oracle, which this worker serves to the estimator service."""
        return bool(self.settings.estimator) and self.strategy.capabilities.oracle

    def start_oracle(self) -> threading.Thread:
        """Open the Oracle stream to the estimator service (dialling out) and answer its gradient requests."""
        t = threading.Thread(target=self._oracle_loop, name="oracle", daemon=True)
        t.start()
        return t

    def _oracle_loop(self) -> None:
        """Keep an Oracle stream open: a stream the estimator drops (it restarted) is re-opened with full-jitter
        backoff, so a restarted estimator's re-run of Algorithm 1 finds this worker's clients again."""
        rng = random.Random()
        attempt = 0
        channel = open_channel(self.settings.estimator, self.security, grpc_options(keepalive=True))
        try:
            while not self._stop.is_set():
                served = self._oracle_stream(channel)
                attempt = 0 if served else attempt + 1
                delay = backoff_delay(attempt, self.settings.backoff_base_s, self.settings.backoff_cap_s, rng)
                if self._stop.wait(delay):
                    return
        finally:
            channel.close()

    def _oracle_stream(self, channel: grpc.Channel) -> bool:
        """One Oracle stream until it ends; True if it answered at least one request."""
        from fedent.meanfield.oracle import TrainerOracle

        outbox: queue.Queue[est_pb.OracleRequest | None] = queue.Queue()
        old = self._oracle_outbox
        if old is not None:
            old.put(None)
        self._oracle_outbox = outbox
        outbox.put(est_pb.OracleRequest(hello=est_pb.OracleHello(
            worker_id=self.worker_id, run_id=self.run_id, client_ids=list(self.settings.client_ids),
            token=self.settings.token)))

        def outgoing() -> Iterator[est_pb.OracleRequest]:
            while True:
                m = outbox.get()
                if m is None:
                    return
                yield m

        stub = est_grpc.EstimatorServiceStub(channel)
        points: dict[str, Params] = {}
        served = False
        try:
            for resp in stub.Oracle(outgoing(), wait_for_ready=True):  # the estimator's gradient tasks
                req = resp.task
                served = True
                try:
                    if req.point_blob not in points:
                        got = codec.decode_tensors(stub.FetchBlob(est_pb.EstimatorServiceFetchBlobRequest(
                            blob_id=req.point_blob, worker_id=self.worker_id)))
                        points = {req.point_blob: [x.to(self.device) for x in got[codec.PARAMS_GROUP]]}
                    oracle = TrainerOracle(self.trainer, self.indices, req.seed or self.cfg.train.seed,
                                           req.batch_size or None)
                    for cid in mappers.oracle_request_cids(req):
                        with self._trainer_lock:
                            grads = [g.detach().cpu() for g in oracle.gradient(req.t, cid, points[req.point_blob])]
                        for m in mappers.oracle_result_messages(req.request_id, cid, int(self.indices[cid].numel()),
                                                                grads, self.transfer):
                            outbox.put(m)
                except (KeyError, ValueError, grpc.RpcError) as e:
                    for cid in req.client_ids:
                        outbox.put(est_pb.OracleRequest(error=est_pb.OracleError(
                            request_id=req.request_id, cid=cid, message=str(e)[:500])))
        except grpc.RpcError as e:
            if not self._stop.is_set():
                log.warning("oracle stream to %s ended: %s: %s", self.settings.estimator, e.code().name, e.details())
        finally:
            outbox.put(None)
        return served

    # ---- main loop -----------------------------------------------------------------------------
    def _heartbeat_loop(self, session: threading.Event, work: Any) -> None:
        """Heartbeat until ``session`` ends; an aggregator that no longer knows us (it expired us, or it was
        restarted) gets its Work stream cancelled, which sends ``serve`` into a reconnect."""
        while not session.wait(self.heartbeat_s):
            try:
                known = self.stub.Heartbeat(pb.HeartbeatRequest(worker_id=self.worker_id), timeout=10).known
            except grpc.RpcError:
                continue
            if not known:
                log.warning("the aggregator no longer knows worker %s; reconnecting", self.worker_id)
                work.cancel()
                return

    def serve(self) -> bool:
        """Execute pushed tasks until shutdown; True when the run finished cleanly."""
        session = threading.Event()
        work = self.stub.Work(pb.WorkRequest(worker_id=self.worker_id))
        hb = threading.Thread(target=self._heartbeat_loop, args=(session, work), name="heartbeat", daemon=True)
        hb.start()
        try:
            for item in work:
                kind = item.WhichOneof("kind")
                if kind == "shutdown":
                    log.info("aggregator: %s", item.shutdown.reason)
                    return not item.shutdown.failed
                pending: list[Future[None]] = []
                try:
                    with self._trainer_lock:
                        if kind == "probe":
                            self.do_probe(item.probe)
                        elif kind == "fit":
                            pending = self.do_fit(item.fit)
                        elif kind == "evaluate":
                            self.do_evaluate(item.evaluate)
                    for f in pending:
                        f.result()
                    self.tasks_done += 1
                except AggregatorLostError:
                    raise
                except (WorkerError, codec.WireError, ValueError) as e:
                    h = getattr(item, kind).task
                    log.error("task %d failed: %s", h.task_id, e)
                    self._report(h, -1, str(e))
            raise AggregatorLostError("the aggregator closed the work stream")
        except grpc.RpcError as e:
            raise AggregatorLostError(f"lost the aggregator: {e.code().name}: {e.details()}") from None
        finally:
            session.set()

    def reconnect(self, why: str, started: float, rng: random.Random) -> None:
        """Re-register (same name and clients, state store kept) with full-jitter backoff; WorkerError when
        the attempts or the window are used up, or the aggregator refuses us for good."""
        s = self.settings
        for attempt in range(s.reconnect_attempts):
            if time.monotonic() - started > s.reconnect_window_s:
                break
            delay = backoff_delay(attempt, s.backoff_base_s, s.backoff_cap_s, rng)
            log.warning("%s; reconnecting in %.2fs (attempt %d of %d)", why, delay, attempt + 1,
                        s.reconnect_attempts)
            if self._stop.wait(delay):
                raise WorkerError("stopped while reconnecting")
            try:
                self._blob_cache = {}
                self.register()
                self.reconnects += 1
                return
            except AggregatorLostError as e:
                why = str(e)
        raise WorkerError(f"lost the aggregator and could not reconnect: {why}")

    def run(self) -> bool:
        """True when the run ended normally (also when it was over before this worker registered)."""
        try:
            self.connect()
            self.register()
            if self.wants_oracle():
                self.start_oracle()
            rng = random.Random()  # jitter must differ between workers: not seeded from the run
            while True:
                try:
                    return self.serve()
                except AggregatorLostError as e:
                    if self.settings.reconnect_attempts == 0:
                        raise WorkerError(str(e)) from None
                    self.reconnect(str(e), time.monotonic(), rng)
        except RunOverError as e:
            log.info("nothing to do: %s", e)
            return True
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        if self._oracle_outbox is not None:
            self._oracle_outbox.put(None)
        self._uploader.shutdown(wait=True)
        self.channel.close()
