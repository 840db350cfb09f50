"""FedNorm's rate (Eq. (norm_objective)), derived with the Hamiltonian method of Proposition 1.

With w_i(t+1) = φ1(t) − ηg and the mean-field aggregated step Δ(t) = φ1(t) − φ1(t+1), the client's
per-step cost is J(η) = (1−β)η² + β‖Δ − ηg‖². J is convex (J'' = 2(1−β) + 2β‖g‖² > 0), so its
minimiser over η ≥ 0 is η* = max(0, β gᵀΔ / ((1−β) + β‖g‖²)). See docs/algorithm.md for the
derivation and for why Δ is the *last actual* global step rather than a self-consistent one.
"""

from __future__ import annotations

import math


def fednorm_rate(g_dot_delta: float, b: float, beta: float) -> tuple[float, bool]:
    """(η*, guarded): η* = max(0, β gᵀΔ / ((1−β) + β b)); non-finite or b < 0 inputs give (0, True)."""
    if not (0.0 < beta < 1.0):
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if not (math.isfinite(g_dot_delta) and math.isfinite(b)) or b < 0:
        return 0.0, True
    return max(0.0, beta * g_dot_delta / ((1.0 - beta) + beta * b)), False


def fednorm_objective(eta: float, g_dot_delta: float, b: float, delta_sq: float, beta: float) -> float:
    """J(η) = (1−β)η² + β‖Δ − ηg‖² = (1−β)η² + β(‖Δ‖² − 2η gᵀΔ + η²‖g‖²)."""
    return (1.0 - beta) * eta * eta + beta * (delta_sq - 2.0 * eta * g_dot_delta + eta * eta * b)
