"""LeNet-5 (LeCun et al. 1998) for EMNIST-Letters, in its common modern form (ReLU, max-pool).

conv 6@5x5 (pad 2) -> pool -> conv 16@5x5 -> pool -> fc 400 -> 120 -> 84 -> classes for 28x28 inputs
(61,706 parameters with 10 classes; 63,066 with the 26 EMNIST letters).
"""

from __future__ import annotations

from torch import Tensor, nn

from fedent.models.shapes import after_pools


class LeNet5(nn.Module):
    def __init__(self, num_classes: int, in_channels: int, image_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        # conv1 keeps the size (pad 2), conv2 (no padding) removes 4 pixels before the second pool.
        s1 = after_pools(image_size, 1, "lenet5")
        if s1 - 4 < 2:
            raise ValueError(f"model lenet5: image size {image_size} is too small (needs >= 12)")
        side = (s1 - 4) // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))
