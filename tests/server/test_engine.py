"""The aggregator with worker-local data (``data.placement: workers``) over real gRPC on loopback: it adopts
the sample counts the workers report, refuses reports that cannot be true with a clear status and keeps
serving, frees the clients of a worker refused at start, and runs federated evaluation with in-thread workers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from client.settings import WorkerSettings
from client.worker import Worker
from fedent.config import config_from_dict
from fedent.runlog import read_json, read_metrics
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

CFG = {"data": {"name": "synthetic", "num_clients": 2, "placement": "workers", "synthetic_train": 40,
                "synthetic_test": 10},
       "model": {"name": "lenet5"},
       "train": {"rounds": 2, "fraction": 1.0, "local_epochs": 1, "batch_size": 8, "lr": 0.05, "device": "cpu",
                 "evaluation": "federated"},
       "algorithm": {"name": "fedavg"}}


def _stub(h: Any) -> pb_grpc.AggregatorServiceStub:
    return pb_grpc.AggregatorServiceStub(grpc.insecure_channel(f"127.0.0.1:{h.port}"))


def _register(stub: pb_grpc.AggregatorServiceStub, cids: list[int]) -> str:
    return str(stub.Register(pb.RegisterRequest(worker_name="w", client_ids=cids), timeout=10).worker_id)


def _ready(stub: pb_grpc.AggregatorServiceStub, wid: str, infos: list[pb.ClientInfo]) -> None:
    stub.Ready(pb.ReadyRequest(worker_id=wid, clients=infos), timeout=10)


@pytest.mark.parametrize(("infos", "needle"), [
    ([pb.ClientInfo(cid=0, num_samples=0)], "client 0: 0 samples reported"),
    ([pb.ClientInfo(cid=0, num_samples=5, label_counts=[1, 1] + [0] * 8)], "does not match 5 samples"),
    ([pb.ClientInfo(cid=0, num_samples=5, label_counts=[5])], "over 10 classes"),
    ([pb.ClientInfo(cid=0, num_samples=5), pb.ClientInfo(cid=1, num_samples=5)], "does not host"),
])
def test_impossible_reports_are_refused_and_the_service_keeps_running(start: Any, infos: list[pb.ClientInfo],
                                                                      needle: str) -> None:
    h = start(config_from_dict(CFG), None)
    stub = _stub(h)
    wid = _register(stub, [0])
    with pytest.raises(grpc.RpcError) as e:
        _ready(stub, wid, infos)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in str(e.value.details())
    _ready(stub, wid, [pb.ClientInfo(cid=0, num_samples=5, label_counts=[5] + [0] * 9, data_source="/d/c0")])
    rows = read_json(h.run_dir / "clients.json")["clients"]
    assert (rows[0]["samples"], rows[0]["data_source"], rows[0]["label_counts"][0]) == (5, "/d/c0", 5)
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).clients == 2


def test_a_worker_refused_at_start_frees_its_clients(start: Any) -> None:
    h = start(config_from_dict(CFG), None)
    stub = _stub(h)
    wid = _register(stub, [0, 1])
    stub.ReportFailure(pb.ReportFailureRequest(worker_id=wid, cid=-1, round=-1,
                                               message="client 1: images have shape (8, 8)"), timeout=10)
    rows = read_json(h.run_dir / "clients.json")["clients"]
    assert [r["state"] for r in rows] == ["refused", "refused"] and "images have shape" in rows[1]["data_source"]
    _register(stub, [0, 1])  # the same clients, from a worker with usable data
    with pytest.raises(grpc.RpcError) as e:  # no evaluation phase is open yet
        stub.SubmitEvaluation(pb.SubmitEvaluationRequest(worker_id=wid, task_id=1, round=0), timeout=10)
    assert e.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def test_inthread_workers_on_local_files_with_federated_evaluation(start: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sizes, tests = {0: 12, 1: 20}, {0: 4, 1: 0}  # client 1 has no local test split: it does not count
    for cid, n in sizes.items():
        d = tmp_path / "data" / f"client-{cid}"
        d.mkdir(parents=True)
        np.savez(d / "train.npz", x=rng.random((n, 28, 28)).astype(np.float32), y=rng.integers(0, 10, n))
        if tests[cid]:
            np.savez(d / "test.npz", x=rng.random((tests[cid], 28, 28)).astype(np.float32),
                     y=rng.integers(0, 10, tests[cid]))
    h = start(config_from_dict(CFG), None)
    workers = [Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=(c,), device="cpu",
                                     connect_timeout_s=10, data=str(tmp_path / "data"), label_histogram=c == 0))
               for c in (0, 1)]  # client 1's worker keeps its label histogram to itself
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    assert h.wait(90), "the run did not finish"
    assert h.run.error is None
    part = read_json(h.run_dir / "partition.json")
    assert part["sizes"] == [12, 20] and part["test_sizes"] == [4, 0]
    assert "label_counts" not in part  # not every client sent one: no heatmap rather than a partial one
    rows = read_json(h.run_dir / "clients.json")["clients"]
    assert sum(rows[0]["label_counts"]) == 12 and rows[1]["label_counts"] is None
    rec = read_metrics(h.run_dir / "metrics.jsonl")[-1]
    assert rec["diagnostics"]["evaluation"] == {"mode": "federated", "samples": 4, "clients": 1}
    assert rec["test_acc"] is not None and 0.0 <= rec["test_acc"] <= 1.0


def test_a_worker_with_local_data_is_refused_by_a_central_run_and_vice_versa(start: Any, tmp_path: Path) -> None:
    from client.worker import LocalDataRefused

    d = tmp_path / "data" / "client-0"
    d.mkdir(parents=True)
    np.savez(d / "train.npz", x=np.zeros((4, 28, 28), np.float32), y=np.zeros(4, np.int64))
    central = dict(CFG, data={**CFG["data"], "placement": "central"})  # type: ignore[dict-item]
    for cfg, data, needle in ((central, str(tmp_path / "data"), "start the worker without --data"),
                              (CFG, None, "start the worker with --data")):
        h = start(config_from_dict(cfg), None)
        w = Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=(0,), device="cpu",
                                  connect_timeout_s=10, data=data, reconnect_attempts=0))
        with pytest.raises(LocalDataRefused, match=needle):
            w.run()
        assert read_json(h.run_dir / "clients.json")["clients"][0]["state"] == "refused"
