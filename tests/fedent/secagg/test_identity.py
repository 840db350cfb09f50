"""The seeded PKI: every process of a run derives the same identities, a signature verifies only for its client
and message, and anything malformed is a plain False."""

from __future__ import annotations

import pytest

from fedent.secagg.identity import SeededPKI, advertise_message, consistency_message


def test_identities_are_per_client_and_the_same_in_every_process() -> None:
    a, b = SeededPKI.from_seed(3), SeededPKI.from_seed(3)
    assert a.public(1) == b.public(1) and len(a.public(1)) == 32
    assert a.public(1) != a.public(2) and a.public(1) != SeededPKI.from_seed(4).public(1)
    sig = a.sign(1, b"m")
    assert b.verify(1, b"m", sig)
    assert not b.verify(2, b"m", sig)  # another client's key
    assert not b.verify(1, b"m2", sig)  # another message
    assert not SeededPKI.from_seed(4).verify(1, b"m", sig)  # another PKI
    assert not b.verify(1, b"m", sig[:-1]) and not b.verify(1, b"m", bytes(64))
    with pytest.raises(ValueError, match="16 bytes"):
        SeededPKI(b"short")


def test_the_signed_messages_bind_round_client_and_the_sorted_set() -> None:
    assert consistency_message(2, [3, 1]) == consistency_message(2, [1, 3]) == b"fedent-secagg consistency|2|1,3"
    assert consistency_message(2, [1, 3]) != consistency_message(3, [1, 3])
    assert consistency_message(2, [1, 3]) != consistency_message(2, [1, 3, 4])
    k = bytes(32)
    assert advertise_message(1, 2, k, k) != advertise_message(1, 3, k, k) != advertise_message(2, 2, k, k)
