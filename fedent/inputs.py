"""What a run trains on (simulator and aggregator alike): the dataset tensors, the client partition and a model factory.

Kept separate from the round loop so that a comparison loads the data and partition once per seed and
hands the identical inputs to every algorithm, and so tests and benchmarks can inject tiny inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    # data.validation_fraction > 0: the held-out validation samples (indices into data.x_train), disjoint from
    # every client's training indices (fedent.data.validation)
    validation_indices: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    def client_sizes(self) -> list[int]:
        return [int(len(ix)) for ix in self.client_indices]


def model_input(cfg: ExperimentConfig, data: DatasetLike | None = None) -> tuple[int, int, int]:
    """(num_classes, in_channels, image_size) of the model: data.num_classes/in_channels/image_size when set,
    else the loaded ``data``'s, else the built-in dataset's (what a process without the data builds from)."""
    from fedent.data.datasets import SPECS

    d = cfg.data
    spec = SPECS.get(d.name)
    found = (getattr(data, "num_classes", None), getattr(data, "in_channels", None), getattr(data, "image_size", None))
    known = (spec.num_classes, spec.in_channels, spec.image_size) if spec is not None else (None, None, None)
    out = tuple(v if v is not None else (f if f is not None else k)
                for v, f, k in zip((d.num_classes, d.in_channels, d.image_size), found, known, strict=True))
    if None in out:
        raise ValueError(f"the model's input is unknown for data.name {d.name!r}: set data.num_classes, "
                         "data.in_channels and data.image_size")
    return int(out[0]), int(out[1]), int(out[2])  # type: ignore[arg-type]


def model_factory(cfg: ExperimentConfig, data: DatasetLike | None = None) -> Callable[[], nn.Module]:
    """The seeded initial model (identical every call) for ``cfg``'s model and input."""
    from fedent.models import build_model

    num_classes, in_channels, image_size = model_input(cfg, data)

    def make_model() -> nn.Module:
        return build_model(cfg.model.name, num_classes, in_channels, image_size, cfg.model.dropout, cfg.train.seed)

    return make_model


@dataclass(frozen=True, eq=False)
class HeldOut:
    """The aggregator's data when the clients' data stays on the workers: an optional held-out test set."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int


def load_server_inputs(cfg: ExperimentConfig) -> RunInputs:
    """``data.placement: workers``: no training data here. Server-side evaluation reads ``data.server_test``
    (x, y in a .npz/.pt file) or the built-in dataset's test split; client sizes come from the workers."""
    import torch

    from fedent.data.datasets import SPECS, load_dataset
    from fedent.data.local import LocalDataSpec, read_local

    num_classes, c, s = model_input(cfg)
    x_test = torch.zeros((0, c, s, s))
    y_test = torch.zeros(0, dtype=torch.int64)
    source = "none (federated evaluation)"
    if cfg.train.evaluation == "server":
        if cfg.data.server_test is not None:
            from fedent.config import DataConfig, ExperimentConfig
            from fedent.data.local import prepare_local

            raw = read_local(LocalDataSpec("split", Path(cfg.data.server_test)), [0], cfg.data.name)
            one = ExperimentConfig(data=DataConfig(name=cfg.data.name, num_clients=1, partition="iid"))
            held = prepare_local(raw, one, (c, s, s), num_classes)
            x_test, y_test, source = held.x_train, held.y_train, f"server_test:{cfg.data.server_test}"
        elif cfg.data.name in SPECS:
            data = load_dataset(cfg.data, cfg.train.seed)
            x_test, y_test, source = data.x_test, data.y_test, data.source
    held_out = HeldOut(x_test[:0], y_test[:0], x_test, y_test, num_classes)
    info = {"scheme": "worker-local", "seed": cfg.train.seed, "num_clients": cfg.data.num_clients,
            "num_classes": num_classes, "md5": "", "dataset": cfg.data.name, "source": "workers",
            "held_out": source, "sizes": [0] * cfg.data.num_clients}
    empty = tuple(np.zeros(0, np.int64) for _ in range(cfg.data.num_clients))
    return RunInputs(data=held_out, client_indices=empty, make_model=model_factory(cfg), partition_info=info)


def load_inputs(cfg: ExperimentConfig) -> RunInputs:
    """The configured dataset, its seeded partition (fedent.data) and model (fedent.models), all from train.seed.

    With ``data.placement: workers`` the aggregator's inputs: the held-out set only (``load_server_inputs``)."""
    from fedent.data import load_dataset, make_partition

    if cfg.data.placement == "workers":
        return load_server_inputs(cfg)
    seed = cfg.train.seed
    data = load_dataset(cfg.data, seed)
    labels = data.y_train.cpu().numpy()
    part = make_partition(labels, cfg.data, seed)
    info = dict(part.to_json(labels))
    info.setdefault("md5", part.md5())
    info.setdefault("seed", seed)
    info.setdefault("dataset", data.name)
    info.setdefault("source", data.source)
    inputs = RunInputs(data=data, client_indices=tuple(part.client_indices), make_model=model_factory(cfg, data),
                       partition_info=info)
    return with_validation(inputs, cfg)


def with_validation(inputs: RunInputs, cfg: ExperimentConfig) -> RunInputs:
    """``inputs`` with ``data.validation_fraction`` of every client's samples held out (fedent.data.validation,
    seeded by train.seed); unchanged when the fraction is 0 or the split is already there."""
    import dataclasses

    fraction = cfg.data.validation_fraction
    if fraction <= 0 or inputs.validation_indices is not None:
        return inputs
    from fedent.data.validation import carve_validation

    split = carve_validation(inputs.client_indices, fraction, cfg.train.seed)
    info = {**inputs.partition_info, "validation": split.info(),
            "train_sizes": [int(len(ix)) for ix in split.train]}  # what each client trains on ("sizes": before)
    return dataclasses.replace(inputs, client_indices=split.train, partition_info=info,
                               validation_indices=split.validation)
