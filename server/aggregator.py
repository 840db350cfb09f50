"""The aggregator gRPC service: a thin servicer over ``server.engine.ClusterRun``.

Each method decodes its request with ``fedentrpc.mappers``, calls the engine, encodes the reply and maps
domain errors to status codes (invalid -> INVALID_ARGUMENT, precondition -> FAILED_PRECONDITION, ...).
Every call passes the caller's authenticated identity (``caller_identity``; None without authentication)
so the engine lets a worker act only for registrations and clients its credentials own
(permission -> PERMISSION_DENIED).
A bad request never takes the service down: it gets a status with a one-line message.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from fedent.strategies.base import StrategyError
from fedentrpc import codec, mappers
from fedentrpc.health import add_health_and_reflection
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.security.interceptors import caller_identity
from fedentrpc.security.tls import bind
from fedentrpc.serving import create_server, method_name
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from server import uploads
from server.engine import ClusterRun
from server.settings import AggregatorSettings
from server.work import ClusterError, Task

log = logging.getLogger("fedent.aggregator")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AggregatorService"].full_name
CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "conflict": grpc.StatusCode.ALREADY_EXISTS,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "permission": grpc.StatusCode.PERMISSION_DENIED,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "cut": grpc.StatusCode.ABORTED,  # an upload stream that ended early: its chunks are kept, resume it
}
T = TypeVar("T")


def _guard(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
    """Run ``fn``; domain errors become a gRPC status (context.abort raises, so this never returns None)."""
    try:
        return fn()
    except ClusterError as e:
        context.abort(CODES.get(e.code, grpc.StatusCode.INVALID_ARGUMENT), str(e))
    except (codec.WireError, StrategyError) as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    raise AssertionError("unreachable")


def _kept(book: uploads.UploadBook, up: uploads.Upload, h: pb.UpdateHeader, how: str) -> None:
    state = book.state(up.key)
    log.info("upload of client %d (worker %s, round %d) %s after %d chunks (%d bytes); kept to resume", h.cid,
             h.worker_id, h.round, how, state.next_chunk, state.received_bytes)


def task_to_item(task: Task) -> pb.WorkResponse:
    """A task as the pushed message (the rate, epochs and seed are the run config's, which the worker has)."""
    if task.kind == "shutdown":
        return pb.WorkResponse(shutdown=pb.Shutdown(reason=task.reason, failed=task.failed))
    header = pb.TaskHeader(task_id=task.task_id, round=task.round, client_ids=list(task.cids),
                           model_blob=task.model_blob, deadline_unix=task.deadline_unix)
    if task.kind == "probe":
        return pb.WorkResponse(probe=pb.ProbeTask(task=header))
    if task.kind == "evaluate":
        return pb.WorkResponse(evaluate=pb.EvaluateTask(task=header))
    if task.kind == "secagg":
        return pb.WorkResponse(secagg=pb.SecAggTask(task=header, requests=dict(task.secagg or {})))
    assert task.payload is not None
    return pb.WorkResponse(fit=pb.FitTask(task=header, payload=mappers.payload_to_msg(task.payload, task.payload_blob)))


class AggregatorServicer(pb_grpc.AggregatorServiceServicer):
    def __init__(self, run: ClusterRun) -> None:
        self.run = run

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        ident = caller_identity(context)
        reg = _guard(context, lambda: self.run.registry.register(
            request.worker_name, request.token, list(request.client_ids), request.device, request.hostname, ident))
        log.info("worker %s (%s, %s) registered clients %s", ident or request.worker_name, reg.worker_id,
                 request.device,
                 _span(request.client_ids))
        return pb.RegisterResponse(worker_id=reg.worker_id, run_id=reg.run_id,
                                   config=mappers.config_to_struct(reg.worker_config),
                                   partition_md5=reg.partition_md5, transfer=mappers.transfer_to_msg(reg.transfer),
                                   heartbeat_s=reg.heartbeat_s,
                                   download_encoding=mappers.download_encoding_to_msg(reg.download_encoding))

    def Ready(self, request: pb.ReadyRequest, context: grpc.ServicerContext) -> pb.ReadyResponse:
        sizes, details = mappers.client_info_from_msgs(request.clients)
        _guard(context, lambda: self.run.registry.mark_ready(request.worker_id, request.partition_md5, sizes,
                                                  caller_identity(context), details))
        return pb.ReadyResponse()

    def Work(self, request: pb.WorkRequest, context: grpc.ServicerContext) -> Iterator[pb.WorkResponse]:
        w = _guard(context, lambda: self.run.registry.attach(request.worker_id, caller_identity(context)))
        context.add_callback(lambda: w.tasks.put(None))  # wake the generator when the worker hangs up
        try:
            while True:
                task = w.tasks.get()  # blocks: an idle round costs nothing
                if task is None or not context.is_active():
                    return
                yield task_to_item(task)
                if task.kind == "shutdown":
                    return
        finally:
            self.run.registry.detach(w)

    def FetchBlob(self, request: pb.AggregatorServiceFetchBlobRequest,
                  context: grpc.ServicerContext) -> Iterator[pb.AggregatorServiceFetchBlobResponse]:
        enc = _guard(context, lambda: self.run.remote.fetch_blob(request.blob_id, request.worker_id,
                                                                 caller_identity(context), request.start_chunk,
                                                                 mappers.held_from_msg(request)))
        # encoded once per round (a delta once per base), in these; a delta stream's first message says so
        msgs = enc.as_messages(pb.AggregatorServiceFetchBlobResponse)
        yield from msgs[request.start_chunk:]  # a cut download resumes where the worker's copy ends

    def SubmitProbes(self, request: pb.SubmitProbesRequest, context: grpc.ServicerContext) -> pb.SubmitProbesResponse:
        def go() -> None:
            probes = [mappers.probe_from_msg(p) for p in request.probes]
            self.run.remote.submit_probes(request.worker_id, request.task_id, request.round, probes,
                                   caller_identity(context))

        _guard(context, go)
        return pb.SubmitProbesResponse()

    def SubmitUpdate(self, request_iterator: Iterator[pb.SubmitUpdateRequest],
                     context: grpc.ServicerContext) -> pb.SubmitUpdateResponse:
        remote = self.run.remote

        def go() -> None:
            it = iter(request_iterator)
            h = mappers.update_header(next(it, None))
            # before the stream touches the book (checked again at its end): the owner only, since a new stream
            # supersedes the one in progress and replaces its kept chunks; and only for the client's open fit
            # task, since a header naming a later round drops every earlier round's partials
            remote.expect_update(h.worker_id, h.task_id, h.round, h.cid, caller_identity(context))
            # bounded by the decoder: the header's sizes against the model-sized limit before anything is
            # allocated, then every chunk against the header; a cut stream's verified chunks stay in the book
            up = remote.uploads.begin(h, remote.max_update_bytes(), remote.max_update_tensors())
            if up.resumed_at is not None:
                log.info("upload of client %d (worker %s, round %d) resumed at chunk %d, byte offset %d "
                         "(asked from chunk %d)", h.cid, h.worker_id, h.round, up.resumed_at[0], up.resumed_at[1],
                         h.resume_from_chunk)
            try:
                for part in it:
                    up.add(mappers.update_chunk(part))
                bundle, wire_bytes = up.finish()
            except codec.TruncatedStream as e:
                # ended before its last chunk: a stream the worker cancelled (its stall watch) can end so when the
                # cancel races the handler's read, instead of breaking; what arrived was verified: keep it
                _kept(remote.uploads, up, h, "ended early")
                raise ClusterError("cut", f"{e}: the chunks received are kept, resume the upload") from e
            except codec.WireError:
                up.discard()
                raise
            except grpc.RpcError:  # the stream broke: its chunks are kept for a resumed upload
                _kept(remote.uploads, up, h, "cut")
                return
            try:
                dec = mappers.update_from_bundle(h, bundle, wire_bytes, remote.base_of)
            except codec.WireError as e:  # whole and verified, yet no update: the client fails this round
                remote.refuse_update(h.worker_id, h.task_id, h.round, h.cid, f"malformed update: {e}",
                                     caller_identity(context))
                raise
            remote.submit_update(h.worker_id, h.task_id, h.round, dec.update, wire_bytes, caller_identity(context))
            up.accepted()

        _guard(context, go)
        return pb.SubmitUpdateResponse()

    def QueryUpload(self, request: pb.QueryUploadRequest, context: grpc.ServicerContext) -> pb.QueryUploadResponse:
        def go() -> pb.QueryUploadResponse:
            self.run.registry.own(request.worker_id, [request.cid], caller_identity(context), "QueryUpload")
            return self.run.remote.uploads.state(uploads.key_of(request))

        return _guard(context, go)

    def ReportFailure(self, request: pb.ReportFailureRequest,
                      context: grpc.ServicerContext) -> pb.ReportFailureResponse:
        _guard(context, lambda: self.run.remote.report_failure(request.worker_id, request.task_id, request.round,
                                                        request.cid, request.message, caller_identity(context)))
        log.warning("worker %s: task %d client %d failed: %s", request.worker_id, request.task_id, request.cid,
                    request.message)
        return pb.ReportFailureResponse()

    def SubmitEvaluation(self, request: pb.SubmitEvaluationRequest,
                         context: grpc.ServicerContext) -> pb.SubmitEvaluationResponse:
        results = [mappers.evaluation_from_msg(r) for r in request.results]
        _guard(context, lambda: self.run.remote.submit_evaluation(request.worker_id, request.task_id, request.round,
                                                           results, caller_identity(context)))
        return pb.SubmitEvaluationResponse()

    def SubmitSecAgg(self, request: pb.SubmitSecAggRequest, context: grpc.ServicerContext) -> pb.SubmitSecAggResponse:
        _guard(context, lambda: self.run.remote.submit_secagg(request.worker_id, request.task_id, request.round,
                                                       dict(request.responses), caller_identity(context)))
        return pb.SubmitSecAggResponse()

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        known = _guard(context, lambda: self.run.registry.heartbeat(request.worker_id, caller_identity(context)))
        return pb.HeartbeatResponse(known=known)

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.GetStatusResponse:
        r, e = self.run, self.run.engine
        return pb.GetStatusResponse(run_id=r.paths.run_id, algorithm=e.strategy.name,
                                    phase=mappers.phase_to_msg(e.phase), round=-1 if e.round is None else e.round,
                                    rounds=e.rounds, error=r.error or "", workers=r.registry.live_workers(),
                                    clients=len(e.sizes))


def _span(cids: Any) -> str:
    c = sorted(int(x) for x in cids)
    return f"{c[0]}-{c[-1]} ({len(c)})" if len(c) > 3 else str(c)


def create_aggregator_server(settings: AggregatorSettings, run: ClusterRun,
                             security: ServerSecurity | None = None) -> tuple[grpc.Server, int]:
    """A started aggregator server bound to ``settings.host:settings.port`` (0 = free port) and that port.

    ``security``: TLS / mutual TLS / worker tokens (fedentrpc.security); None = plaintext without auth.
    """
    sec = security or ServerSecurity(insecure=True)
    server = create_server(sec, settings.max_workers, settings.stream_limits(),
                           sessions=[method_name(SERVICE_NAME, "Work")], name="agg")
    pb_grpc.add_AggregatorServiceServicer_to_server(AggregatorServicer(run), server)
    add_health_and_reflection(server, [SERVICE_NAME])
    try:
        port = bind(server, f"{settings.host}:{settings.port}", sec)
    except (ValueError, RuntimeError):
        raise OSError(f"cannot bind the aggregator to {settings.host}:{settings.port} (--port): in use, or not an "
                      "address of this machine") from None
    server.start()
    return server, port


def hostname() -> str:
    return os.environ.get("HOSTNAME") or socket.gethostname()
