"""The example's model: ``build(num_classes, in_channels, image_size, dropout)``, fedent's model interface."""

from __future__ import annotations

from torch import nn


def build(num_classes: int, in_channels: int, image_size: int, dropout: float) -> nn.Module:
    """conv3x3(16)+ReLU+pool, then a linear layer: 8x8 digits need nothing bigger. fedent seeds the init.

    Parameters only (no BatchNorm buffers): fedent's model state is ``list(model.parameters())``."""
    side = image_size // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Dropout(dropout), nn.Linear(16 * side * side, num_classes),
    )
