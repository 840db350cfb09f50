"""A finished run served read-only: server.finished directly, and ``python -m server --keep-serving``."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import pytest
from finished_runs import make_finished_run
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from server.finished import RUN_OVER, finished_run, serve_finished
from server.healthcheck import check

ROOT = Path(__file__).resolve().parents[2]


make_run = make_finished_run


def snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("phase", "model", "finished"), [("done", True, True), ("done", False, False),
                                                          ("failed", True, False), ("training", True, False)])
def test_only_a_successful_run_counts_as_finished(tmp_path: Path, phase: str, model: bool, finished: bool) -> None:
    make_run(tmp_path / "run", phase, model)
    assert (finished_run(tmp_path / "run") is not None) == finished
    assert finished_run(tmp_path / "nothing-here") is None


def test_serves_health_and_the_dashboard_refuses_workers_and_writes_nothing(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    before = snapshot(run)
    h = serve_finished(run, "127.0.0.1", 0, dashboard=True)
    try:
        assert check(f"127.0.0.1:{h.port}")[0]
        with grpc.insecure_channel(f"127.0.0.1:{h.port}") as ch:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.AggregatorServiceStub(ch).Register(pb.RegisterRequest(worker_name="w", client_ids=[0]),
                                                           timeout=5)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and e.value.details() == RUN_OVER
        assert h.dashboard_url
        status = httpx.get(f"{h.dashboard_url}/api/status", timeout=10).json()
        assert status["phase"] == "done"
    finally:
        h.stop()
    assert snapshot(run) == before


def test_keep_serving_on_a_finished_run_is_read_only_until_sigterm(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    before = snapshot(run)
    port_file = tmp_path / "port"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "server", "--config", str(ROOT / "configs" / "demo.yaml"),
                             "--out", str(run), "--port", "0", "--port-file", str(port_file), "--insecure",
                             "--keep-serving"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, "the aggregator exited on a finished run"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert check(f"127.0.0.1:{int(port_file.read_text())}")[0]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0
    assert "serving it read-only" in out
    assert snapshot(run) == before


def _first(watch: grpc.Call) -> str:
    """The first thing a health Watch stream says: its status, or the code it was refused with."""
    try:
        return health_pb2.HealthCheckResponse.ServingStatus.Name(next(watch).status)  # type: ignore[call-overload]
    except grpc.RpcError as e:
        return str(e.code().name)


def test_health_and_refusals_answer_with_sixty_open_watch_streams(tmp_path: Path) -> None:
    """Issue 25: the read-only server (4 threads) stopped answering health checks with 8 open streams."""
    h = serve_finished(make_run(tmp_path / "run"), "127.0.0.1", 0)
    addr = f"127.0.0.1:{h.port}"
    try:
        with grpc.insecure_channel(addr) as ch:
            watches = [health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=60)
                       for _ in range(60)]
            with futures.ThreadPoolExecutor(max_workers=16) as pool:
                first = collections.Counter(pool.map(_first, watches, timeout=30))
            assert first == {"SERVING": 8, "RESOURCE_EXHAUSTED": 52}  # the default open-stream cap
            assert check(addr, timeout_s=3.0) == (True, f"{addr}: SERVING")
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.AggregatorServiceStub(ch).Register(pb.RegisterRequest(worker_name="w", client_ids=[0]),
                                                           timeout=5)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and e.value.details() == RUN_OVER
            for w in watches:
                w.cancel()
    finally:
        h.stop()
