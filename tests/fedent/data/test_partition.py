"""Partition properties: disjoint, deterministic, shard sizes, min_samples, bounded time, stable md5."""

from __future__ import annotations

import hashlib
import json
import pickle
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedent.config import ConfigError, DataConfig
from fedent.data.partition import CLASS_FLAVOUR_RETRIES, Partition, PartitionError, make_partition

SCHEME_CONFIGS = {
    "iid": {"partition": "iid"},
    "pathological": {"partition": "pathological", "shards_per_client": 2},
    "dirichlet-client": {"partition": "dirichlet", "alpha": 0.3, "dirichlet_flavour": "client"},
    "dirichlet-class": {"partition": "dirichlet", "alpha": 0.3, "dirichlet_flavour": "class"},
}


def _cfg(scheme: str, clients: int, **kw: object) -> DataConfig:
    return DataConfig(num_clients=clients, **{**SCHEME_CONFIGS[scheme], **kw})  # type: ignore[arg-type]


def mnist_like_labels(per_class: int = 6000, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))


def _check_structure(p: Partition, n: int) -> np.ndarray:
    allix = np.concatenate(p.client_indices)
    assert len(p.client_indices) == p.num_clients
    assert allix.size == np.unique(allix).size, "a sample was given to two clients"
    assert allix.size == 0 or (allix.min() >= 0 and allix.max() < n)
    for ix in p.client_indices:
        assert ix.dtype == np.int64
        assert np.all(np.diff(ix) > 0), "indices must be sorted"
        assert not ix.flags.writeable
    return allix


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scheme=st.sampled_from(sorted(SCHEME_CONFIGS)),
    n=st.integers(60, 1500),
    classes=st.integers(1, 12),
    clients=st.integers(1, 20),
    seed=st.integers(0, 2**31),
    min_samples=st.integers(0, 3),
)
def test_partition_properties(scheme: str, n: int, classes: int, clients: int, seed: int, min_samples: int) -> None:
    labels = np.random.default_rng(seed).integers(0, classes, n)
    cfg = _cfg(scheme, clients, min_samples=min_samples)
    p = make_partition(labels, cfg, seed, num_classes=classes)
    allix = _check_structure(p, n)
    counts = p.label_counts(labels)
    assert counts.shape == (clients, classes)
    assert counts.sum(axis=1).tolist() == p.sizes()
    if scheme == "pathological":
        shard = n // (2 * clients)
        assert p.sizes() == [2 * shard] * clients
        assert p.params["unused"] == n - 2 * shard * clients == n - allix.size
    else:
        assert allix.size == n, "iid and dirichlet use every sample"
    if scheme == "iid" or scheme == "dirichlet-client":
        assert max(p.sizes()) - min(p.sizes()) <= 1
    if scheme.startswith("dirichlet"):
        assert min(p.sizes()) >= min_samples
    again = make_partition(labels, cfg, seed, num_classes=classes)
    assert again.md5() == p.md5()
    assert all(np.array_equal(a, b) for a, b in zip(p.client_indices, again.client_indices, strict=True))


@pytest.mark.parametrize("scheme", sorted(SCHEME_CONFIGS))
def test_seed_changes_the_split(scheme: str) -> None:
    labels = mnist_like_labels(per_class=100)
    a = make_partition(labels, _cfg(scheme, 10), seed=0)
    b = make_partition(labels, _cfg(scheme, 10), seed=1)
    assert a.md5() != b.md5()


def test_pathological_mnist_shards() -> None:
    """MNIST, 100 clients, 2 shards each -> 200 shards of 300; every client sees at most two classes."""
    labels = mnist_like_labels()
    p = make_partition(labels, DataConfig(num_clients=100, partition="pathological", shards_per_client=2), seed=0)
    assert p.params["shard_size"] == 300 and p.params["unused"] == 0
    assert p.sizes() == [600] * 100
    counts = p.label_counts(labels)
    assert ((counts > 0).sum(axis=1) <= 2).all()
    assert set(np.unique(counts)) <= {0, 300, 600}, "each shard lies within one class"
    assert counts.sum(axis=0).tolist() == [6000] * 10


def test_pathological_too_many_shards() -> None:
    with pytest.raises(PartitionError, match="cannot fill"):
        make_partition(np.arange(10) % 2, DataConfig(num_clients=6, partition="pathological"), seed=0)
    # a config with no shards cannot be built: DataConfig declares shards_per_client >= 1
    with pytest.raises(ConfigError, match=r"data\.shards_per_client: must be >= 1, got 0"):
        DataConfig(num_clients=2, partition="pathological", shards_per_client=0)


@pytest.mark.parametrize("flavour", ["client", "class"])
def test_dirichlet_alpha_controls_skew(flavour: str) -> None:
    labels = mnist_like_labels(per_class=1000)

    def classes_per_client(alpha: float) -> float:
        cfg = DataConfig(num_clients=50, partition="dirichlet", alpha=alpha, dirichlet_flavour=flavour)
        counts = make_partition(labels, cfg, seed=0).label_counts(labels)
        share = counts / counts.sum(axis=1, keepdims=True)
        return float((share > 0.05).sum(axis=1).mean())

    skewed, mild = classes_per_client(0.05), classes_per_client(100.0)
    assert skewed < 3.0 < 9.0 < mild


