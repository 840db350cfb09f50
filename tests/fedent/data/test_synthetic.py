"""The synthetic dataset: seeded, balanced, standardised, and with real class structure."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedent.config import DataConfig
from fedent.data import load_dataset
from fedent.data.synthetic import make_synthetic


def test_shapes_and_source() -> None:
    ds = load_dataset(DataConfig(name="synthetic", synthetic_train=500, synthetic_test=200), seed=0)
    assert ds.x_train.shape == (500, 1, 28, 28) and ds.x_test.shape == (200, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert (ds.num_classes, ds.in_channels, ds.image_size, ds.source) == (10, 1, 28, "synthetic")
    assert np.bincount(ds.y_train.numpy(), minlength=10).tolist() == [50] * 10
    assert abs(float(ds.x_train.mean())) < 1e-3 and abs(float(ds.x_train.std()) - 1.0) < 1e-3


def test_seeded() -> None:
    a = make_synthetic(100, 50, seed=1)
    b = make_synthetic(100, 50, seed=1)
    c = make_synthetic(100, 50, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])


def test_nearest_class_mean_separates_classes() -> None:
    """Class structure is real: a nearest-class-mean classifier fit on train is accurate on test."""
    xtr, ytr, xte, yte = make_synthetic(2000, 500, seed=0)
    means = np.stack([xtr[ytr == c].reshape(-1, 784).mean(0) for c in range(10)])
    d = ((xte.reshape(-1, 1, 784) - means[None]) ** 2).sum(-1)
    acc = float((d.argmin(1) == yte).mean())
    assert acc > 0.8, acc
    shuffled = np.random.default_rng(0).permutation(ytr)
    means_noise = np.stack([xtr[shuffled == c].reshape(-1, 784).mean(0) for c in range(10)])
    chance = float((((xte.reshape(-1, 1, 784) - means_noise[None]) ** 2).sum(-1).argmin(1) == yte).mean())
    assert chance < 0.3, chance


def test_subsample_applies_to_synthetic() -> None:
    ds = load_dataset(DataConfig(name="synthetic", synthetic_train=300, max_train_samples=120), seed=0)
    assert ds.num_train == 120


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        make_synthetic(0, 10, seed=0)
