"""Secure aggregation (SecAgg+, Bell et al. 2020, on Bonawitz et al. 2017): the aggregator learns the sum of the
clients' vectors and nothing else about any one of them.

Pure protocol code, no transport: ``crypto`` (X25519, HKDF, ChaCha20-Poly1305, the AES-CTR mask generator),
``shamir`` (t-of-n sharing over a prime field), ``fixedpoint`` (floats to the ring Z_{2^k} and back), ``graph``
(SecAgg+'s random k-regular communication graph), ``identity`` (the clients' long-term Ed25519 keys of the
malicious-server variant), ``protocol`` (one client's and the server's state machines,
messages as bytes), ``hosted`` (the clients of a host) and ``coordinator`` (the engine's side). See
docs/security.md, "Secure aggregation".
"""
