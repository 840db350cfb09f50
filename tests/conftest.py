"""Shared fixtures: a tiny in-memory federated problem (a linear model on 16 features) and its config."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fedent.config import ExperimentConfig, config_from_dict
from fedent.inputs import RunInputs


@dataclass(frozen=True)
class TinyData:
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int = 3


def tiny_inputs(num_clients: int = 4, per_client: int = 12, seed: int = 0) -> RunInputs:
    """Seeded data, an IID split and a deterministic linear model: fast enough for RPC-level tests."""
    g = torch.Generator().manual_seed(seed)
    n = num_clients * per_client
    x = torch.randn(n + 30, 16, generator=g)
    y = torch.randint(0, 3, (n + 30,), generator=g)
    data = TinyData(x[:n], y[:n], x[n:], y[n:])
    idx = [np.arange(c * per_client, (c + 1) * per_client, dtype=np.int64) for c in range(num_clients)]
    md5 = hashlib.md5(b"".join(i.tobytes() for i in idx)).hexdigest()

    def make_model() -> nn.Module:
        m = nn.Linear(16, 3)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        return m

    return RunInputs(data=data, client_indices=tuple(idx), make_model=make_model,
                     partition_info={"md5": md5, "num_clients": num_clients})


def tiny_config(algorithm: str = "fedavg", num_clients: int = 4, rounds: int = 2, **train: Any) -> ExperimentConfig:
    raw = {
        "name": "tiny",
        "data": {"name": "synthetic", "num_clients": num_clients, "partition": "iid"},
        "train": {"rounds": rounds, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "seed": 1,
                  "device": "cpu", **train},
        "algorithm": {"name": algorithm},
    }
    return config_from_dict(raw)


@pytest.fixture
def tiny() -> RunInputs:
    return tiny_inputs()


class FakeWorker:
    """A hand-driven worker over real gRPC: registers, collects pushed work items, answers as a test likes.

    Shared by the RPC and fault tests; it never answers on its own (nor heartbeats), so it can also play a
    silent or hung worker. ``security``: a ``ClientSecurity`` to dial a secured aggregator (TLS, token).
    """

    def __init__(self, port: int, cids: list[int], md5: str, name: str = "fake", sizes: int = 12,
                 token: str = "", security: Any = None) -> None:
        import queue
        import threading

        import grpc

        from fedentrpc.v1 import aggregator_pb2 as pb
        from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

        if security is None:
            self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        else:
            from fedentrpc.security.tls import open_channel

            self.channel = open_channel(f"localhost:{port}", security)
        self.stub = pb_grpc.AggregatorServiceStub(self.channel)
        self.wid = self.stub.Register(pb.RegisterRequest(worker_name=name, client_ids=cids, token=token)).worker_id
        self.stub.Ready(pb.ReadyRequest(worker_id=self.wid, partition_md5=md5,
                                        clients=[pb.ClientInfo(cid=c, num_samples=sizes) for c in cids]))
        self.items: queue.Queue[Any] = queue.Queue()
        self.call = self.stub.Work(pb.WorkRequest(worker_id=self.wid))
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        import grpc

        try:
            for item in self.call:
                self.items.put(item)
        except grpc.RpcError:
            pass

    def next(self, kind: str) -> Any:
        while True:
            item = self.items.get(timeout=20)
            if item.WhichOneof("kind") == kind:
                return getattr(item, kind)

    def model(self, blob: str) -> list[Tensor]:
        from fedentrpc import codec
        from fedentrpc.v1 import aggregator_pb2 as pb

        return codec.decode_tensors(self.stub.FetchBlob(pb.AggregatorServiceFetchBlobRequest(blob_id=blob)))["params"]

    def upload(self, task: Any, cid: int, params: list[Tensor], n: int = 12) -> None:
        from fedent.strategies.base import ClientUpdate
        from fedentrpc import mappers

        u = ClientUpdate(cid=cid, params=params, num_samples=n, train_loss=0.1)
        self.stub.SubmitUpdate(mappers.update_to_parts(u, mappers.UpdateMeta(self.wid, task.task_id, task.round)))


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Aggregator factory over server.app.start_aggregator (bound to port 0); stops every handle on teardown."""
    from server.app import start_aggregator
    from server.settings import AggregatorSettings

    handles: list[Any] = []

    def go(cfg: Any, inputs: RunInputs, security: Any = None, **settings: Any) -> Any:
        s = AggregatorSettings(**{"register_timeout_s": 20.0, "round_deadline_s": 20.0, **settings})
        h = start_aggregator(cfg, s, tmp_path / f"run{len(handles)}", inputs=inputs, security=security)
        handles.append(h)
        return h

    yield go
    for h in handles:
        h.stop(grace_s=0.5)


def run_inthread_workers(h: Any, inputs: RunInputs, groups: list[tuple[int, ...]], timeout_s: float = 60,
                         **settings: Any) -> list[Any]:
    """Worker objects on threads, one per client group, dialling aggregator ``h``; returns when its run ends."""
    import threading

    from client.settings import WorkerSettings
    from client.worker import Worker

    workers = [Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=g, device="cpu",
                                     connect_timeout_s=10, **settings), inputs=inputs) for g in groups]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    assert h.wait(timeout_s), "the run did not finish"
    for t in threads:
        t.join(10)
    return workers


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Kill the worker processes a failed or timed-out test left behind: multiprocessing's exit hook joins them,
    and one hung worker then holds the whole test run open until CI's time is gone (seen on 2026-11-27)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)
