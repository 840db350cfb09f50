"""Loading real-format files (written by tests/datafiles.py) through the real search order and readers."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from datafiles import (
    EMNIST_NAMES,
    MNIST_NAMES,
    expected_pixel,
    idx_bytes,
    write_cifar,
    write_mnist_like,
    write_torchvision_mnist,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from fedent.config import ConfigError, DataConfig
from fedent.data import DatasetFormatError, DatasetNotFoundError, load_dataset
from fedent.data.datasets import SPECS
from fedent.data.idx import IdxFormatError, read_idx, read_idx_bytes


def _pixel_to_label(ds_x: torch.Tensor, name: str, channel: int = 0) -> np.ndarray:
    """Undo the normalisation of pixel (0, 0) and map the encoded value back to the label."""
    spec = SPECS[name]
    raw = ds_x[:, channel, 0, 0].numpy() * spec.std[channel] + spec.mean[channel]
    return np.rint((np.rint(raw * 255) - 3) / 7).astype(np.int64)


def _cfg(name: str, root: Path | None = None, **kw: object) -> DataConfig:
    return DataConfig(name=name, root=str(root) if root else None, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ IDX


def test_idx_roundtrip_gz_and_raw(tmp_path: Path) -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a").write_bytes(idx_bytes(arr))
    with gzip.open(tmp_path / "b.gz", "wb") as f:
        f.write(idx_bytes(arr))
    assert np.array_equal(read_idx(tmp_path / "a"), arr)
    assert np.array_equal(read_idx(tmp_path / "b.gz"), arr)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=3), seed=st.integers(0, 1000))
def test_idx_roundtrip_any_shape(shape: list[int], seed: int) -> None:
    arr = np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)
    back = read_idx_bytes(idx_bytes(arr))
    assert back.shape == arr.shape and np.array_equal(back, arr)


def test_idx_big_endian_int32() -> None:
    values = np.array([1, -2, 70000], dtype=">i4")
    data = bytes([0, 0, 0x0C, 1]) + (3).to_bytes(4, "big") + values.tobytes()
    assert read_idx_bytes(data).tolist() == [1, -2, 70000]


@pytest.mark.parametrize(
    "data,match",
    [
        (b"\x01\x00\x08\x01", "magic"),
        (b"\x00\x00\x42\x01\x00\x00\x00\x01\x00", "data type"),
        (bytes([0, 0, 8, 2]) + (2).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"\x00\x00\x00", "expected 4"),
        (bytes([0, 0, 8, 3]) + (2).to_bytes(4, "big"), "truncated"),
    ],
)
def test_idx_rejects_bad_files(data: bytes, match: str) -> None:
    with pytest.raises(IdxFormatError, match=match):
        read_idx_bytes(data)


# ---------------------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("gz", [True, False])
def test_flat_mnist_in_root(tmp_path: Path, gz: bool) -> None:
    written = write_mnist_like(tmp_path, gz=gz)
    ds = load_dataset(_cfg("mnist", tmp_path), system_dirs=[])
    assert ds.source == f"root:{tmp_path}"
    assert ds.x_train.shape == (120, 1, 28, 28) and ds.x_test.shape == (40, 1, 28, 28)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert (ds.num_classes, ds.in_channels, ds.image_size) == (10, 1, 28)
    assert np.array_equal(ds.y_train.numpy(), written["y_train"])
    assert np.array_equal(_pixel_to_label(ds.x_train, "mnist"), written["y_train"])
    expected = (expected_pixel(written["y_test"][:1])[0] / 255.0 - 0.1307) / 0.3081
    assert torch.allclose(ds.x_test[0], torch.full((1, 28, 28), float(expected)), atol=1e-5)


def test_flat_in_dataset_named_subdir_with_dot_names(tmp_path: Path) -> None:
    names = tuple(n.replace("-idx", ".idx") for n in MNIST_NAMES)
    write_mnist_like(tmp_path / "fashion-mnist", gz=False, names=names)  # type: ignore[arg-type]
    ds = load_dataset(_cfg("fashion-mnist", tmp_path), system_dirs=[])
    assert ds.source == f"root:{tmp_path / 'fashion-mnist'}"
    assert ds.num_train == 120


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_torchvision_layout(tmp_path: Path, name: str) -> None:
    written = write_torchvision_mnist(tmp_path, name)
    ds = load_dataset(_cfg(name, tmp_path), system_dirs=[])
    assert "torchvision layout" in ds.source
    assert np.array_equal(ds.y_test.numpy(), written["y_test"])
    assert np.array_equal(_pixel_to_label(ds.x_train, name), written["y_train"])


def test_torchvision_layout_with_only_gz_files_falls_back_to_own_reader(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "MNIST" / "raw", gz=True)
    ds = load_dataset(_cfg("mnist", tmp_path), system_dirs=[])
    assert ds.source == f"root:{tmp_path / 'MNIST' / 'raw'}"


@pytest.mark.parametrize("layout", ["torchvision", "flat"])
def test_emnist_letters_labels_shift_and_transpose(tmp_path: Path, layout: str) -> None:
    if layout == "torchvision":
        written = write_torchvision_mnist(tmp_path, "emnist-letters", num_classes=26, label_offset=1, marker=True)
    else:
        written = write_mnist_like(tmp_path, num_classes=26, names=EMNIST_NAMES, label_offset=1, marker=True)
    assert written["y_train"].min() >= 1 and written["y_train"].max() <= 26  # stored as 1..26
    ds = load_dataset(_cfg("emnist-letters", tmp_path), system_dirs=[])
    assert ds.num_classes == 26
    assert np.array_equal(ds.y_train.numpy(), written["y_train"].astype(np.int64) - 1)
    assert ds.y_train.min() >= 0 and ds.y_train.max() <= 25
    # the marker written at stored (row 0, col 5) appears at (row 5, col 0): images are made upright
    top = (255 / 255.0 - 0.1722) / 0.3309
    assert torch.allclose(ds.x_train[:, 0, 5, 0], torch.full((120,), top), atol=1e-5)
    assert not torch.allclose(ds.x_train[:, 0, 0, 5], torch.full((120,), top), atol=1e-5)


@pytest.mark.parametrize("direct", [False, True])
def test_cifar10(tmp_path: Path, direct: bool) -> None:
    written = write_cifar(tmp_path)
    root = tmp_path / "cifar-10-batches-py" if direct else tmp_path
    ds = load_dataset(_cfg("cifar10", root), system_dirs=[])
    assert ds.x_train.shape == (100, 3, 32, 32) and ds.x_test.shape == (30, 3, 32, 32)
    assert (ds.num_classes, ds.in_channels, ds.image_size) == (10, 3, 32)
    assert np.array_equal(ds.y_train.numpy(), written["y_train"])
    assert np.array_equal(_pixel_to_label(ds.x_train, "cifar10"), written["y_train"])
    green = (50 / 255.0 - 0.4822) / 0.2435
    assert torch.allclose(ds.x_train[:, 1], torch.full((100, 32, 32), green), atol=1e-5)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    written = write_cifar(tmp_path, hundred=True)
    ds = load_dataset(_cfg("cifar100", tmp_path), system_dirs=[])
    assert ds.num_classes == 100 and ds.x_train.shape == (100, 3, 32, 32)
    assert np.array_equal(ds.y_train.numpy(), written["y_train"])
    assert np.array_equal(_pixel_to_label(ds.x_train, "cifar100"), written["y_train"] % 36)


def test_cifar_refuses_code_in_pickles(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    flag = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple:
            return (Path.touch, (flag,))

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": [0]}, f)
    with pytest.raises(DatasetFormatError, match="refusing to unpickle"):
        load_dataset(_cfg("cifar10", tmp_path), system_dirs=[])
    assert not flag.exists()


# ------------------------------------------------------------------------------------- search order


def test_system_dir_is_searched(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "sys" / "fashion-mnist", gz=True)
    ds = load_dataset(_cfg("fashion-mnist"), system_dirs=[tmp_path / "none", tmp_path / "sys"])
    assert ds.source == f"system:{tmp_path / 'sys' / 'fashion-mnist'}"


def test_root_wins_over_system_dir(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "sys" / "mnist", n_train=50)
    write_mnist_like(tmp_path / "root", n_train=70)
    ds = load_dataset(_cfg("mnist", tmp_path / "root"), system_dirs=[tmp_path / "sys"])
    assert ds.num_train == 70 and ds.source.startswith("root:")


def test_missing_root_files_fall_back_to_system_dir_and_say_so(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A root holding other datasets (not this one) falls back to the OS copy, with one line saying so."""
    write_mnist_like(tmp_path / "root" / "other-dataset", n_train=10)
    write_mnist_like(tmp_path / "sys" / "mnist", n_train=50)
    ds = load_dataset(_cfg("mnist", tmp_path / "root"), system_dirs=[tmp_path / "sys"])
    assert ds.num_train == 50 and ds.source.startswith("system:")
    assert f"data.root {tmp_path / 'root'} holds no mnist files; reading the OS copy" in capsys.readouterr().err


