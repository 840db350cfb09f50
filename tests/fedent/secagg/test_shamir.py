"""t-of-n sharing: any t shares rebuild the secret, fewer do not."""

from __future__ import annotations

import os

import pytest

from fedent.secagg import shamir


def test_any_t_shares_rebuild_the_secret() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, [1, 2, 5, 9, 11], 3)
    for pick in ([1, 2, 5], [9, 11, 2], [11, 5, 1, 9]):
        assert shamir.combine({x: shares[x] for x in pick}, 3) == secret


def test_fewer_than_t_shares_are_refused_or_give_another_value() -> None:
    secret = os.urandom(32)
    shares = shamir.split(secret, [1, 2, 3, 4], 3)
    with pytest.raises(shamir.ShamirError, match="cannot reconstruct"):
        shamir.combine({1: shares[1], 2: shares[2]}, 3)
    # interpolating two shares as if t were 2 does not give the secret (a random line through them)
    try:
        got = shamir.combine({1: shares[1], 2: shares[2]}, 2)
    except shamir.ShamirError:
        got = b""
    assert got != secret


def test_bad_thresholds_and_holders_are_errors() -> None:
    with pytest.raises(shamir.ShamirError):
        shamir.split(bytes(32), [1, 2], 3)
    with pytest.raises(shamir.ShamirError):
        shamir.split(bytes(32), [0, 1], 1)
    with pytest.raises(shamir.ShamirError):
        shamir.split(bytes(31), [1, 2], 1)
