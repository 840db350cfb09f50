"""Fixed point in Z_{2^k}: round trips within 2^-f, sums decode exactly, overflow is refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedent.secagg.fixedpoint import RangeError, decode, encode, limit_for, ring_mask


@pytest.mark.parametrize("ring_bits", [32, 64])
def test_sums_of_encoded_vectors_decode_within_the_resolution(ring_bits: int) -> None:
    rng = np.random.default_rng(0)
    xs = [rng.normal(scale=3.0, size=500) for _ in range(5)]
    f = 12 if ring_bits == 32 else 24
    total = np.zeros(500, dtype=np.uint64)
    for x in xs:
        total = (total + encode(x, f, ring_bits, limit_for(ring_bits, 5))) & ring_mask(ring_bits)
    err = np.abs(decode(total, f, ring_bits) - sum(xs))
    assert err.max() <= 5 * 0.5 / 2 ** f + 1e-12
    assert err.max() > 0  # it is rounded: not the float sum bit for bit


def test_stochastic_rounding_is_unbiased_and_seeded() -> None:
    x = np.full(20000, 0.3 / 2 ** 8)  # 0.3 of a step
    a = encode(x, 8, 64, 2.0 ** 62, "stochastic", np.random.default_rng(1))
    b = encode(x, 8, 64, 2.0 ** 62, "stochastic", np.random.default_rng(1))
    assert np.array_equal(a, b)
    assert abs(decode(a, 8, 64).mean() * 2 ** 8 - 0.3) < 0.02  # nearest would give 0 everywhere
    assert decode(encode(x, 8, 64, 2.0 ** 62), 8, 64).max() == 0.0


def test_negative_values_wrap_and_come_back() -> None:
    x = np.array([-1.5, 2.25, -0.0078125])
    assert np.array_equal(decode(encode(x, 7, 16, limit_for(16, 1)), 7, 16), x)


def test_values_that_could_overflow_the_sum_are_refused_with_the_fix() -> None:
    with pytest.raises(RangeError, match="secagg_ring_bits"):
        encode(np.array([1000.0]), 20, 32, limit_for(32, 4))
    with pytest.raises(RangeError, match="not finite"):
        encode(np.array([np.nan]), 20, 64, limit_for(64, 4))