def test_an_empty_root_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    """An existing but empty data.root (a mount that failed) must not silently read the OS copy instead."""
    (tmp_path / "root").mkdir()
    write_mnist_like(tmp_path / "sys" / "mnist", n_train=50)
    with pytest.raises(DatasetNotFoundError,
                       match=r"dataset 'mnist' not found.*\[data.root / --data-root .*root is empty, so no other copy"):
        load_dataset(_cfg("mnist", tmp_path / "root"), system_dirs=[tmp_path / "sys"])


def test_missing_root_directory_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    """A data.root that does not exist is a typo to report, even when the OS copy would load."""
    write_mnist_like(tmp_path / "sys" / "mnist", n_train=50)
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(_cfg("mnist", tmp_path / "nope"), system_dirs=[tmp_path / "sys"])
    msg = str(info.value)
    assert str(tmp_path / "nope") in msg and "no such directory" in msg and "\n" not in msg


def test_missing_dataset_error_names_the_three_options(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(_cfg("mnist", tmp_path), system_dirs=[tmp_path / "sys"])
    msg = str(info.value)
    assert "\n" not in msg
    assert "data.root" in msg and "--data-root" in msg  # (1)
    assert "OS package" in msg and str(tmp_path / "sys" / "mnist") in msg  # (2)
    assert "data.download: true" in msg  # (3)
    assert str(tmp_path) in msg


def test_partial_files_are_not_found(tmp_path: Path) -> None:
    write_mnist_like(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetNotFoundError):
        load_dataset(_cfg("mnist", tmp_path), system_dirs=[])


def test_download_failure_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The download path is never run for real in tests; a failing download must still end in one line."""
    import fedent.data.datasets as datasets

    calls: list[tuple[Path, bool]] = []

    def fake_tv(spec: object, root: Path, train: bool, download: bool) -> None:
        calls.append((root, download))
        raise OSError("network is unreachable")

    monkeypatch.setattr(datasets, "_tv_dataset", fake_tv)
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(_cfg("cifar10", tmp_path, download=True), system_dirs=[])
    assert calls == [(tmp_path, True)]
    assert "network is unreachable" in str(info.value) and "\n" not in str(info.value)


def test_truncated_file_is_a_format_error(tmp_path: Path) -> None:
    write_mnist_like(tmp_path, gz=False)
    p = tmp_path / "train-images-idx3-ubyte"
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(DatasetFormatError, match="train-images-idx3-ubyte"):
        load_dataset(_cfg("mnist", tmp_path), system_dirs=[])


def test_labels_out_of_range_are_a_format_error(tmp_path: Path) -> None:
    write_mnist_like(tmp_path, num_classes=12)
    with pytest.raises(DatasetFormatError, match="labels must lie in 0..9"):
        load_dataset(_cfg("mnist", tmp_path), system_dirs=[])


def test_unknown_dataset_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'svhn'"):
        load_dataset(_cfg("svhn"), system_dirs=[])


# ------------------------------------------------------------------------------------ subsampling


def test_subsample_is_seeded_and_keeps_pairs(tmp_path: Path) -> None:
    written = write_mnist_like(tmp_path, n_train=200, n_test=60)
    cfg = _cfg("mnist", tmp_path, max_train_samples=50, max_test_samples=20)
    a = load_dataset(cfg, seed=1, system_dirs=[])
    b = load_dataset(cfg, seed=1, system_dirs=[])
    c = load_dataset(cfg, seed=2, system_dirs=[])
    assert a.num_train == 50 and a.num_test == 20
    assert torch.equal(a.y_train, b.y_train) and torch.equal(a.x_train, b.x_train)
    assert not torch.equal(a.y_train, c.y_train)
    assert np.array_equal(_pixel_to_label(a.x_train, "mnist"), a.y_train.numpy())
    assert set(a.y_train.tolist()) <= set(written["y_train"].tolist())


def test_subsample_larger_than_dataset_keeps_everything(tmp_path: Path) -> None:
    write_mnist_like(tmp_path)
    ds = load_dataset(_cfg("mnist", tmp_path, max_train_samples=10_000), system_dirs=[])
    assert ds.num_train == 120
