"""What a run trains on (simulator and aggregator alike): the dataset tensors, the client partition and a model factory.

Kept separate from the round loop so that a comparison loads the data and partition once per seed and
hands the identical inputs to every algorithm, and so tests and benchmarks can inject tiny inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from torch import Tensor, nn

from fedent.config import ExperimentConfig


class DatasetLike(Protocol):
    """The fields of fedent.data.FedDataset that the simulator reads."""

    @property
    def x_train(self) -> Tensor: ...

    @property
    def y_train(self) -> Tensor: ...

    @property
    def x_test(self) -> Tensor: ...

    @property
    def y_test(self) -> Tensor: ...

    @property
    def num_classes(self) -> int: ...


@dataclass(frozen=True)
class RunInputs:
    """Data, partition and a factory building the (seeded, identical every call) initial model."""

    data: DatasetLike
    client_indices: Sequence[np.ndarray]  # int64 train-sample indices per client
    make_model: Callable[[], nn.Module]
    partition_info: Mapping[str, Any] = field(default_factory=dict)  # partition.json content

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def client_sizes(self) -> list[int]:
        return [int(len(ix)) for ix in self.client_indices]


def load_inputs(cfg: ExperimentConfig) -> RunInputs:
    """The configured dataset, its seeded partition (fedent.data) and model (fedent.models), all from train.seed."""
    from fedent.data import load_dataset, make_partition
    from fedent.models import build_model

    seed = cfg.train.seed
    data = load_dataset(cfg.data, seed)
    labels = data.y_train.cpu().numpy()
    part = make_partition(labels, cfg.data, seed)
    info = dict(part.to_json(labels))
    info.setdefault("md5", part.md5())
    info.setdefault("seed", seed)
    info.setdefault("dataset", data.name)
    info.setdefault("source", data.source)

    def make_model() -> nn.Module:
        return build_model(cfg.model.name, data.num_classes, data.in_channels, data.image_size,
                           cfg.model.dropout, seed)

    return RunInputs(data=data, client_indices=tuple(part.client_indices), make_model=make_model,
                     partition_info=info)
