"""Reader for the CIFAR-10/100 "python version" pickled batches, with a restricted unpickler.

The official files are pickles of dicts holding a uint8 ``data`` array (N x 3072, channel-major) and
``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100). Only numpy's array reconstruction is allowed to
unpickle, so a malicious file in a data directory cannot run code.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)
CIFAR100_TRAIN = ("train",)
CIFAR100_TEST = ("test",)


class CifarFormatError(ValueError):
    """A CIFAR batch file that is not the expected pickled dict."""


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")


def _get(d: dict[Any, Any], key: str) -> Any:
    if key in d:
        return d[key]
    return d.get(key.encode())


def read_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 N x 3 x 32 x 32, labels int64 N) from one batch file."""
    try:
        with open(path, "rb") as f:
            d = _SafeUnpickler(f, encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as e:
        raise CifarFormatError(f"{path}: not a CIFAR python batch ({e.__class__.__name__}: {e})") from None
    if not isinstance(d, dict):
        raise CifarFormatError(f"{path}: not a CIFAR python batch (top level is {type(d).__name__})")
    data, labels = _get(d, "data"), _get(d, label_key)
    if data is None or labels is None:
        raise CifarFormatError(f"{path}: missing 'data' or '{label_key}'")
    x = np.asarray(data, dtype=np.uint8)
    y = np.asarray(labels, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or x.shape[0] != y.shape[0]:
        raise CifarFormatError(f"{path}: expected data N x 3072 and N labels, got {x.shape} and {y.shape}")
    return x.reshape(-1, 3, 32, 32), y


def read_cifar_dir(
    directory: Path, train_files: tuple[str, ...], test_files: tuple[str, ...], label_key: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """All batches of one dataset from ``directory``; None when any file is missing."""
    paths = [directory / n for n in (*train_files, *test_files)]
    if not all(p.is_file() for p in paths):
        return None
    train = [read_batch(p, label_key) for p in paths[: len(train_files)]]
    test = [read_batch(p, label_key) for p in paths[len(train_files) :]]
    return (
        np.concatenate([b[0] for b in train]),
        np.concatenate([b[1] for b in train]),
        np.concatenate([b[0] for b in test]),
        np.concatenate([b[1] for b in test]),
    )
