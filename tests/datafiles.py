"""Test helpers that WRITE small datasets in the real on-disk formats, so tests load them through the real code.

IDX files (gzipped or raw) in torchvision's MNIST/FashionMNIST/EMNIST layouts or flat; CIFAR-10/100
"python version" pickled batches. Pixel values encode the label (see ``expected_pixel``) so a test can
check that images and labels stay paired through loading, transposing and subsampling.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

MNIST_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
EMNIST_NAMES = (
    "emnist-letters-train-images-idx3-ubyte",
    "emnist-letters-train-labels-idx1-ubyte",
    "emnist-letters-test-images-idx3-ubyte",
    "emnist-letters-test-labels-idx1-ubyte",
)
TV_CLASS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST", "emnist-letters": "EMNIST"}


def idx_bytes(arr: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: magic (0, 0, 0x08, ndim), big-endian dims, data."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + arr.tobytes()


def write_idx(path: Path, arr: np.ndarray, gz: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = idx_bytes(arr)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def labelled_images(labels: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """uint8 images whose every pixel is ``expected_pixel(label)``, plus a marker in pixel (0, 1) (see below)."""
    imgs = np.zeros((labels.size, *shape), dtype=np.uint8)
    imgs[...] = expected_pixel(labels).reshape(-1, *([1] * len(shape)))
    return imgs


def expected_pixel(labels: np.ndarray) -> np.ndarray:
    return (np.asarray(labels) * 7 + 3).astype(np.uint8)


def make_labels(n: int, num_classes: int, seed: int, offset: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).integers(0, num_classes, n) + offset).astype(np.uint8)


def write_mnist_like(
    directory: Path,
    n_train: int = 120,
    n_test: int = 40,
    num_classes: int = 10,
    gz: bool = True,
    names: tuple[str, str, str, str] = MNIST_NAMES,
    label_offset: int = 0,
    marker: bool = False,
) -> dict[str, np.ndarray]:
    """Write the four IDX files into ``directory``; returns the arrays written (labels as stored).

    With ``marker`` the pixel at row 0, column 5 is set to 255, so a test can tell a transposed image.
    """
    ytr = make_labels(n_train, num_classes, 1, label_offset)
    yte = make_labels(n_test, num_classes, 2, label_offset)
    xtr = labelled_images(ytr - label_offset, (28, 28))
    xte = labelled_images(yte - label_offset, (28, 28))
    if marker:
        xtr[:, 0, 5] = 255
        xte[:, 0, 5] = 255
    for name, arr in zip(names, (xtr, ytr, xte, yte), strict=True):
        write_idx(directory / name, arr, gz)
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}


def write_torchvision_mnist(root: Path, dataset: str, **kw: object) -> dict[str, np.ndarray]:
    """torchvision's layout: ROOT/<Class>/raw/<uncompressed IDX files> (what its download leaves behind)."""
    names = EMNIST_NAMES if dataset == "emnist-letters" else MNIST_NAMES
    return write_mnist_like(root / TV_CLASS[dataset] / "raw", gz=False, names=names, **kw)  # type: ignore[arg-type]


def write_cifar(
    root: Path, hundred: bool = False, per_batch: int = 20, n_test: int = 30, protocol: int = 2
) -> dict[str, np.ndarray]:
    """CIFAR-10 (5 train batches + test_batch) or CIFAR-100 (train + test) pickles under ROOT/<dir>/."""
    num_classes = 100 if hundred else 10
    label_key = "fine_labels" if hundred else "labels"
    d = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    d.mkdir(parents=True, exist_ok=True)
    train_names = ["train"] if hundred else [f"data_batch_{i}" for i in range(1, 6)]
    n_per = per_batch * (5 if hundred else 1)
    xs, ys = [], []
    for i, name in enumerate(train_names):
        y = np.random.default_rng(10 + i).integers(0, num_classes, n_per)
        x = np.zeros((n_per, 3, 32, 32), dtype=np.uint8)
        x[:, 0] = expected_pixel(y % 36).reshape(-1, 1, 1)  # red channel encodes the label
        x[:, 1] = 50
        x[:, 2] = 200
        _dump(d / name, {b"batch_label": name.encode(), b"data": x.reshape(n_per, -1), label_key.encode(): y.tolist()},
              protocol)
        xs.append(x)
        ys.append(y)
    yte = np.random.default_rng(99).integers(0, num_classes, n_test)
    xte = np.zeros((n_test, 3, 32, 32), dtype=np.uint8)
    xte[:, 0] = expected_pixel(yte % 36).reshape(-1, 1, 1)
    _dump(d / ("test" if hundred else "test_batch"),
          {b"data": xte.reshape(n_test, -1), label_key.encode(): yte.tolist()}, protocol)
    return {"x_train": np.concatenate(xs), "y_train": np.concatenate(ys), "x_test": xte, "y_test": yte}


def _dump(path: Path, obj: dict[bytes, object], protocol: int) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)
