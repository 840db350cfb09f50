"""Splitting a train set over N clients: IID, pathological shards, Dirichlet label skew (paper Section VI).

All schemes draw from ``fedent.rng.numpy_rng(seed, "partition")`` only, so a (labels, config, seed) triple
gives the same split in the simulator, on every worker and in ``fedent partition``. Every sample goes to
at most one client; which samples stay unused is documented per scheme (docs/data.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedent.config import DataConfig
from fedent.rng import numpy_rng

SCHEMES = ("iid", "pathological", "dirichlet")
FLAVOURS = ("client", "class")
CLASS_FLAVOUR_RETRIES = 10  # full redraws for the "class" flavour before the deterministic repair


class PartitionError(ValueError):
    """The requested split is impossible (e.g. fewer samples than clients x min_samples)."""


@dataclass(frozen=True, eq=False)
class Partition:
    scheme: str
    num_clients: int
    num_classes: int
    client_indices: tuple[np.ndarray, ...]  # int64 sample indices per client, sorted, read-only
    params: Mapping[str, Any]  # alpha, flavour, seed, shards...

    def sizes(self) -> list[int]:
        return [int(ix.size) for ix in self.client_indices]

    def label_counts(self, labels: np.ndarray) -> np.ndarray:
        """num_clients x num_classes matrix of how many samples of each class each client holds."""
        labels = np.asarray(labels)
        out = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        for k, ix in enumerate(self.client_indices):
            out[k] = np.bincount(labels[ix], minlength=self.num_classes)[: self.num_classes]
        return out

    def md5(self) -> str:
        """Digest of the assignment alone (client count, then each client's size and indices, little-endian)."""
        h = hashlib.md5()
        h.update(int(self.num_clients).to_bytes(8, "little"))
        for ix in self.client_indices:
            h.update(int(ix.size).to_bytes(8, "little"))
            h.update(np.ascontiguousarray(ix, dtype="<i8").tobytes())
        return h.hexdigest()

    def to_json(self, labels: np.ndarray) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "seed": self.params.get("seed"),
            "params": {k: _plain(v) for k, v in self.params.items()},
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "md5": self.md5(),
            "sizes": self.sizes(),
            "label_counts": self.label_counts(labels).tolist(),
        }


def _plain(v: Any) -> Any:
    """JSON-friendly version of numpy scalars."""
    return v.item() if isinstance(v, np.generic) else v


def _finish(scheme: str, groups: list[np.ndarray], num_classes: int, params: dict[str, Any]) -> Partition:
    frozen = []
    for g in groups:
        a = np.sort(np.asarray(g, dtype=np.int64))
        a.setflags(write=False)
        frozen.append(a)
    return Partition(scheme, len(groups), num_classes, tuple(frozen), dict(params))


# ------------------------------------------------------------------------------------------- schemes


def partition_iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into num_clients parts whose sizes differ by at most one (all samples used)."""
    return list(np.array_split(rng.permutation(n), num_clients))


def partition_pathological(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """McMahan et al. (2017): sort by label, cut S*N equal shards, give every client S random shards.

    When S*N does not divide the sample count, ``n mod (S*N)`` randomly chosen samples are left unused
    so that all shards are equal (MNIST, 100 clients, S=2: 200 shards of 300, nothing unused).
    """
    n = labels.size
    if shards_per_client < 1:
        raise PartitionError(f"pathological: shards_per_client must be >= 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    shard_size = n // num_shards
    if shard_size < 1:
        raise PartitionError(
            f"pathological: {n} samples cannot fill {num_shards} shards ({num_clients} clients x {shards_per_client})"
        )
    used = shard_size * num_shards
    keep = np.arange(n) if used == n else np.sort(rng.choice(n, size=used, replace=False))
    order = keep[np.argsort(labels[keep], kind="stable")]
    shards = order.reshape(num_shards, shard_size)
    assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    groups = [shards[a].reshape(-1) for a in assignment]
    return groups, {"shards_per_client": shards_per_client, "shard_size": shard_size, "unused": n - used}


def _class_pools(labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's sample indices in a random order (clients take consecutive runs from them)."""
    order = np.argsort(labels, kind="stable")
    bounds = np.cumsum(np.bincount(labels, minlength=num_classes))[:-1]
    return [rng.permutation(p) for p in np.split(order, bounds)]


