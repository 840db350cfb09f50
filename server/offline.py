"""FedEnt offline mode in the cluster: the aggregator asks the estimator service to run Algorithm 1.

Before round 0 (Steps 1-2) the aggregator uploads w(0), starts the job and long-polls it; the service
sends gradient requests to the workers over their Oracle streams (workers only dial out). The finished
trajectory φ2(0..T) becomes the OfflinePhi2Estimator injected into FedEnt, as in the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
from torch import Tensor

from fedent.config import ExperimentConfig
from fedent.meanfield.estimator import OfflinePhi2Estimator
from fedent.strategies.registry import validate_algorithm
from fedentrpc import convert
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc
from server.app import OfflineRunner
from server.security import ClientSecurity, open_channel


def service_offline_runner(address: str, cfg: ExperimentConfig, run_id: str,
                           timeout_s: float = 3600.0, security: ClientSecurity | None = None) -> OfflineRunner:
    opts = validate_algorithm(cfg.algorithm)

    def run(w0: Sequence[Tensor], sizes: Sequence[int], rounds: int) -> OfflinePhi2Estimator:
        with open_channel(address, security or ClientSecurity(insecure=True)) as ch:
            stub = est_grpc.EstimatorStub(ch)
            try:
                ref = stub.PutBlob(iter(convert.encode_tensors({convert.PARAMS_GROUP: list(w0)})), timeout=120,
                                   wait_for_ready=True)
                req = convert.start_offline_request(
                    run_id, ref.blob_id, sizes, rounds, opts.beta, opts.gamma, opts.variant, opts.eps1, opts.eps2,
                    opts.max_sweeps, cfg.train.seed, opts.probe_batch_size or cfg.train.batch_size)
                job = stub.StartOffline(req, timeout=60)
                deadline = time.monotonic() + timeout_s
                while job.state not in ("done", "failed"):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"offline estimation did not finish within {timeout_s:.0f}s")
                    job = stub.GetOffline(est_pb.GetOfflineRequest(job_id=job.job_id, wait_s=30.0), timeout=60)
            except grpc.RpcError as e:
                raise RuntimeError(f"estimator service at {address}: {e.code().name}: {e.details()}") from None
            return convert.offline_estimator_from_job(job)

    return run
