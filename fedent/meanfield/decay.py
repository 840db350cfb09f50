"""The learning-rate decay of Eq. (eta_deacy): η_i(t) = γ η_i(t−1) + (1−γ) η*_i(t).

η_i(−1) is the configured base rate (Table IV). η_i(t−1) is the client's *own* most recent rate, from
the last round it took part in (spec §2); it lives in the client's state under ``ETA_STATE_KEY`` so it
survives restarts and rounds the client skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import ArrayLike, NDArray

ETA_STATE_KEY = "eta"


def check_gamma(gamma: float) -> None:
    if not (0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


def decayed_rate(previous: float, eta_star: float, gamma: float) -> float:
    """Eq. (eta_deacy) for one client."""
    check_gamma(gamma)
    return float(gamma * previous + (1.0 - gamma) * eta_star)


def decayed_rates(previous: ArrayLike, eta_star: ArrayLike, gamma: float) -> NDArray[np.float64]:
    """Eq. (eta_deacy) over clients."""
    check_gamma(gamma)
    return gamma * np.asarray(previous, dtype=np.float64) + (1.0 - gamma) * np.asarray(eta_star, dtype=np.float64)


def previous_rate(scalars: Mapping[str, float], base_lr: float) -> float:
    """η_i(t−1): the client's last used rate, or the base rate η_i(−1) before its first round."""
    return float(scalars.get(ETA_STATE_KEY, base_lr))
