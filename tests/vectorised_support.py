"""The vectorised executor's test problem, shared by its tests and the stacked runs' (tests/fedent/rounds): a
small convolutional model and clients of uneven sizes, so masked steps and short last batches are exercised."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from sim_support import tiny_inputs
from torch import nn

from fedent.config import config_from_dict
from fedent.inputs import RunInputs

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOL = 1e-5


def conv_model(num_classes: int = 4, dropout: float = 0.0, batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(3)
    layers: list[nn.Module] = [nn.Conv2d(1, 3, 3, padding=1)]
    if batchnorm:
        layers.append(nn.BatchNorm2d(3))
    layers += [nn.ReLU(), nn.Flatten(), nn.Dropout(dropout), nn.Linear(48, num_classes)]
    return nn.Sequential(*layers)


def uneven_inputs(num_clients: int = 8) -> RunInputs:
    """tiny_inputs' data, clients of 13..52 samples (steps differ; batch 8 leaves short last batches)."""
    base = tiny_inputs(num_clients=num_clients, per_client=60)
    rng = np.random.default_rng(5)
    order = rng.permutation(int(base.data.y_train.shape[0]))
    sizes = [13 + 13 * (k % 4) for k in range(num_clients)]
    bounds = np.cumsum([0, *sizes])
    indices = tuple(np.sort(order[bounds[k]:bounds[k + 1]]) for k in range(num_clients))
    return dataclasses.replace(base, client_indices=indices, make_model=conv_model,
                               partition_info={**base.partition_info, "sizes": sizes})


def config(algorithm: str, executor: str, device: str, **train: object) -> object:
    return config_from_dict({
        "name": "vec", "algorithm": {"name": algorithm}, "data": {"name": "synthetic", "num_clients": 8},
        "train": {"rounds": 3, "fraction": 0.5, "local_epochs": 2, "batch_size": 8, "lr": 0.05, "device": device,
                  "executor": executor, **train}})


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.detach().cpu() - y.detach().cpu()).abs().max()) for x, y in zip(a, b, strict=True))
