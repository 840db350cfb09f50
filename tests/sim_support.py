"""Tiny learnable inputs for simulator tests (no dataset files, milliseconds per round)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
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
    num_classes: int
    in_channels: int = 1
    image_size: int = 4
    name: str = "tiny"
    source: str = "tests"


def tiny_inputs(num_clients: int = 10, per_client: int = 40, num_classes: int = 4, seed: int = 0) -> RunInputs:
    """Gaussian class clusters in 16 dims; each client holds two classes (non-IID), a linear MLP learns it."""
    g = torch.Generator().manual_seed(1234)
    protos = torch.randn(num_classes, 16, generator=g) * 1.5

    def draw(n: int) -> tuple[Tensor, Tensor]:
        y = torch.arange(n) % num_classes
        x = protos[y] + torch.randn(n, 16, generator=g)
        return x.view(n, 1, 4, 4), y

    x_train, y_train = draw(num_clients * per_client)
    x_test, y_test = draw(200)
    order = np.argsort(y_train.numpy(), kind="stable")
    shards = np.array_split(order, 2 * num_clients)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(2 * num_clients)
    client_indices = tuple(np.sort(np.concatenate([shards[perm[2 * k]], shards[perm[2 * k + 1]]]))
                           for k in range(num_clients))
    sizes = [int(len(ix)) for ix in client_indices]
    info = {"scheme": "shards", "seed": seed, "num_clients": num_clients, "num_classes": num_classes,
            "md5": "test", "sizes": sizes}

    def make_model() -> nn.Module:
        torch_gen = torch.Generator().manual_seed(seed)
        m = nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, num_classes))
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=torch_gen) * 0.3)
        return m

    data = TinyData(x_train, y_train, x_test, y_test, num_classes)
    return RunInputs(data=data, client_indices=client_indices, make_model=make_model, partition_info=info)


def tiny_config(algorithm: str = "fedavg", rounds: int = 3, **train: object) -> ExperimentConfig:
    tr = {"rounds": rounds, "fraction": 0.3, "local_epochs": 1, "batch_size": 8, "lr": 0.05, "device": "cpu",
          "seed": 0}
    tr.update(train)
    return config_from_dict({"name": "tiny", "data": {"name": "synthetic", "num_clients": 10}, "train": tr,
                             "algorithm": {"name": algorithm}})


def write_tiny_config_file(path: Path, algorithm: str = "fedavg", rounds: int = 2) -> Path:
    path.write_text(
        "name: tiny\n"
        "data: {name: synthetic, num_clients: 10, synthetic_train: 400, synthetic_test: 100}\n"
        f"train: {{rounds: {rounds}, fraction: 0.3, local_epochs: 1, batch_size: 16, lr: 0.05, device: cpu}}\n"
        f"algorithm: {{name: {algorithm}}}\n"
    )
    return path
