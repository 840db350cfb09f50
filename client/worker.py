"""The worker: hosts one or more simulated clients and runs their client-side steps for the aggregator.

It only dials out (works behind NAT): Register -> rebuild the partition locally from the config and seed
the aggregator sends (data never leaves the machine) and check its md5 -> Ready -> open the Work stream
and execute each pushed task. With ``--data`` (``data.placement: workers``) each client's data comes from
this machine's files instead: read and checked before dialling, fitted to the run's model after Register,
and its sample counts (label histograms unless ``--no-label-histogram``) reported at Ready.

The worker keeps only the link; the client half of every task (task parameters from the run's config,
client state in memory or in ``--state-dir``, probe / fit / evaluate, Algorithm 1's gradients, sequential or
vectorised) is the core's ``ClientHost`` (fedent.rounds.host), the one the simulator runs. The global model
is fetched once per round per worker (FetchBlob, cached by blob id), however many of the round's clients
this worker hosts; under the aggregator's ``--download-encoding delta`` the worker keeps the last model it
downloaded and offers it, so the next one may come as an exact delta from it (fedentrpc.model_delta).

Why ~590 lines in one module: the worker is one state machine (connect with its failure reasons, register,
local or central data, ready, work stream, heartbeats, reconnect) over one channel; its parts are methods of
that machine. The Oracle stream lives in client.oracle_link, the client half in the core.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
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

from client import transfer
from client.oracle_link import OracleLink
from client.settings import WorkerSettings
from fedent.client_store import ClientStateStore
from fedent.config import ExperimentConfig, config_from_dict
from fedent.data.local import LocalData, LocalDataError, LocalDataSpec, RawLocal, prepare_local, read_local
from fedent.inputs import RunInputs, load_inputs, model_factory, model_input
from fedent.params import Params
from fedent.rounds.evaluation import test_shards
from fedent.rounds.host import ClientHost, ClientStates, ClientTraining, TestShards
from fedent.rounds.vectorised import make_host
from fedent.strategies.base import ClientUpdate, RoundPayload, Strategy
from fedent.strategies.registry import build_strategy
from fedent.trainer import LocalTrainer, resolve_device
from fedentrpc import codec, mappers, model_delta
from fedentrpc.backoff import backoff_delay
from fedentrpc.options import grpc_options
from fedentrpc.security.flags import ClientSecurity
from fedentrpc.security.tls import open_channel
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

log = logging.getLogger("fedent.worker")


class WorkerError(RuntimeError):
    """The worker cannot go on (bad registration, partition mismatch, lost aggregator); one-line message."""


class LocalDataRefused(WorkerError):
    """This worker's local data does not fit the run (shape, labels): refused before any data is used."""


class AggregatorLostError(WorkerError):
    """The link to the aggregator broke (UNAVAILABLE, a cut stream, forgotten by missed heartbeats): retryable."""


class StaleTaskError(WorkerError):
    """A task whose round closed while it waited (a link down past the deadline): skipped, not a lost link."""


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


def connect_reason(details: str) -> str:
    """gRPC's connection error, as what a user checks first: the port, the name, or the certificates."""
    low = details.lower()
    if "refused" in low:
        return f"connection refused (is the aggregator running, on that port?) [{details}]"
    if "dns" in low or "resolv" in low or "not known" in low or "no address" in low:
        return f"name not resolved (check the host name) [{details}]"
    if "ssl" in low or "tls" in low or "handshake" in low or "certificate" in low:
        return f"TLS handshake failed (check --tls-ca and the server certificate's names, or --insecure) [{details}]"
    if "deadline" in low or "timed out" in low or "timeout" in low:
        return f"no answer (a firewall, or a wrong address?) [{details}]"
    return details