@pytest.mark.parametrize("flavour", ["client", "class"])
def test_dirichlet_alpha_01_100_clients_60k_is_fast(flavour: str) -> None:
    labels = mnist_like_labels()
    cfg = DataConfig(num_clients=100, partition="dirichlet", alpha=0.1, dirichlet_flavour=flavour, min_samples=10)
    t0 = time.perf_counter()
    p = make_partition(labels, cfg, seed=0)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, f"took {elapsed:.2f}s (target well under 1 s)"
    assert min(p.sizes()) >= 10
    assert sum(p.sizes()) == 60_000


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flavour", ["client", "class"])
def test_dirichlet_500_clients_100_classes_terminates(flavour: str) -> None:
    """The configuration that makes redraw-until-min-size loops hang (CIFAR-100, alpha = 0.3)."""
    labels = mnist_like_labels(per_class=500, classes=100)
    cfg = DataConfig(num_clients=500, partition="dirichlet", alpha=0.3, dirichlet_flavour=flavour, min_samples=10)
    p = make_partition(labels, cfg, seed=0)
    _check_structure(p, labels.size)
    assert min(p.sizes()) >= 10 and sum(p.sizes()) == 50_000


def test_class_flavour_repairs_when_redraws_fail() -> None:
    """1000 samples, 90 clients, min 10, alpha 0.05: redraws essentially never succeed, so repair must."""
    labels = mnist_like_labels(per_class=100)
    cfg = DataConfig(num_clients=90, partition="dirichlet", alpha=0.05, dirichlet_flavour="class", min_samples=10)
    p = make_partition(labels, cfg, seed=0)
    _check_structure(p, labels.size)
    assert p.params["draws"] == CLASS_FLAVOUR_RETRIES
    assert p.params["repaired_samples"] > 0
    assert min(p.sizes()) >= 10 and sum(p.sizes()) == 1000


def test_min_samples_infeasible_is_a_clear_error() -> None:
    cfg = DataConfig(num_clients=50, partition="dirichlet", min_samples=30)
    with pytest.raises(PartitionError, match="cannot give 50 clients 30 samples"):
        make_partition(mnist_like_labels(per_class=100), cfg, seed=0)


@pytest.mark.parametrize(
    "labels,match",
    [(np.array([], dtype=np.int64), "non-empty"), (np.array([0, -1, 2]), "non-negative"), (np.zeros((2, 2)), "1-D")],
)
def test_bad_labels(labels: np.ndarray, match: str) -> None:
    with pytest.raises(PartitionError, match=match):
        make_partition(labels, DataConfig(num_clients=1, partition="iid"), seed=0)


def test_more_clients_than_samples() -> None:
    with pytest.raises(PartitionError, match="cannot be split"):
        make_partition(np.zeros(5, dtype=np.int64), DataConfig(num_clients=6, partition="iid"), seed=0)


def test_md5_is_pinned_for_permutation_schemes() -> None:
    """Golden values: a change here means every recorded partition.json would stop matching."""
    labels = np.arange(1000) % 10
    iid = make_partition(labels, DataConfig(num_clients=7, partition="iid"), seed=5)
    patho = make_partition(labels, DataConfig(num_clients=7, partition="pathological", shards_per_client=3), seed=5)
    assert iid.md5() == IID_MD5
    assert patho.md5() == PATHO_MD5


def test_md5_sees_every_index() -> None:
    base = Partition("iid", 2, 2, (np.array([0, 1]), np.array([2, 3])), {})
    moved = Partition("iid", 2, 2, (np.array([0]), np.array([1, 2, 3])), {})
    swapped = Partition("iid", 2, 2, (np.array([2, 3]), np.array([0, 1])), {})
    assert len({base.md5(), moved.md5(), swapped.md5()}) == 3
    # the documented layout: client count, then per client its size and its indices, all int64 little-endian
    le = b"".join(int(v).to_bytes(8, "little") for v in (2, 2, 0, 1, 2, 2, 3))
    assert base.md5() == hashlib.md5(le).hexdigest()


def test_partition_pickles() -> None:
    """Workers may receive a Partition through multiprocessing."""
    p = make_partition(mnist_like_labels(per_class=30), DataConfig(num_clients=4, partition="dirichlet"), seed=0)
    q = pickle.loads(pickle.dumps(p))
    assert q.md5() == p.md5() and dict(q.params) == dict(p.params)


def test_to_json_document() -> None:
    labels = mnist_like_labels(per_class=50)
    cfg = DataConfig(num_clients=5, partition="dirichlet", alpha=0.5, min_samples=1)
    p = make_partition(labels, cfg, seed=3)
    doc = json.loads(json.dumps(p.to_json(labels)))
    assert {"scheme", "seed", "params", "num_clients", "num_classes", "md5", "sizes", "label_counts"} <= set(doc)
    assert doc["scheme"] == "dirichlet" and doc["seed"] == 3 and doc["md5"] == p.md5()
    assert doc["params"]["alpha"] == 0.5 and doc["params"]["flavour"] == "client"
    assert np.array(doc["label_counts"]).shape == (5, 10)
    assert [sum(r) for r in doc["label_counts"]] == doc["sizes"]


IID_MD5 = "18b400db7a73571ee6e98f3688e9db3e"
PATHO_MD5 = "c3552c169f5d60b9ba1df9ab31b0724f"
