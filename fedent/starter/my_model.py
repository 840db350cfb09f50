"""Your model: ``build(num_classes, in_channels, image_size, dropout) -> torch.nn.Module``.

fedent seeds the initialisation; the model must have parameters only (no BatchNorm buffers), because the
model state that travels is ``list(model.parameters())``.
"""

from __future__ import annotations

from torch import nn


def build(num_classes: int, in_channels: int, image_size: int, dropout: float) -> nn.Module:
    """A small CNN: conv(16) + ReLU + pool, then a linear layer. Change it freely."""
    side = image_size // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Dropout(dropout), nn.Linear(16 * side * side, num_classes),
    )
