"""Deterministic random streams shared by the simulator and the cluster.

Every random choice (client sampling, a client's batch order, FedEnt's probe batch) draws from a
generator seeded by (run seed, purpose, round, client). The simulator and a remote worker therefore
draw identical batches, which is what lets a cluster run reproduce a simulation to 1e-5.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import torch

PURPOSES = ("sample", "train", "probe", "oracle", "init", "partition", "eval", "data", "retry", "test-split",
            "adversary", "dp",
            "secagg-graph", "secagg-rounding",
            "upload",  # upload: fedent.compress's stochastic rounding
            "validation", "fedent-shuffle")  # the validation split (issue 29); FedEnt's shuffled-rates control

# torch's process-wide generator: whoever seeds it or draws from it while other threads may (dropout's masks in a
# stacked run that trains alone, a model's initialisation) holds this, so each thread's draws follow its own seed
GLOBAL_RNG = threading.RLock()


def derive_seed(seed: int, purpose: str, round_idx: int = 0, client: int = 0) -> int:
    """A 63-bit seed from the tuple; stable across processes and Python versions (no hash())."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown rng purpose {purpose!r}; expected one of {PURPOSES}")
    key = f"{int(seed)}|{purpose}|{int(round_idx)}|{int(client)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def torch_generator(seed: int, purpose: str, round_idx: int = 0, client: int = 0) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, purpose, round_idx, client))
    return g


def numpy_rng(seed: int, purpose: str, round_idx: int = 0, client: int = 0) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, round_idx, client))


def sample_clients(seed: int, round_idx: int, num_clients: int, fraction: float) -> list[int]:
    """The round's participants: the same stream for every algorithm with the same seed (fair comparison)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"participation fraction must be in (0, 1], got {fraction}")
    k = max(1, int(round(fraction * num_clients)))
    rng = numpy_rng(seed, "sample", round_idx)
    return sorted(int(c) for c in rng.choice(num_clients, size=k, replace=False))