def partition_dirichlet_client(
    labels: np.ndarray, num_classes: int, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Hsu et al. (2019): client k draws q_k ~ Dir(alpha * p) (p = the class prior) and fills an equal quota.

    Quotas are n // N (+1 for the first n mod N clients), so every sample is used and sizes differ by at
    most one. Classes a client wants but that have run out are replaced by draws from q_k restricted to
    the classes still available (or from what is left, if q_k's support is exhausted). Each refill either
    meets the quota or empties a class, so a client needs at most num_classes + 1 draws: no unbounded loop.
    Clients are filled in a random order, since the last ones filled get the leftovers (less skew).
    """
    n = labels.size
    counts = np.bincount(labels, minlength=num_classes)
    prior = counts / n
    support = prior > 0
    avail = counts.astype(np.int64).copy()
    quotas = np.full(num_clients, n // num_clients, dtype=np.int64)
    quotas[: n % num_clients] += 1
    take = np.zeros((num_clients, num_classes), dtype=np.int64)
    for k in rng.permutation(num_clients):  # random fill order: no client id is always served last
        q = np.zeros(num_classes)
        q[support] = rng.dirichlet(alpha * prior[support] * support.sum())
        if not (np.all(np.isfinite(q)) and q.sum() > 0):  # tiny alpha can underflow; fall back to the prior
            q = prior.copy()
        need = int(quotas[k])
        while need > 0:
            w = q * (avail > 0)
            if w.sum() <= 0:
                w = avail.astype(np.float64)
            draw = rng.multinomial(need, w / w.sum())
            got = np.minimum(draw, avail)
            take[k] += got
            avail -= got
            need -= int(got.sum())
    return _assign_counts(_class_pools(labels, num_classes, rng), take)


def _assign_counts(pools: list[np.ndarray], take: np.ndarray) -> list[np.ndarray]:
    """Client k gets take[k, c] consecutive samples of class c's (shuffled) pool."""
    starts = np.vstack([np.zeros((1, take.shape[1]), dtype=np.int64), np.cumsum(take, axis=0)])
    groups = []
    for k in range(take.shape[0]):
        parts = [pools[c][starts[k, c] : starts[k + 1, c]] for c in range(take.shape[1]) if take[k, c]]
        groups.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    return groups


def _class_flavour_counts(counts: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """One draw of the per-class split: class c's samples go to clients in proportions p_c ~ Dir(alpha)."""
    take = np.zeros((num_clients, counts.size), dtype=np.int64)
    for c, m in enumerate(counts):
        if m == 0:
            continue
        p = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(p) * m).astype(np.int64)[:-1]
        take[:, c] = np.diff(np.concatenate([[0], np.clip(cuts, 0, m), [m]]))
    return take


def _repair_min_samples(take: np.ndarray, min_samples: int) -> int:
    """Move samples from the largest clients to those below ``min_samples``; returns how many moved.

    A donor gives from the class it holds most of (which keeps the label skew), and never drops below
    ``min_samples`` itself. Each move shrinks the total deficit, so this ends (the caller checks
    n >= N * min_samples beforehand).
    """
    moved = 0
    sizes = take.sum(axis=1)
    for k in np.flatnonzero(sizes < min_samples):
        while sizes[k] < min_samples:
            donor = int(np.argmax(sizes))
            spare = int(sizes[donor]) - min_samples
            c = int(np.argmax(take[donor]))
            m = min(min_samples - int(sizes[k]), spare, int(take[donor, c]))
            take[donor, c] -= m
            take[k, c] += m
            sizes[donor] -= m
            sizes[k] += m
            moved += m
    return moved


def partition_dirichlet_class(
    labels: np.ndarray,
    num_classes: int,
    num_clients: int,
    alpha: float,
    min_samples: int,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The common framework flavour: per class, proportions over clients p_c ~ Dir(alpha) (all samples used).

    Frameworks redraw until every client has ``min_samples``, which can loop forever (500 clients on
    CIFAR-100 with alpha = 0.3). Here: at most CLASS_FLAVOUR_RETRIES draws, keep the one with the largest
    smallest client, then repair it deterministically (``_repair_min_samples``).
    """
    counts = np.bincount(labels, minlength=num_classes)
    best, tries = None, 0
    for tries in range(1, CLASS_FLAVOUR_RETRIES + 1):  # noqa: B007 - the count is reported
        take = _class_flavour_counts(counts, num_clients, alpha, rng)
        if best is None or take.sum(axis=1).min() > best.sum(axis=1).min():
            best = take
        if best.sum(axis=1).min() >= min_samples:
            break
    assert best is not None
    moved = _repair_min_samples(best, min_samples)
    groups = _assign_counts(_class_pools(labels, num_classes, rng), best)
    return groups, {"draws": tries, "repaired_samples": moved}


# ------------------------------------------------------------------------------------------- entry point


def make_partition(labels: np.ndarray, cfg: DataConfig, seed: int, num_classes: int | None = None) -> Partition:
    """Split sample indices 0..len(labels)-1 over ``cfg.num_clients`` clients by ``cfg.partition``."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise PartitionError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise PartitionError("labels must be non-negative integers")
    labels = labels.astype(np.int64, copy=False)
    c = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if labels.max() >= c:
        raise PartitionError(f"labels go up to {labels.max()} but num_classes is {c}")
    n, N = labels.size, int(cfg.num_clients)
    if N < 1:
        raise PartitionError(f"num_clients must be >= 1, got {N}")
    if n < N:
        raise PartitionError(f"{n} samples cannot be split over {N} clients")
    rng = numpy_rng(seed, "partition")
    params: dict[str, Any] = {"seed": int(seed)}
    if cfg.partition == "iid":
        groups = partition_iid(n, N, rng)
    elif cfg.partition == "pathological":
        groups, extra = partition_pathological(labels, N, int(cfg.shards_per_client), rng)
        params.update(extra)
    elif cfg.partition == "dirichlet":
        alpha, flavour, min_samples = float(cfg.alpha), cfg.dirichlet_flavour, int(cfg.min_samples)
        if not alpha > 0:
            raise PartitionError(f"dirichlet: alpha must be > 0, got {alpha}")
        if flavour not in FLAVOURS:
            raise PartitionError(f"dirichlet: flavour must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
        if n < N * min_samples:
            raise PartitionError(
                f"dirichlet: {n} samples cannot give {N} clients {min_samples} samples each (lower --min-samples)"
            )
        params.update({"alpha": alpha, "flavour": flavour, "min_samples": min_samples})
        if flavour == "client":
            groups = partition_dirichlet_client(labels, c, N, alpha, rng)
        else:
            groups, extra = partition_dirichlet_class(labels, c, N, alpha, min_samples, rng)
            params.update(extra)
    else:
        raise PartitionError(f"unknown partition scheme {cfg.partition!r}; expected one of {', '.join(SCHEMES)}")
    return _finish(cfg.partition, groups, c, params)
