"""Key agreement, sealing and the mask generator."""

from __future__ import annotations

import numpy as np
import pytest

from fedent.secagg import crypto


def test_both_ends_agree_and_the_purpose_separates_keys() -> None:
    a, b = crypto.new_private(), crypto.new_private()
    k_ab = crypto.agree(a, crypto.public_of(b), b"x")
    assert k_ab == crypto.agree(b, crypto.public_of(a), b"x")
    assert k_ab != crypto.agree(a, crypto.public_of(b), b"y")
    assert len(k_ab) == 32


def test_a_sealed_share_opens_only_with_its_key_and_address() -> None:
    key = bytes(range(32))
    blob = crypto.seal(key, b"share", b"1|2->3")
    assert crypto.open_sealed(key, blob, b"1|2->3") == b"share"
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed(key, blob, b"1|2->4")  # re-addressed by the server
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed(bytes(32), blob, b"1|2->3")
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(crypto.CryptoError):
        crypto.open_sealed(key, tampered, b"1|2->3")


def test_the_prg_is_deterministic_per_seed_and_fits_the_ring() -> None:
    s = bytes(32)
    a, b = crypto.prg(s, 1000, 20), crypto.prg(s, 1000, 20)
    assert a.dtype == np.uint64 and np.array_equal(a, b)
    assert int(a.max()) < 2 ** 20 and int(a.max()) > 2 ** 19  # uses the whole ring, never more
    assert not np.array_equal(a, crypto.prg(bytes([1]) + bytes(31), 1000, 20))
    with pytest.raises(crypto.CryptoError):
        crypto.prg(b"short", 4, 64)
