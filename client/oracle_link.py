"""A worker's Oracle stream: Algorithm 1's gradient requests from the estimator service (FedEnt offline mode).

The worker dials out to the estimator and keeps one Oracle stream open (re-opened with full-jitter backoff
when the estimator restarts), answering each request with its hosted clients' gradients at the requested
point: ``ClientHost.gradients``, the core's, batched under the vectorised host.
"""

from __future__ import annotations

import logging
import queue
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from fedent.params import Params
from fedentrpc import codec, mappers
from fedentrpc.backoff import backoff_delay
from fedentrpc.options import grpc_options
from fedentrpc.security.tls import open_channel
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc

if TYPE_CHECKING:
    from client.worker import Worker

log = logging.getLogger("fedent.worker")


class OracleLink:
    """The Oracle stream of one worker; ``loop`` runs in its own thread until the worker stops."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.outbox: queue.Queue[est_pb.OracleRequest | None] | None = None

    def close(self) -> None:
        if self.outbox is not None:
            self.outbox.put(None)

    def loop(self) -> None:
        """Keep an Oracle stream open: a stream the estimator drops (it restarted) is re-opened with full-jitter
        backoff, so a restarted estimator's re-run of Algorithm 1 finds this worker's clients again."""
        rng = random.Random()
        attempt = 0
        channel = open_channel(self.worker.settings.estimator, self.worker.security, grpc_options(keepalive=True))
        try:
            while not self.worker.stopping.is_set():
                served = self.stream(channel)
                attempt = 0 if served else attempt + 1
                s = self.worker.settings
                delay = backoff_delay(attempt, s.backoff_base_s, s.backoff_cap_s, rng)
                if self.worker.stopping.wait(delay):
                    return
        finally:
            channel.close()

    def stream(self, channel: grpc.Channel) -> bool:
        """One Oracle stream until it ends; True if it answered at least one request."""
        outbox: queue.Queue[est_pb.OracleRequest | None] = queue.Queue()
        old = self.outbox
        if old is not None:
            old.put(None)
        self.outbox = outbox
        outbox.put(est_pb.OracleRequest(hello=est_pb.OracleHello(
            worker_id=self.worker.worker_id, run_id=self.worker.run_id,
            client_ids=list(self.worker.settings.client_ids), token=self.worker.settings.token)))

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
                            blob_id=req.point_blob, worker_id=self.worker.worker_id)))
                        points = {req.point_blob: [x.to(self.worker.device) for x in got[codec.PARAMS_GROUP]]}
                    host, cids = self.worker.host, mappers.oracle_request_cids(req)
                    if host is None:
                        raise KeyError("this worker has no clients loaded yet")
                    answers = host.gradients(req.t, cids, points[req.point_blob],
                                             req.seed or self.worker.cfg.train.seed, req.batch_size or None)
                    for cid, grads in zip(cids, answers, strict=True):
                        for m in mappers.oracle_result_messages(req.request_id, cid, host.num_samples(cid),
                                                                grads, self.worker.transfer):
                            outbox.put(m)
                except (KeyError, ValueError, grpc.RpcError) as e:
                    for cid in req.client_ids:
                        outbox.put(est_pb.OracleRequest(error=est_pb.OracleError(
                            request_id=req.request_id, cid=cid, message=str(e)[:500])))
        except grpc.RpcError as e:
            if not self.worker.stopping.is_set():
                log.warning("oracle stream to %s ended: %s: %s", self.worker.settings.estimator, e.code().name,
                            e.details())
        finally:
            outbox.put(None)
        return served

