"""FedEnt's φ2 estimator in the cluster: the Phi2Estimator protocol over the estimator service's RPC.

``fedent.strategies`` FedEnt asks its injected estimator once per round (Step 2, online mode:
φ2(t+1) = Σθ_i q_i(η*_i(φ2)) from the participants' scalars). In the simulator that estimator is
in-process; here every call is one SolveOnline RPC, so the aggregator never solves the fixed point itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc

from fedent.meanfield.estimator import Phi2Estimate
from fedent.strategies.options import FedEntOptions
from fedentrpc import mappers
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc

log = logging.getLogger("fedent.aggregator")


class EstimatorUnavailable(RuntimeError):
    """The estimator service did not answer (a one-line message with the address and gRPC status)."""


class RemotePhi2Estimator:
    """Implements ``fedent.meanfield.estimator.Phi2Estimator`` by calling ``EstimatorService.SolveOnline``."""

    def __init__(self, address: str, options: FedEntOptions, run_id: str = "", timeout_s: float = 30.0,
                 channel: grpc.Channel | None = None) -> None:
        """``options``: the run's FedEntOptions, sent whole with each request (the service solves with them)."""
        self.address = address
        self.options = options
        self.run_id = run_id
        self.timeout_s = timeout_s
        self.channel = channel or grpc.insecure_channel(address)
        self.stub = est_grpc.EstimatorServiceStub(self.channel)

    def estimate(
        self, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float], *,
        cids: Sequence[int] | None = None, eta_prev: Sequence[float] | None = None,
    ) -> Phi2Estimate:
        used = self.options.phi2_rate == "used"  # only then does the mean field need η_i(t−1)
        req = mappers.solve_online_request(self.run_id, rnd, self.options, c=c, thetas=thetas, a=a, b=b,
                                           eta_prev=eta_prev if used else None, cids=cids)
        reply = self._solve(req)
        est = mappers.estimate_from_reply(reply)
        est.report.setdefault("mode", "online")
        est.report["service"] = self.address
        return est

    def _solve(self, req: est_pb.SolveOnlineRequest) -> est_pb.SolveOnlineResponse:
        """SolveOnline, tried again while the service is UNAVAILABLE within ``timeout_s``: an estimator killed
        mid-call breaks the connection at once (wait_for_ready only covers a connection not yet up), and one
        restarted on its port answers the same request the same way (the solve is a pure function)."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.05
        while True:
            try:
                return self.stub.SolveOnline(req, timeout=max(0.1, deadline - time.monotonic()), wait_for_ready=True)
            except grpc.RpcError as e:
                left = deadline - time.monotonic()
                if e.code() != grpc.StatusCode.UNAVAILABLE or left <= 0:
                    raise EstimatorUnavailable(
                        f"estimator service at {self.address}: {e.code().name}: {e.details()}") from None
                log.warning("estimator service at %s unavailable (%s); trying again", self.address, e.details())
                time.sleep(min(delay, left))
                delay = min(2 * delay, 1.0)

    def close(self) -> None:
        self.channel.close()
