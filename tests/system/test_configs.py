"""Every shipped config loads and validates (strict keys, registered strategies), and matches the paper."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.config import ExperimentConfig, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
TABLE_IV = {  # dataset: (lr, batch, rounds, local epochs), paper Table IV
    "mnist": (0.01, 32, 50, 3),
    "emnist-letters": (0.1, 64, 50, 3),
    "cifar10": (0.1, 20, 100, 5),
    "cifar100": (0.01, 32, 110, 3),
}
MODELS = {"mnist": "mnist-cnn", "emnist-letters": "lenet5", "cifar10": "cifar10-cnn", "cifar100": "vgg11"}
REQUIRED = ["mnist-pathological", "cifar10-dir1.0", "cifar10-dir0.5", "emnist-dir1.0", "emnist-dir0.5",
            "cifar100-dir1.0", "cifar100-dir0.5", "cifar10-100of100", "cifar10-20of200", "demo"]


def _load(name: str) -> ExperimentConfig:
    return load_config(Path(CONFIGS[0]).parent / f"{name}.yaml")


def test_required_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert set(REQUIRED) <= names, sorted(set(REQUIRED) - names)
    assert any(n.startswith("mnist-beta") for n in names) and any(n.startswith("mnist-gamma") for n in names)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_loads_and_validates(path: Path) -> None:
    cfg = load_config(path)  # strict: unknown keys, bad values and unknown algorithm options all raise
    assert cfg.name == path.stem


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.stem != "demo" and not p.stem.startswith("fmnist-")],
                         ids=lambda p: p.stem)
def test_paper_config_follows_table_iv_and_has_a_fashion_twin(path: Path) -> None:
    cfg = load_config(path)
    t = cfg.train
    assert (t.lr, t.batch_size, t.rounds, t.local_epochs) == TABLE_IV[cfg.data.name]
    assert cfg.model.name == MODELS[cfg.data.name]
    opts = cfg.algorithm.options.to_dict()
    assert cfg.algorithm.name == "fedent"
    if "beta" not in path.stem:
        assert opts["beta"] == 0.99
    if "gamma" not in path.stem:
        assert opts["gamma"] == 0.99
    twin = _load(f"fmnist-{path.stem}")
    assert twin.data.name == "fashion-mnist" and twin.model.name == "mnist-cnn"
    same = ("num_clients", "partition", "alpha", "shards_per_client", "dirichlet_flavour")
    assert all(getattr(twin.data, k) == getattr(cfg.data, k) for k in same)
    assert twin.train == cfg.train and twin.algorithm == cfg.algorithm


def test_participation_variants() -> None:
    full, big = _load("cifar10-100of100"), _load("cifar10-20of200")
    assert (full.data.num_clients, full.train.fraction) == (100, 1.0)
    assert (big.data.num_clients, big.train.fraction) == (200, 0.2)
    assert _load("mnist-pathological").data.partition == "pathological"
    assert {_load(n).data.alpha for n in ("cifar10-dir1.0", "cifar10-dir0.5")} == {1.0, 0.5}


def test_demo_is_small_and_offline() -> None:
    cfg = _load("demo")
    assert cfg.data.name == "fashion-mnist" and not cfg.data.download
    assert cfg.train.rounds <= 10 and cfg.data.num_clients <= 20
    assert cfg.data.max_train_samples is not None and cfg.data.max_train_samples <= 5000
    assert cfg.algorithm.name == "fedent"
