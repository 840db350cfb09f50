"""Who replaces the clients of a round that missed its quorum: one deterministic stream for every world."""

from __future__ import annotations

from fedent.rng import numpy_rng


def retry_order(seed: int, rnd: int, attempt: int, num_clients: int, exclude: set[int]) -> list[int]:
    """All clients in the order of the stream derived from (seed, round, attempt), those in ``exclude``
    (they failed this round) last. An executor takes the first ``k`` of them that it can reach."""
    order = [int(c) for c in numpy_rng(seed, "retry", rnd, attempt).permutation(num_clients)]
    return [c for c in order if c not in exclude] + [c for c in order if c in exclude]
