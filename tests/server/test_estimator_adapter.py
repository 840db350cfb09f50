"""server.estimator_adapter: FedEnt's per-round SolveOnline survives an estimator that drops the call."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from estimator.solve_round import solve_online_reply
from fedent.meanfield.estimator import OnlinePhi2Estimator
from fedent.strategies.options import FedEntOptions
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc
from server.estimator_adapter import EstimatorUnavailable, RemotePhi2Estimator

SCALARS = (0.5, [0.5, 0.5], [1.0, 2.0], [0.1, 0.2])


class Flaky(est_grpc.EstimatorServiceServicer):
    """UNAVAILABLE for the first ``drops`` calls (what a call in flight sees when the service is killed)."""

    def __init__(self, drops: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.drops, self.code, self.calls = drops, code, 0

    def SolveOnline(self, request: est_pb.SolveOnlineRequest,
                    context: grpc.ServicerContext) -> est_pb.SolveOnlineResponse:
        self.calls += 1
        if self.calls <= self.drops:
            context.abort(self.code, "connection lost")
        return solve_online_reply(request)


def _serve(servicer: Flaky) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    est_grpc.add_EstimatorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_an_unavailable_estimator_is_asked_again_within_the_timeout() -> None:
    flaky = Flaky(drops=2)
    server, port = _serve(flaky)
    first_reading = FedEntOptions(beta=0.95, eta_max=None, phi2_rate="star")  # OnlinePhi2Estimator(0.95)'s
    remote = RemotePhi2Estimator(f"127.0.0.1:{port}", first_reading, timeout_s=10)
    try:
        got = remote.estimate(0, *SCALARS)
    finally:
        remote.close()
        server.stop(0)
    assert flaky.calls == 3
    assert got.phi2_next == OnlinePhi2Estimator(0.95).estimate(0, *SCALARS).phi2_next


@pytest.mark.parametrize(("drops", "code", "timeout_s"), [
    (10**6, grpc.StatusCode.UNAVAILABLE, 0.5),  # down for good: gives up at the timeout
    (1, grpc.StatusCode.INVALID_ARGUMENT, 10.0),  # a refusal is not retried
])
def test_it_gives_up_with_one_line(drops: int, code: grpc.StatusCode, timeout_s: float) -> None:
    server, port = _serve(Flaky(drops, code))
    remote = RemotePhi2Estimator(f"127.0.0.1:{port}", FedEntOptions(beta=0.95), timeout_s=timeout_s)
    try:
        with pytest.raises(EstimatorUnavailable, match=code.name):
            remote.estimate(0, *SCALARS)
    finally:
        remote.close()
        server.stop(0)
