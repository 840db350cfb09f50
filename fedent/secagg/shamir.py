"""Shamir's t-of-n secret sharing of 32-byte secrets over the prime field GF(2^521 - 1).

A secret s is the constant term of a random polynomial of degree t - 1; holder x gets its value at x (x >= 1).
Any t shares give s by Lagrange interpolation at 0; fewer reveal nothing about it (every value of s is equally
likely). The Mersenne prime 2^521 - 1 exceeds every 32-byte secret, so no secret wraps.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

PRIME = (1 << 521) - 1
SHARE_BYTES = 66  # 521 bits
SECRET_BYTES = 32


class ShamirError(ValueError):
    """Too few shares, a bad threshold, duplicate holders."""


def split(secret: bytes, holders: Sequence[int], t: int) -> dict[int, int]:
    """holder x -> f(x) for a random f of degree t - 1 with f(0) = secret; holders are distinct ints >= 1."""
    if len(secret) != SECRET_BYTES:
        raise ShamirError(f"secrets are {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= t <= len(holders):
        raise ShamirError(f"threshold {t} must be in [1, {len(holders)}] (the number of holders)")
    if len(set(holders)) != len(holders) or min(holders) < 1:
        raise ShamirError("share holders must be distinct and >= 1")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    out: dict[int, int] = {}
    for x in holders:
        acc = 0
        for c in reversed(coeffs):  # Horner
            acc = (acc * x + c) % PRIME
        out[x] = acc
    return out


def combine(shares: Mapping[int, int], t: int) -> bytes:
    """The secret from any ``t`` of its shares (holder x -> f(x)); the first t by holder are used."""
    if len(shares) < t:
        raise ShamirError(f"{len(shares)} share(s) cannot reconstruct a secret shared with threshold {t}")
    xs = sorted(shares)[:t]
    secret = 0
    for i in xs:
        num, den = 1, 1
        for j in xs:
            if j != i:
                num = num * (-j) % PRIME
                den = den * (i - j) % PRIME
        secret = (secret + shares[i] * num * pow(den, -1, PRIME)) % PRIME
    if secret >> (8 * SECRET_BYTES):
        raise ShamirError("the shares do not reconstruct a 32-byte secret (inconsistent shares)")
    return secret.to_bytes(SECRET_BYTES, "big")
