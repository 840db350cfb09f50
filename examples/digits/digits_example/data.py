"""The example's dataset: ``load(cfg, seed) -> FedDataset``, fedent's dataset interface.

scikit-learn ships the UCI digits (1,797 8x8 images, 10 classes) inside the package, so this runs offline.
"""

from __future__ import annotations

import numpy as np
import torch

from fedent.config import DataConfig
from fedent.data import FedDataset
from fedent.rng import numpy_rng

TEST_FRACTION = 0.2


def load(cfg: DataConfig, seed: int) -> FedDataset:
    """Pixel values 0..16 scaled to [0, 1]; a seeded 80/20 train/test split (the same in every process)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy((digits.images / 16.0).astype(np.float32)).unsqueeze(1)  # N x 1 x 8 x 8
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = numpy_rng(seed, "data", 0).permutation(len(y))
    n_test = int(len(y) * TEST_FRACTION)
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    tr, te = torch.from_numpy(train), torch.from_numpy(test)
    return FedDataset(name="digits", x_train=x[tr], y_train=y[tr], x_test=x[te], y_test=y[te], num_classes=10,
                      in_channels=1, image_size=8, source="sklearn.datasets.load_digits")
