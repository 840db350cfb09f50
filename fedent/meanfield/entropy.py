"""The entropy term of Definition 1 (Eq. (p_init)): Σ_i p_i log p_i with p_i = θ_i‖w_i‖² / Σ_j θ_j‖w_j‖².

It is ≤ 0; it is most negative (most "disorder") when the weighted squared norms are equal.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def entropy_term(thetas: ArrayLike, sq_norms: ArrayLike) -> float:
    """Σ p log p with the convention 0 log 0 = 0; 0.0 when every weighted norm is zero (p undefined)."""
    th = np.asarray(thetas, dtype=np.float64)
    s = np.asarray(sq_norms, dtype=np.float64)
    if th.shape != s.shape:
        raise ValueError(f"thetas and sq_norms differ in shape: {th.shape} vs {s.shape}")
    if not (np.all(np.isfinite(th)) and np.all(np.isfinite(s))) or np.any(th < 0) or np.any(s < 0):
        raise ValueError("entropy_term needs finite, non-negative thetas and squared norms")
    mass = th * s
    total = float(mass.sum())
    if total <= 0.0:
        return 0.0
    p = mass / total
    pos = p > 0
    return float(np.sum(p[pos] * np.log(p[pos])))
