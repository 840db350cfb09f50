"""The Debian/Ubuntu package dataset-fashion-mnist (installed in CI) loads through the system search path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedent.config import DataConfig
from fedent.data import load_dataset

SYSTEM_COPY = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(
    not (SYSTEM_COPY / "train-images-idx3-ubyte.gz").is_file(), reason="dataset-fashion-mnist is not installed"
)
def test_debian_fashion_mnist() -> None:
    ds = load_dataset(DataConfig(name="fashion-mnist"))
    assert ds.source == f"system:{SYSTEM_COPY}"
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.num_classes == 10
    assert np.bincount(ds.y_train.numpy(), minlength=10).tolist() == [6000] * 10
    assert np.bincount(ds.y_test.numpy(), minlength=10).tolist() == [1000] * 10
    # normalised with Fashion-MNIST's mean/std: about zero mean, unit variance over the train set
    assert abs(float(ds.x_train.mean())) < 0.01 and abs(float(ds.x_train.std()) - 1.0) < 0.01
