"""The validation split for fair tuning (issue 29, item 3): a seeded share of every client's training samples.

Why per client rather than one held-out block before partitioning: the partition (which client holds which
labels, its md5) stays the one the final runs use, each client keeps the same label mix in what it trains on,
and the validation set (the union of the held-out pieces) follows the training distribution. The test set is
never touched. Each client keeps at least one training sample; the held-out indices are disjoint from the
training indices by construction (tests/fedent/data/test_validation.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedent.rng import numpy_rng


@dataclass(frozen=True)
class ValidationSplit:
    """Each client's remaining training indices, and the validation indices (into the training set)."""

    train: tuple[np.ndarray, ...]
    validation: np.ndarray
    fraction: float

    def md5(self) -> str:
        return hashlib.md5(np.ascontiguousarray(self.validation, dtype=np.int64).tobytes()).hexdigest()

    def info(self) -> dict[str, object]:
        """What partition.json records about the split."""
        return {"fraction": self.fraction, "samples": int(len(self.validation)), "md5": self.md5(),
                "scheme": "per-client"}


def carve_validation(client_indices: Sequence[np.ndarray], fraction: float, seed: int) -> ValidationSplit:
    """Hold out ``round(fraction * n_k)`` of client k's samples (at most n_k − 1), drawn with the seeded stream
    (seed, "validation", k); the rest stay the client's training data, in their original order."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction}")
    train: list[np.ndarray] = []
    held: list[np.ndarray] = []
    for k, ix in enumerate(client_indices):
        ix = np.asarray(ix, dtype=np.int64)
        n_val = min(int(round(fraction * len(ix))), max(len(ix) - 1, 0))
        pick = np.zeros(len(ix), dtype=bool)
        if n_val > 0:
            pick[numpy_rng(seed, "validation", 0, k).choice(len(ix), size=n_val, replace=False)] = True
        train.append(ix[~pick])
        held.append(ix[pick])
    validation = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    return ValidationSplit(tuple(train), validation.astype(np.int64), float(fraction))
