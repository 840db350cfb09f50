"""A seeded, MNIST-shaped synthetic dataset with real class structure (no files, no network).

Each class has a prototype image made of a few Gaussian blobs of either sign; a sample is its class
prototype, randomly scaled, shifted by up to two pixels and covered in Gaussian noise. A small CNN learns
it to high accuracy in a few federated rounds, which makes it the dataset of smoke runs and tests.
"""

from __future__ import annotations

import numpy as np

from fedent.rng import numpy_rng

SIZE = 28
NUM_CLASSES = 10
BLOBS_PER_CLASS = 4
MAX_SHIFT = 2
NOISE_STD = 0.6


def class_prototypes(rng: np.random.Generator, num_classes: int = NUM_CLASSES, size: int = SIZE) -> np.ndarray:
    """num_classes x size x size prototypes, each scaled to a maximum absolute value of 1."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    protos = np.zeros((num_classes, size, size))
    for c in range(num_classes):
        for _ in range(BLOBS_PER_CLASS):
            cy, cx = rng.uniform(size * 0.2, size * 0.8, 2)
            sigma = rng.uniform(2.0, 4.0)
            sign = rng.choice((-1.0, 1.0))
            protos[c] += sign * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma**2))
        protos[c] /= np.abs(protos[c]).max()
    return protos


def _draw(rng: np.random.Generator, protos: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    num_classes = protos.shape[0]
    y = rng.permutation(np.arange(n) % num_classes).astype(np.int64)
    x = protos[y] * rng.uniform(0.7, 1.3, size=(n, 1, 1))
    shifts = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, size=(n, 2))
    for dy in range(-MAX_SHIFT, MAX_SHIFT + 1):
        for dx in range(-MAX_SHIFT, MAX_SHIFT + 1):
            sel = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            if sel.any():
                x[sel] = np.roll(x[sel], shift=(dy, dx), axis=(1, 2))
    x += rng.normal(0.0, NOISE_STD, size=x.shape)
    return x.astype(np.float32)[:, None, :, :], y


def make_synthetic(n_train: int, n_test: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): float32 N x 1 x 28 x 28 standardised by the train mean/std."""
    if n_train < 1 or n_test < 1:
        raise ValueError(f"synthetic dataset sizes must be >= 1, got train={n_train}, test={n_test}")
    rng = numpy_rng(seed, "data", 0)
    protos = class_prototypes(rng)
    x_train, y_train = _draw(rng, protos, n_train)
    x_test, y_test = _draw(rng, protos, n_test)
    mean, std = float(x_train.mean()), float(x_train.std()) or 1.0
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test
