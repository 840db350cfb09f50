"""Shared fixtures: a tiny in-memory federated problem (a linear model on 16 features) and its config."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fedent.config import ExperimentConfig, config_from_dict
from fedent.sim.inputs import SimInputs


@dataclass(frozen=True)
class TinyData:
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int = 3


def tiny_inputs(num_clients: int = 4, per_client: int = 12, seed: int = 0) -> SimInputs:
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

    return SimInputs(data=data, client_indices=tuple(idx), make_model=make_model,
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
def tiny() -> SimInputs:
    return tiny_inputs()
