"""The primitives of secure aggregation, all from ``cryptography``: key agreement, key derivation, authenticated
encryption and the pseudo-random generator that expands a 32-byte seed into a mask.

X25519 gives two clients a shared secret from each other's public key; HKDF-SHA256 turns it into a key bound to
its purpose and round (``info``), so the encryption key and the mask seed of one pair never coincide. Shares
travel through the server sealed with ChaCha20-Poly1305 under the pair's key, with the (round, sender,
receiver) triple as associated data, so the server can neither read nor re-route them. Masks are AES-256-CTR
keystreams (a PRG under the standard assumption on AES), a few GB/s with AES-NI.
"""

from __future__ import annotations

import os

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

KEY_BYTES = 32
NONCE_BYTES = 12
_ZEROS = b""


class CryptoError(ValueError):
    """A message that does not decrypt or authenticate, or a malformed key."""


def new_private() -> bytes:
    """A fresh X25519 private key (raw 32 bytes) from the OS's randomness."""
    return X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_of(private: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def agree(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """HKDF-SHA256(X25519(private, peer_public), info): 32 bytes both ends compute alike."""
    try:
        shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as e:
        raise CryptoError(f"bad X25519 key: {e}") from None
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """nonce || ChaCha20-Poly1305(key, nonce, plaintext, aad) with a random nonce."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, blob: bytes, aad: bytes) -> bytes:
    """The plaintext of ``seal``'s output; ``CryptoError`` when it was altered, re-addressed or is not ours."""
    try:
        return ChaCha20Poly1305(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
    except (InvalidTag, ValueError):
        raise CryptoError("a share does not authenticate (altered, re-addressed or not for this client)") from None


def prg(seed: bytes, n: int, ring_bits: int) -> np.ndarray:
    """``n`` uniform elements of Z_{2^ring_bits} as uint64: AES-256-CTR(seed) keystream, 8 bytes per element."""
    if len(seed) != KEY_BYTES:
        raise CryptoError(f"a mask seed is {KEY_BYTES} bytes, got {len(seed)}")
    global _ZEROS
    if len(_ZEROS) < 8 * n:  # the plaintext is all zeros: one buffer, grown as needed, serves every call
        _ZEROS = bytes(8 * n)
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    buf = np.empty(n + 2, dtype=np.uint64)  # update_into wants block_size - 1 spare bytes
    enc.update_into(memoryview(_ZEROS)[:8 * n], memoryview(buf.view(np.uint8).data))
    out = buf[:n]
    if ring_bits < 64:
        out &= np.uint64((1 << ring_bits) - 1)
    return out
