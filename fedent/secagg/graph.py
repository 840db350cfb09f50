"""SecAgg+'s communication graph (Bell et al. 2020, Section 3): each client talks to k neighbours, not all n - 1.

The graph is a Harary graph H(n, k) over a random ordering of the round's clients: on a ring of the shuffled
clients, each is joined to its k/2 nearest on either side. Pairwise masks and secret shares run only along its
edges, so a client's work is O(k + m) instead of O(n + m); with k = O(log n) the sum stays hidden as long as the
adversary does not control a client's whole neighbourhood (their Theorem 3.6). degree 0, or k >= n - 1, is the
complete graph of Bonawitz et al. 2017. The ordering is drawn from a public seed, so anyone can check it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def neighbours(cids: Sequence[int], degree: int, seed: int) -> dict[int, list[int]]:
    """client -> its sorted neighbours (never itself). ``degree`` is rounded up to even (a Harary ring)."""
    ids = sorted(int(c) for c in cids)
    n = len(ids)
    if degree <= 0 or degree >= n - 1:
        return {c: [v for v in ids if v != c] for c in ids}
    half = (degree + 1) // 2
    order = [ids[i] for i in np.random.default_rng(seed).permutation(n)]
    out: dict[int, set[int]] = {c: set() for c in ids}
    for i, c in enumerate(order):
        for d in range(1, half + 1):
            for v in (order[(i + d) % n], order[(i - d) % n]):
                if v != c:
                    out[c].add(v)
    return {c: sorted(v) for c, v in out.items()}
