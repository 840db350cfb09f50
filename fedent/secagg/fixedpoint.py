"""Floats to the ring Z_{2^k} and back: the fixed-point code that masking needs (masks are uniform ring elements,
so only integers mod 2^k can be masked without leaking).

x becomes round(x * 2^f) mod 2^k (two's complement), where round is to nearest, or stochastic (floor(x 2^f + u),
u ~ U[0, 1) from a seeded generator: unbiased). Decoding a ring sum reads it as a signed k-bit integer and divides
by 2^f, which is exact as long as the true sum stays inside (-2^(k-1), 2^(k-1)) / 2^f; ``encode`` refuses a vector
whose share of that range (``limit``) it would exceed. The resolution is 2^-f per client and coordinate.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Rounding = Literal["nearest", "stochastic"]


class RangeError(ValueError):
    """A value too large for the ring at this scale (raise ring_bits or lower frac_bits)."""


def ring_mask(ring_bits: int) -> np.uint64:
    return np.uint64((1 << ring_bits) - 1) if ring_bits < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)


def encode(x: np.ndarray, frac_bits: int, ring_bits: int, limit: float, rounding: Rounding = "nearest",
           rng: np.random.Generator | None = None) -> np.ndarray:
    """float vector -> uint64 ring elements. ``limit``: the largest |x| * 2^f allowed (the caller's share of the
    ring's half-range, so that a sum of all participants cannot wrap)."""
    scaled = np.asarray(x, dtype=np.float64) * float(2 ** frac_bits)
    if not np.all(np.isfinite(scaled)):
        raise RangeError("the vector to aggregate is not finite (NaN/inf)")
    peak = float(np.max(np.abs(scaled))) if scaled.size else 0.0
    if peak >= limit:
        raise RangeError(f"a value of {peak / 2 ** frac_bits:.4g} does not fit the ring Z_2^{ring_bits} at scale "
                         f"2^{frac_bits} with this many clients (limit {limit / 2 ** frac_bits:.4g}); raise "
                         "privacy.secagg_ring_bits or lower privacy.secagg_frac_bits")
    if rounding == "stochastic":
        if rng is None:
            raise ValueError("stochastic rounding needs a seeded generator")
        ints = np.floor(scaled + rng.random(scaled.shape)).astype(np.int64)
    else:
        ints = np.rint(scaled).astype(np.int64)
    return ints.view(np.uint64) & ring_mask(ring_bits)


def decode(ring: np.ndarray, frac_bits: int, ring_bits: int) -> np.ndarray:
    """uint64 ring elements (a sum) -> float64, reading each as a signed ring_bits-bit integer."""
    r = np.asarray(ring, dtype=np.uint64) & ring_mask(ring_bits)
    if ring_bits < 64:
        half = np.uint64(1 << (ring_bits - 1))
        signed = r.astype(np.int64) - np.where(r >= half, np.int64(1 << (ring_bits - 1)) * 2, np.int64(0))
    else:
        signed = r.view(np.int64)
    return signed.astype(np.float64) / float(2 ** frac_bits)


def limit_for(ring_bits: int, participants: int) -> float:
    """Each client's bound on |x| * 2^f so that the sum of ``participants`` vectors stays in the signed range."""
    return float(2 ** (ring_bits - 1)) / max(1, participants)
