"""The paper's local models (Section VI "Local model"), built deterministically from a seed.

``build_model`` is the only way the simulator, the workers and the estimator create a model, so the
same (name, shape, seed) gives bit-identical initial weights everywhere. Every model has parameters only
(no buffers): a model's state is ``list(model.parameters())`` (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fedent.models.cnn import Cifar10CNN, MnistCNN
from fedent.models.lenet import LeNet5
from fedent.models.vgg import VGG11
from fedent.rng import GLOBAL_RNG, derive_seed

MODELS: dict[str, Callable[[int, int, int, float], nn.Module]] = {
    "mnist-cnn": MnistCNN,
    "cifar10-cnn": Cifar10CNN,
    "lenet5": LeNet5,
    "vgg11": VGG11,
}

# The paper's dataset -> model pairing (Table IV); synthetic data is MNIST-shaped.
DEFAULT_MODEL: dict[str, str] = {
    "mnist": "mnist-cnn",
    "fashion-mnist": "mnist-cnn",
    "emnist-letters": "lenet5",
    "cifar10": "cifar10-cnn",
    "cifar100": "vgg11",
    "synthetic": "mnist-cnn",
}


def build_model(
    name: str,
    num_classes: int,
    in_channels: int,
    image_size: int,
    dropout: float = 0.0,
    seed: int = 0,
) -> nn.Module:
    """A freshly initialised model; the init draws from a private stream so torch's global RNG is untouched.

    The weights depend only on (name, shapes, dropout-independent layout, seed): the RNG is seeded from
    ``derive_seed(seed, "init")`` inside ``torch.random.fork_rng``, which restores the global CPU state on exit.
    """
    factory = MODELS.get(name)
    if factory is None:
        from fedent import plugins

        if not (plugins.is_import_path(name) or plugins.has_entry_point("models", name)):
            raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)} "
                             "(or an import path 'package.module:build')")
        factory = plugins.model_factory(name)  # build(num_classes, in_channels, image_size, dropout)
    if num_classes < 1 or in_channels < 1 or image_size < 1:
        raise ValueError(
            f"model {name}: num_classes, in_channels and image_size must be >= 1 "
            f"(got {num_classes}, {in_channels}, {image_size})"
        )
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"model {name}: dropout must be in [0, 1), got {dropout}")
    # the seed is global to the process: runs stacked in threads (fedent.rounds.stacking) build one at a time
    with GLOBAL_RNG, torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "init"))
        model = factory(num_classes, in_channels, image_size, dropout)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:  # a contract of the whole project, so fail loudly if a new model breaks it
        raise AssertionError(f"model {name} has buffers {buffers}; models must have parameters only")
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["DEFAULT_MODEL", "MODELS", "build_model", "count_parameters"]