class Worker:
    """Connects, registers, and serves tasks until the aggregator says the run is over."""

    def __init__(self, settings: WorkerSettings, inputs: RunInputs | None = None) -> None:
        self.settings = settings
        self._inputs_override = inputs
        self.name = settings.name or f"{socket.gethostname()}-{os.getpid()}-c{settings.client_ids[0]}"
        self.device = resolve_device(settings.device)
        self.security = settings.security or ClientSecurity(insecure=True)
        self.channel = open_channel(settings.aggregator, self.security, grpc_options(keepalive=True))
        self.states = ClientStates(device=self.device)
        self.host: ClientHost | None = None
        self.stub = pb_grpc.AggregatorServiceStub(self.channel)
        self.worker_id = ""
        self.transfer = codec.TransferSpec()
        self._blob_cache: dict[str, codec.Bundle] = {}
        self.download_delta = False  # the aggregator's --download-encoding is delta: keep the last model as a base
        self.held: model_delta.Held | None = None  # the last model downloaded (the base a delta is rebuilt on)
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload")
        self.stopping = threading.Event()
        self.tasks_done = 0
        self.run_id = ""
        self.oracle: OracleLink | None = None
        self._loaded: tuple[bytes, str] | None = None  # (config, partition md5) the data was built for
        self.reconnects = 0
        self.md5 = ""
        self.local: LocalData | None = None
        self.raw_local: RawLocal | None = None
        if settings.data is not None:  # read and checked now, before anything is sent (LocalDataError)
            self.raw_local = read_local(LocalDataSpec.parse(settings.data), settings.client_ids)

    # ---- setup ---------------------------------------------------------------------------------
    def connect(self, attempt_s: float = 5.0) -> None:
        """Wait for the aggregator up to ``--connect-timeout``, saying after each failed attempt why it failed
        (refused, name not resolved, TLS), so a wrong address is not a silent minute."""
        s = self.settings
        deadline = time.monotonic() + s.connect_timeout_s
        reason = "no answer"
        for attempt in itertools.count(1):
            left = deadline - time.monotonic()
            try:
                grpc.channel_ready_future(self.channel).result(timeout=max(0.05, min(attempt_s, left)))
                return
            except grpc.FutureTimeoutError:
                reason = self.connect_failure()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            log.warning("connecting to the aggregator at %s: attempt %d failed: %s; trying again for %.0fs more "
                        "(--connect-timeout %.0f)", s.aggregator, attempt, reason, left, s.connect_timeout_s)
        raise WorkerError(f"cannot reach the aggregator at {s.aggregator} within {s.connect_timeout_s:.0f}s "
                          f"(--connect-timeout): {reason}")

    def connect_failure(self) -> str:
        """Why the channel is not ready: one quick call without wait_for_ready, its error classified."""
        try:
            self.stub.Heartbeat(pb.HeartbeatRequest(worker_id=""), timeout=2)
        except grpc.RpcError as e:
            return connect_reason(e.details() or str(e.code()) if isinstance(e, grpc.Call) else str(e))
        return "the aggregator answered"

    def register(self) -> None:
        s = self.settings
        reply = self._call(self.stub.Register, pb.RegisterRequest(
            worker_name=self.name, token=s.token, client_ids=list(s.client_ids), device=str(self.device),
            hostname=socket.gethostname(), pid=os.getpid(), version="1"))
        self.worker_id = reply.worker_id
        if reply.run_id != self.run_id or s.state_dir:  # another run (or a persisted one): its own states
            store = ClientStateStore(Path(s.state_dir) / (reply.run_id or "run")) if s.state_dir else None
            self.states = ClientStates(store, self.device)
            if self.host is not None:
                self.host.states = self.states
        if reply.run_id != self.run_id:
            self.held = None  # another run's model is no base for this one's
        self.run_id = reply.run_id
        self.transfer = mappers.transfer_from_msg(reply.transfer)
        self.download_delta = mappers.download_encoding_from_msg(reply.download_encoding) == "delta"
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
        trainer = LocalTrainer(self.inputs.make_model(), data.x_train, data.y_train, self.cfg.train.batch_size,
                               self.device, self.cfg.train.precision)
        indices: dict[int, Tensor] = {
            c: torch.from_numpy(np.array(self.inputs.client_indices[c], dtype=np.int64)) for c in s.client_ids}
        shards = test_shards(int(data.y_test.shape[0]), self.inputs.num_clients, self.cfg.train.seed)
        self._host(trainer, indices, TestShards(data.x_test, data.y_test, {c: shards[c] for c in s.client_ids}))
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
        trainer = LocalTrainer(model_factory(self.cfg)(), local.x_train, local.y_train,
                               self.cfg.train.batch_size, self.device, self.cfg.train.precision)
        self._host(trainer, {cid: torch.from_numpy(ix) for cid, ix in local.train_indices.items()},
                   TestShards(local.x_test, local.y_test, dict(local.test_indices)))
        self.sources = dict(local.sources)
        self.md5 = ""

    def _host(self, trainer: LocalTrainer, indices: dict[int, Tensor], test: TestShards) -> None:
        """The core's client half for this worker's clients, of the kind ``--executor`` names."""
        s = self.settings
        self.host = make_host(s.executor, trainer, indices, ClientTraining.from_config(self.cfg), self.states, test,
                              max_parallel=s.max_parallel_clients, conv=self.cfg.train.conv)
        log.info("worker clients train on %s with the %s executor", self.device, self.host.kind)

    @property
    def indices(self) -> dict[int, Tensor]:
        return self.host.indices if self.host is not None else {}

    def _ready(self, md5: str) -> None:
        cids = self.settings.client_ids
        hist = self.local is not None and self.settings.label_histogram
        shards = self.host.test.shards if self.host is not None and self.host.test is not None else {}
        sizes = [mappers.client_info_to_msg(c, self.host.reported_samples(c) if self.host else 0,
                                            self.local.label_counts(c) if hist and self.local else [],
                                            self.sources.get(c, ""), len(shards.get(c, ())))
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

    # ---- tasks ---------------------------------------------------------------------------------
    def fetch(self, blob_id: str, model: bool = False) -> codec.Bundle:
        """A blob from the aggregator, fetched once and cached (the round's model for all hosted clients).
        ``model``: a global model blob, which may come as a delta from the held model (``download_model``)."""
        got = self._blob_cache.get(blob_id)
        if got is None:
            try:
                got = self.download_model(blob_id) if model else self._download(blob_id).bundle
            except transfer.TransferError as e:
                raise AggregatorLostError(str(e)) from None
            except grpc.RpcError as e:  # a task that waited out a partition: its round is over, the link is fine
                if e.code() == grpc.StatusCode.NOT_FOUND and "finished round" in (e.details() or ""):
                    raise StaleTaskError(e.details() or "") from None
                raise
            prefix = blob_id.split("-", 1)[0]  # "r<round>": older rounds' blobs are dropped
            self._blob_cache = {k: v for k, v in self._blob_cache.items() if k.split("-", 1)[0] == prefix}
            self._blob_cache[blob_id] = got
        return got

    def _download(self, blob_id: str, held: model_delta.HeldRef | None = None) -> transfer.Fetched:
        return transfer.fetch(self.stub, blob_id, self.worker_id, self.settings.stall_timeout_s,
                              self.settings.connect_timeout_s * 10, held=held)

    def download_model(self, blob_id: str) -> codec.Bundle:
        """A global model. Under ``--download-encoding delta`` the worker offers the model it holds; a delta
        answer is rebuilt on it (bit-identical to the blob's own download, its digest checked against the
        aggregator's), and one that does not rebuild is fetched again whole. The model is then the next base."""
        base = self.held if self.download_delta else None
        got = self._download(blob_id, base.ref if base is not None else None)
        bundle = got.bundle
        if got.delta is not None:
            assert base is not None  # transfer.fetch refuses a delta that was not asked for
            try:
                bundle = {codec.PARAMS_GROUP: base.rebuild(got.delta, got.bundle.get(model_delta.DELTA_GROUP, []))}
            except model_delta.DeltaError as e:
                log.warning("the delta download of %s did not rebuild the model (%s): fetching it whole", blob_id, e)
                self.held = None
                bundle = self._download(blob_id).bundle
        if self.download_delta:
            self.held = model_delta.Held.of(blob_id, bundle[codec.PARAMS_GROUP], self.transfer.wire_dtype)
        return bundle

    def _model(self, blob_id: str) -> Params:
        return [t.to(self.device) for t in self.fetch(blob_id, model=True)[codec.PARAMS_GROUP]]

    def _check_cids(self, h: pb.TaskHeader) -> tuple[ClientHost, list[int]]:
        cids = [int(c) for c in h.client_ids]
        unknown = [c for c in cids if c not in self.indices]
        if self.host is None or unknown:
            raise WorkerError(f"task {h.task_id} names clients {unknown} this worker does not host")
        return self.host, cids

    def _failures(self, h: pb.TaskHeader, failed: dict[int, str]) -> None:
        """Each client the host could not serve, reported (the aggregator records it in failed_clients)."""
        for c, why in sorted(failed.items()):
            self._report(h, c, why)

    def do_probe(self, t: pb.ProbeTask) -> None:
        h = t.task
        host, cids = self._check_cids(h)
        got = host.probe(h.round, cids, self._model(h.model_blob), self.strategy)
        self._failures(h, got.failed)
        if got.results:
            self._call(self.stub.SubmitProbes, pb.SubmitProbesRequest(
                worker_id=self.worker_id, task_id=h.task_id, round=h.round,
                probes=[mappers.probe_to_msg(p) for p in got.results.values()]))

    def do_evaluate(self, t: pb.EvaluateTask) -> None:
        """Federated evaluation: the global model on each named client's local test split."""
        h = t.task
        host, cids = self._check_cids(h)
        got = host.evaluate(cids, self._model(h.model_blob), self.cfg.train.eval_batch_size)
        self._call(self.stub.SubmitEvaluation, pb.SubmitEvaluationRequest(
            worker_id=self.worker_id, task_id=h.task_id, round=h.round,
            results=[mappers.evaluation_to_msg(r) for r in got.results.values()]))

    def do_secagg(self, t: pb.SecAggTask) -> None:
        """Secure aggregation: the named clients answer their protocol messages (the host's sessions; their
        fits then upload masked vectors)."""
        h = t.task
        host, cids = self._check_cids(h)
        got = host.secure_exchange(h.round, {int(c): bytes(m) for c, m in t.requests.items() if int(c) in cids})
        self._failures(h, got.failed)
        if got.results:
            self._call(self.stub.SubmitSecAgg, pb.SubmitSecAggRequest(
                worker_id=self.worker_id, task_id=h.task_id, round=h.round, responses=got.results))

    def do_fit(self, t: pb.FitTask) -> list[Future[None]]:
        """The host fits the named clients; each update is uploaded as it is made (overlapping the next
        client's training, or the next chunk's under the vectorised host)."""
        h = t.task
        host, cids = self._check_cids(h)
        w = self._model(h.model_blob)
        tensors = self.fetch(t.payload.tensors_blob) if t.payload.tensors_blob else {}
        tensors = {k: [x.to(self.device) for x in v] for k, v in tensors.items()}
        payload: RoundPayload = mappers.payload_from_msg(t.payload, tensors)
        pending: list[Future[None]] = []

        def upload(update: ClientUpdate) -> None:
            update.params = [p.detach().cpu() for p in update.params]
            update.tensors = {k: [x.detach().cpu() for x in v] for k, v in update.tensors.items()}
            meta = mappers.UpdateMeta(self.worker_id, h.task_id, h.round)
            pending.append(self._uploader.submit(self._upload, update, meta))

        host.on_update = upload
        try:
            got = host.fit(h.round, cids, w, self.strategy, payload)
        finally:
            host.on_update = None
        self._failures(h, got.failed)
        return pending

    def _upload(self, update: Any, meta: mappers.UpdateMeta) -> None:
        s = self.settings
        try:  # a cut stream resumes from the aggregator's chunk count (client.transfer)
            transfer.upload(self.stub, update, meta, self.transfer, s.stall_timeout_s, s.connect_timeout_s * 10)
        except grpc.RpcError as e:
            log.warning("update of client %d rejected: %s: %s", update.cid, e.code().name, e.details())
        except transfer.TransferError as e:
            log.warning("update of client %d lost: %s", update.cid, e)

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
        self.oracle = OracleLink(self)
        t = threading.Thread(target=self.oracle.loop, name="oracle", daemon=True)
        t.start()
        return t

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
                late = time.time() - getattr(item, kind).task.deadline_unix
                if getattr(item, kind).task.deadline_unix and late > 0:  # e.g. held up by a partition
                    log.warning("task %d (round %d) arrived %.1fs after its deadline: skipped",
                                getattr(item, kind).task.task_id, getattr(item, kind).task.round, late)
                    continue
                try:
                    if kind == "probe":
                        self.do_probe(item.probe)
                    elif kind == "fit":
                        pending = self.do_fit(item.fit)
                    elif kind == "evaluate":
                        self.do_evaluate(item.evaluate)
                    elif kind == "secagg":
                        self.do_secagg(item.secagg)
                    for f in pending:
                        f.result()
                    self.tasks_done += 1
                except AggregatorLostError:
                    raise
                except StaleTaskError as e:
                    log.warning("task %d skipped: %s", getattr(item, kind).task.task_id, e)
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
            if self.stopping.wait(delay):
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
        self.stopping.set()
        if self.oracle is not None:
            self.oracle.close()
        self._uploader.shutdown(wait=True)
        self.channel.close()
