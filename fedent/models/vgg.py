"""CIFAR-style VGG-11 (Simonyan & Zisserman 2014, configuration "A") with GroupNorm instead of BatchNorm.

GroupNorm keeps the model buffer-free (model state == parameters, docs/architecture.md) and is what
non-IID federated training needs (Hsieh et al. 2020); its affine parameters equal BatchNorm's, so the
count matches the usual VGG-11-BN CIFAR model: 9,231,114 (10 classes), 9,277,284 (100 classes).
Pools use ceil mode so that 28x28 inputs still reach a 1x1 map after five poolings.
"""

from __future__ import annotations

from torch import Tensor, nn

from fedent.models.shapes import after_pools

CONFIG_A: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
GN_GROUPS = 32


class VGG11(nn.Module):
    def __init__(self, num_classes: int, in_channels: int, image_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_channels
        pools = 0
        for v in CONFIG_A:
            if v == "M":
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
                pools += 1
            else:
                ch = int(v)
                layers += [nn.Conv2d(prev, ch, kernel_size=3, padding=1), nn.GroupNorm(GN_GROUPS, ch), nn.ReLU()]
                prev = ch
        side = after_pools(image_size, pools, "vgg11", ceil=True)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(prev * side * side, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
