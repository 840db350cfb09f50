"""FedEnt offline mode in the cluster: the aggregator asks the estimator service to run Algorithm 1.

Before round 0 (Steps 1-2) the aggregator uploads w(0), starts the job and long-polls it; the service
sends gradient requests to the workers over their Oracle streams (workers only dial out). The finished
trajectory φ2(0..T) becomes the OfflinePhi2Estimator injected into FedEnt, as in the simulator.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence

import grpc
from torch import Tensor

from fedent.config import ExperimentConfig
from fedent.meanfield.estimator import OfflinePhi2Estimator
from fedent.rng import sample_clients
from fedent.strategies.options import FedEntOptions
from fedentrpc import codec, mappers
from fedentrpc.backoff import backoff_delay
from fedentrpc.security.flags import ClientSecurity
from fedentrpc.security.tls import open_channel
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc
from server.app import OfflineRunner

log = logging.getLogger("fedent.aggregator")


# the estimator went away (restarted: its running job is lost with it): start the job again
RESTARTABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.CANCELLED,
                         grpc.StatusCode.DEADLINE_EXCEEDED})


def service_offline_runner(address: str, cfg: ExperimentConfig, run_id: str,
                           timeout_s: float = 3600.0, security: ClientSecurity | None = None,
                           restarts: int = 5, backoff_base_s: float = 0.5,
                           backoff_cap_s: float = 10.0) -> OfflineRunner:
    """``restarts``: how often a job lost with its estimator (UNAVAILABLE, or NOT_FOUND after a restart) is
    started again, after a full-jitter backoff. Algorithm 1 is deterministic given the seed, so a restarted
    job yields the same φ2 trajectory."""
    opts = cfg.algorithm.options_as(FedEntOptions)
    if opts is None:
        raise ValueError(f"the offline estimator is FedEnt's; this run's algorithm is {cfg.algorithm.name}")

    def schedule(n: int, rounds: int) -> list[list[int]] | None:
        """Spec §5 "one θ": every round's sampled clients, the same pure function of (seed, round) as training."""
        if opts.offline_clients != "participants":
            return None
        return [sample_clients(cfg.train.seed, t, n, cfg.train.fraction) for t in range(rounds)]

    def run(w0: Sequence[Tensor], sizes: Sequence[int], rounds: int,
            owners: Mapping[int, str] | None = None) -> OfflinePhi2Estimator:
        rng = random.Random()
        for attempt in range(restarts + 1):
            try:
                return run_once(w0, sizes, rounds, owners)
            except grpc.RpcError as e:
                if e.code() not in RESTARTABLE or attempt == restarts:
                    raise RuntimeError(f"estimator service at {address}: {e.code().name}: {e.details()}") from None
                delay = backoff_delay(attempt, backoff_base_s, backoff_cap_s, rng)
                log.warning("offline job lost (%s: %s); starting it again in %.2fs (restart %d of %d)",
                            e.code().name, e.details(), delay, attempt + 1, restarts)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def run_once(w0: Sequence[Tensor], sizes: Sequence[int], rounds: int,
                 owners: Mapping[int, str] | None) -> OfflinePhi2Estimator:
        with open_channel(address, security or ClientSecurity(insecure=True)) as ch:
            stub = est_grpc.EstimatorServiceStub(ch)
            ref = stub.PutBlob(codec.stream_tensors({codec.PARAMS_GROUP: list(w0)}, est_pb.PutBlobRequest),
                               timeout=120, wait_for_ready=True)
            req = mappers.start_offline_request(
                run_id, opts, init_blob=ref.blob_id, sizes=sizes, rounds=rounds, seed=cfg.train.seed,
                batch_size=cfg.train.batch_size, base_lr=cfg.train.lr, schedule=schedule(len(sizes), rounds),
                owners=owners)
            job = stub.StartOffline(req, timeout=60).job
            deadline = time.monotonic() + timeout_s
            while not mappers.job_finished(job):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"offline estimation did not finish within {timeout_s:.0f}s")
                job = stub.GetOffline(est_pb.GetOfflineRequest(job_id=job.job_id, wait_s=30.0), timeout=60).job
            return mappers.offline_estimator_from_job(job, schedule(len(sizes), rounds))

    return run
