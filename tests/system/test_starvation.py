"""Issue 25, "Stalling": one peer, or many streams without credentials, must not starve the others.

A real aggregator process (``python -m server``, worker tokens, port 0) receives hundreds of idle streams:
stalled SubmitUpdate streams from credentialed workers (40 each from 9 identities: more than the 128
threads of its pool together, which is what starved the old server), health Watch streams without a token,
and SubmitUpdate calls without credentials. An honest worker's Register and a health check must still
succeed within their normal timeouts, every stalled stream must be cut by the server's idle limit (or
refused by a stream limit) instead of holding its thread for ever, and the service must keep running.
The read-only ``--keep-serving`` server's counterpart is in tests/server/test_finished.py.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from procs import Procs, port_of, stop_all
from procs import aggregator as _aggregator

from fedentrpc.security.interceptors import MetadataClientInterceptor, bearer_metadata
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from server.healthcheck import check

pytestmark = pytest.mark.timeout(180)
CONFIG = """\
name: starvation
data: {name: synthetic, num_clients: 4, partition: iid, synthetic_train: 40, synthetic_test: 20}
model: {name: mnist-cnn}
train: {rounds: 1, fraction: 1.0, local_epochs: 1, batch_size: 10, lr: 0.05, seed: 3, device: cpu}
algorithm: {name: fedavg}
"""
HOGS, PER_HOG, WATCHERS, STRANGERS = 9, 40, 300, 100
IDLE_S, OPEN_MAX_S = 3.0, 4.0


@pytest.fixture
def procs() -> Iterator[Procs]:
    started: Procs = []
    yield started
    stop_all(started)


def _channel(port: int, token: str | None) -> grpc.Channel:
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    return grpc.intercept_channel(ch, MetadataClientInterceptor(bearer_metadata(token))) if token else ch


def _codes(calls: list[grpc.Future], timeout_s: float) -> collections.Counter[str]:
    """How each call ended (each must end within ``timeout_s``: a stream the server never cuts fails here)."""
    out: collections.Counter[str] = collections.Counter()
    for c in calls:
        e = c.exception(timeout=timeout_s)
        out[e.code().name if isinstance(e, grpc.RpcError) else "OK"] += 1
    return out


def _drain(call: grpc.Call) -> str:
    """How a response stream ended, read to its end (a stream's status arrives after its messages)."""
    try:
        for _ in call:  # type: ignore[attr-defined]
            pass
    except grpc.RpcError as e:
        return str(e.code().name)
    return "OK"


def test_hundreds_of_idle_streams_do_not_starve_an_honest_worker(tmp_path: Path, procs: Procs) -> None:
    tokens = {"honest": "tok-honest", **{f"hog-{i}": f"tok-hog-{i}" for i in range(HOGS)}}
    (tmp_path / "tokens.json").write_text(json.dumps({"workers": tokens}))
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    agg = _aggregator(procs, tmp_path / "cfg.yaml", tmp_path / "run", 0, tmp_path / "port", "--token-file",
                      str(tmp_path / "tokens.json"), "--stream-idle", str(IDLE_S), "--open-stream-max",
                      str(OPEN_MAX_S), "--register-timeout", "120", "--heartbeat", "30",
                      log=tmp_path / "aggregator.log")
    port = port_of(tmp_path / "port")
    gate = threading.Event()

    def stalled() -> Iterator[pb.SubmitUpdateRequest]:
        gate.wait(120)  # sends nothing: the server waits for the header
        return
        yield

    channels = [_channel(port, f"tok-hog-{i}") for i in range(HOGS)] + [_channel(port, None)]
    anon = channels[-1]
    try:
        hogs = [pb_grpc.AggregatorServiceStub(ch).SubmitUpdate.future(stalled(), timeout=120)
                for ch in channels[:HOGS] for _ in range(PER_HOG)]
        health = health_pb2_grpc.HealthStub(anon)
        watchers = [health.Watch(health_pb2.HealthCheckRequest(), timeout=120) for _ in range(WATCHERS)]
        strangers = [pb_grpc.AggregatorServiceStub(anon).SubmitUpdate.future(stalled(), timeout=120)
                     for _ in range(STRANGERS)]
        assert _codes(strangers, 30) == {"UNAUTHENTICATED": STRANGERS}

        # the honest worker and the probe, within their normal timeouts, while all of the above are open
        with _channel(port, "tok-honest") as honest:
            reply = pb_grpc.AggregatorServiceStub(honest).Register(
                pb.RegisterRequest(worker_name="honest", client_ids=[0, 1, 2, 3]), timeout=10)
            assert reply.worker_id and reply.heartbeat_s > 0
            assert check(f"127.0.0.1:{port}", timeout_s=3.0) == (True, f"127.0.0.1:{port}: SERVING")

            # every stalled upload ends: refused by a stream limit, or cut by the idle limit (CANCELLED)
            hog_codes = _codes(hogs, 60)
            assert set(hog_codes) == {"RESOURCE_EXHAUSTED", "CANCELLED"}, hog_codes
            assert sum(hog_codes.values()) == HOGS * PER_HOG
            # 16 per identity at most and 124 (128 threads but 4) in all: at least the rest were refused
            assert hog_codes["RESOURCE_EXHAUSTED"] >= HOGS * PER_HOG - 124
            # every watcher ends too: beyond 8 refused, the admitted ones closed at the open-stream limit
            with futures.ThreadPoolExecutor(max_workers=32) as pool:
                watch_codes = collections.Counter(pool.map(_drain, watchers, timeout=60))
            assert set(watch_codes) == {"RESOURCE_EXHAUSTED", "CANCELLED"}, watch_codes
            assert watch_codes["RESOURCE_EXHAUSTED"] >= WATCHERS - 8

            # the service keeps running and serving the honest worker
            assert agg.poll() is None
            stub = pb_grpc.AggregatorServiceStub(honest)
            assert stub.Heartbeat(pb.HeartbeatRequest(worker_id=reply.worker_id), timeout=10).known
            assert check(f"127.0.0.1:{port}", timeout_s=3.0)[0]
        log = (tmp_path / "aggregator.log").read_text()
        assert "cut /fedentrpc.v1.AggregatorService/SubmitUpdate from hog-" in log
        assert "rejected /fedentrpc.v1.AggregatorService/SubmitUpdate from" in log
    finally:
        gate.set()
        for ch in channels:
            ch.close()
