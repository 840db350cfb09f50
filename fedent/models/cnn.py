"""MNIST-CNN and CIFAR10-CNN as described in the paper's "Local model" paragraph (Section VI).

The paper's "ReLU output layer of 10 units" is read as a linear output layer producing logits (a ReLU on
logits would make cross-entropy training degenerate); ReLU follows every conv and the hidden fc layer.
Dropout (p = ``dropout``, 0 by default) sits before each fully connected layer, as the paper describes.
"""

from __future__ import annotations

from torch import Tensor, nn

from fedent.models.shapes import after_pools


class MnistCNN(nn.Module):
    """Two 5x5 convs (32, 64; 'same' padding), each + ReLU + 2x2 max-pool, then fc 7*7*64 -> 512 -> classes.

    1,663,370 parameters for 1x28x28 inputs and 10 classes.
    """

    def __init__(self, num_classes: int, in_channels: int, image_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        side = after_pools(image_size, 2, "mnist-cnn")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(64 * side * side, 512),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


class Cifar10CNN(nn.Module):
    """Three 3x3 convs (32, 64, 64; padding 1), each + ReLU + 2x2 max-pool, then fc 4*4*64 -> 512 -> classes.

    586,250 parameters for 3x32x32 inputs and 10 classes.
    """

    def __init__(self, num_classes: int, in_channels: int, image_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        side = after_pools(image_size, 3, "cifar10-cnn")
        layers: list[nn.Module] = []
        prev = in_channels
        for ch in (32, 64, 64):
            layers += [nn.Conv2d(prev, ch, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            prev = ch
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(64 * side * side, 512),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
