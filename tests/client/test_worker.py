"""client.worker: a worker that finds the run already finished has nothing to do and ends normally (exit 0,
so `restart: on-failure` leaves it stopped); a run that failed is still an error (it restarts with the
aggregator)."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
import pytest
from finished_runs import make_finished_run

from client.worker import RunOverError, Worker, WorkerError, WorkerSettings
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from server.finished import serve_finished


def _worker(port: int) -> Worker:
    return Worker(WorkerSettings(aggregator=f"127.0.0.1:{port}", client_ids=(0, 1), device="cpu", name="w",
                                 connect_timeout_s=10, reconnect_attempts=0))


def test_a_finished_run_means_nothing_to_do(tmp_path: Path) -> None:
    h = serve_finished(make_finished_run(tmp_path / "run"), "127.0.0.1", 0)
    try:
        assert _worker(h.port).run() is True
    finally:
        h.stop()


class _Failed(pb_grpc.AggregatorServiceServicer):
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the run is over (round 3 missed its quorum); nothing to do")
        raise AssertionError


def test_a_failed_run_is_an_error_not_nothing_to_do() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_AggregatorServiceServicer_to_server(_Failed(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(WorkerError, match="missed its quorum") as e:
            _worker(port).run()
        assert not isinstance(e.value, RunOverError)
    finally:
        server.stop(0)
