"""The estimator calculator's gRPC service: a thin servicer over fedent.meanfield.

Each method decodes with ``fedentrpc.codec`` (or ``estimator.solve_round``), calls the core, and encodes the
reply. Domain errors become status codes with one-line messages (bad input -> INVALID_ARGUMENT, unknown
blob or job -> NOT_FOUND, bad token -> UNAUTHENTICATED); the service keeps serving after any of them.
The server also offers grpc.health.v1 and server reflection (both open), and the same TLS / mutual TLS /
token authentication as the aggregator (``fedentrpc.security``: the shared gRPC security building blocks).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import grpc
from grpc_health.v1 import health

from estimator.blobs import BlobNotFound, BlobStore
from estimator.hub import ClaimRefused, OracleHub
from estimator.offline_jobs import JobNotFound, OfflineJobs, spec_from_request
from estimator.settings import EstimatorSettings
from estimator.solve_round import solve_online_reply
from fedentrpc import codec
from fedentrpc.health import add_health_and_reflection
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.security.interceptors import caller_identity
from fedentrpc.security.tls import bind
from fedentrpc.serving import create_server, method_name
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc

log = logging.getLogger("fedent.estimator")

SERVICE_NAME = est_pb.DESCRIPTOR.services_by_name["EstimatorService"].full_name
MAX_LONG_POLL_S = 60.0
T = TypeVar("T")


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message.splitlines()[0] if message else code.name)
    raise AssertionError("unreachable")  # context.abort raises


def _guard(context: grpc.ServicerContext, what: str, fn: Callable[[], T]) -> T:
    """Run ``fn``; map domain errors to a status with a one-line message."""
    try:
        return fn()
    except ClaimRefused as e:
        _abort(context, grpc.StatusCode.PERMISSION_DENIED, f"{what}: {e}")
    except (BlobNotFound, JobNotFound) as e:
        _abort(context, grpc.StatusCode.NOT_FOUND, f"{what}: {e}")
    except ValueError as e:  # includes codec.WireError
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {e}")


class EstimatorServicer(est_grpc.EstimatorServiceServicer):
    def __init__(self, settings: EstimatorSettings, blobs: BlobStore, hub: OracleHub, jobs: OfflineJobs) -> None:
        self.settings = settings
        self.blobs = blobs
        self.hub = hub
        self.jobs = jobs

    # ---- online mode ---------------------------------------------------------------------------------
    def SolveOnline(self, request: est_pb.SolveOnlineRequest,
                    context: grpc.ServicerContext) -> est_pb.SolveOnlineResponse:
        return _guard(context, "SolveOnline", lambda: solve_online_reply(request))

    # ---- blobs ---------------------------------------------------------------------------------------
    def PutBlob(self, request_iterator: Iterator[est_pb.PutBlobRequest],
                context: grpc.ServicerContext) -> est_pb.PutBlobResponse:
        def go() -> est_pb.PutBlobResponse:
            asm = codec.TensorAssembler(keep_payload=False)  # the store keeps the chunks, not tensors
            received = []
            for m in request_iterator:
                asm.add(m.chunk)
                received.append(m)  # as received: served again without re-encoding
            raw = asm.verify().raw_bytes  # sizes, every checksum and the shapes, before anything is stored
            enc = codec.EncodedTensors(received, int(raw), asm.wire_bytes)
            return est_pb.PutBlobResponse(blob_id=self.blobs.put(enc, prefix="put"), wire_bytes=asm.wire_bytes)

        return _guard(context, "PutBlob", go)

    def FetchBlob(self, request: est_pb.EstimatorServiceFetchBlobRequest,
                  context: grpc.ServicerContext) -> Iterator[est_pb.EstimatorServiceFetchBlobResponse]:
        enc = _guard(context, "FetchBlob", lambda: self.blobs.get(request.blob_id))
        # Algorithm 1's points are encoded in these messages; an uploaded blob is re-wrapped once, then kept
        yield from enc.as_messages(est_pb.EstimatorServiceFetchBlobResponse)

    # ---- offline mode (Algorithm 1) ------------------------------------------------------------------
    def StartOffline(self, request: est_pb.StartOfflineRequest,
                     context: grpc.ServicerContext) -> est_pb.StartOfflineResponse:
        spec = _guard(context, "StartOffline",
                      lambda: spec_from_request(request, self.blobs, self.settings.wait_workers_s))
        job = self.jobs.start(spec)
        log.info("offline job %s started: run %r, %d clients, T=%d", job.job_id, spec.run_id,
                 len(spec.client_ids), spec.rounds)
        return est_pb.StartOfflineResponse(job=job.to_msg())

    def GetOffline(self, request: est_pb.GetOfflineRequest,
                   context: grpc.ServicerContext) -> est_pb.GetOfflineResponse:
        wait_s = request.wait_s if request.wait_s == request.wait_s else 0.0  # NaN -> no wait
        wait_s = min(max(0.0, wait_s), MAX_LONG_POLL_S)
        if context.time_remaining() is not None:
            wait_s = min(wait_s, max(0.0, context.time_remaining() - 1.0))
        job = _guard(context, "GetOffline", lambda: self.jobs.wait(request.job_id, wait_s))
        return est_pb.GetOfflineResponse(job=job.to_msg())

    def Oracle(self, request_iterator: Iterator[est_pb.OracleRequest],
               context: grpc.ServicerContext) -> Iterator[est_pb.OracleResponse]:
        """A worker's gradient stream (a reverse RPC): the worker's OracleRequests are its hello, then its
        answers; the gradient tasks flow back down the stream as OracleResponses."""
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "hello":
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "Oracle: the first message must be an OracleHello")
        hello = first.hello
        if self.settings.token and hello.token != self.settings.token:
            _abort(context, grpc.StatusCode.UNAUTHENTICATED, "Oracle: bad or missing token")
        conn = _guard(context, "Oracle", lambda: self.hub.attach(hello, caller_identity(context)))
        context.add_callback(lambda: self.hub.detach(conn, "disconnected"))
        reader = threading.Thread(target=self.hub.consume, args=(conn, request_iterator),
                                  name=f"oracle-{conn.worker_id}", daemon=True)
        reader.start()
        while True:
            task = conn.outbox.get()
            if task is None or not context.is_active():
                return
            yield est_pb.OracleResponse(task=task)


@dataclass
class EstimatorHandle:
    """What ``create_estimator_service`` started, for an orderly stop."""

    server: grpc.Server
    port: int
    health: health.HealthServicer
    hub: OracleHub
    jobs: OfflineJobs
    blobs: BlobStore

    def stop(self, grace_s: float = 2.0) -> None:
        self.health.enter_graceful_shutdown()  # probes see NOT_SERVING while streams drain
        self.jobs.shutdown(grace_s)
        self.hub.close_all()
        self.server.stop(grace_s).wait(grace_s + 1)


def create_estimator_service(settings: EstimatorSettings, security: ServerSecurity | None = None) -> EstimatorHandle:
    """A started estimator server on ``settings.host:settings.port`` (0 = a free port) with its parts.

    ``security``: TLS / mutual TLS / caller tokens (fedentrpc.security); None = ``settings.security``
    (plaintext without auth unless set).
    """
    sec = security or settings.security
    blobs = BlobStore(settings.blob_cache_bytes)
    hub = OracleHub()
    jobs = OfflineJobs(hub, blobs, settings.oracle_timeout_s, settings.oracle_retries, settings.oracle_prefetch,
                       settings.run_dir)
    server = create_server(sec, settings.max_workers, settings.stream_limits(),
                           sessions=[method_name(SERVICE_NAME, "Oracle")],
                           held=[method_name(SERVICE_NAME, "GetOffline")], name="est")
    est_grpc.add_EstimatorServiceServicer_to_server(EstimatorServicer(settings, blobs, hub, jobs), server)
    hs = add_health_and_reflection(server, [SERVICE_NAME])
    try:
        port = bind(server, f"{settings.host}:{settings.port}", sec)
    except (ValueError, RuntimeError):
        raise OSError(f"cannot bind the estimator service to {settings.host}:{settings.port}") from None
    server.start()
    return EstimatorHandle(server, port, hs, hub, jobs, blobs)


def create_estimator_server(settings: EstimatorSettings,
                            security: ServerSecurity | None = None) -> tuple[grpc.Server, int]:
    """The started server and its bound port (the handle's other parts stay reachable through it)."""
    h = create_estimator_service(settings, security)
    return h.server, h.port
