"""Long-term client identities for the malicious-server variant of secure aggregation (Bonawitz et al. 2017,
Section 6): each client signs its advertised keys and the survivor set U3 with an Ed25519 key, and checks its
peers' signatures against verification keys it did NOT get from the server. Without that, a server could
advertise its own keys in a peer's name (and read the shares sealed to it), or forge the signatures of the
consistency check.

Where the verification keys come from is the trust assumption. ``SeededPKI`` derives every client's key pair
from a secret (HKDF-SHA256(secret, "identity|cid") as the Ed25519 seed): a stand-in for a PKI that the
simulator (secret from the run seed) and the cluster's workers share. Whoever knows the secret can sign as any
client, so against a malicious aggregator the secret must be one the aggregator does not hold
(docs/security.md, "Secure aggregation", threat model).
"""

from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SIGNATURE_BYTES = 64


class SeededPKI:
    """Every client's Ed25519 key pair, derived from ``secret``; ``sign`` for the clients it hosts, ``verify``
    for anyone's signature (``public`` is the verification-key directory)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a secure-aggregation identity secret needs at least 16 bytes")
        self.secret = secret
        self._private: dict[int, Ed25519PrivateKey] = {}
        self._public: dict[int, Ed25519PublicKey] = {}

    @classmethod
    def from_seed(cls, seed: int) -> SeededPKI:
        """The simulator's PKI: the secret is a hash of the run seed (every process of the run derives it)."""
        return cls(hashlib.sha256(f"fedent-secagg identity secret|{int(seed)}".encode()).digest())

    def _key(self, cid: int) -> Ed25519PrivateKey:
        key = self._private.get(cid)
        if key is None:
            raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                       info=f"fedent-secagg identity|{int(cid)}".encode()).derive(self.secret)
            key = self._private[cid] = Ed25519PrivateKey.from_private_bytes(raw)
        return key

    def public(self, cid: int) -> bytes:
        """Client ``cid``'s verification key (raw 32 bytes)."""
        return self._verifier(cid).public_bytes(Encoding.Raw, PublicFormat.Raw)

    def _verifier(self, cid: int) -> Ed25519PublicKey:
        pub = self._public.get(cid)
        if pub is None:
            pub = self._public[cid] = self._key(cid).public_key()
        return pub

    def sign(self, cid: int, message: bytes) -> bytes:
        return self._key(cid).sign(message)

    def verify(self, cid: int, message: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is ``cid``'s on ``message`` (False for a malformed one, never an exception)."""
        if len(signature) != SIGNATURE_BYTES:
            return False
        try:
            self._verifier(int(cid)).verify(signature, message)
        except InvalidSignature:
            return False
        return True


def advertise_message(rnd: int, cid: int, c_pk: bytes, s_pk: bytes) -> bytes:
    """What a client signs in the advertise step: its two fresh public keys, bound to the round and its id."""
    return b"fedent-secagg advertise|" + f"{int(rnd)}|{int(cid)}|".encode() + c_pk + s_pk


def consistency_message(rnd: int, survivors: list[int]) -> bytes:
    """What a client signs in the consistency check: the round's U3 (sorted client ids)."""
    return b"fedent-secagg consistency|" + f"{int(rnd)}|".encode() + ",".join(str(int(c)) for c in
                                                                            sorted(survivors)).encode()
