"""Datasets of the paper (MNIST, EMNIST-Letters, CIFAR-10, CIFAR-100) plus Fashion-MNIST and a synthetic set.

Where the files come from, in order (docs/data.md):

1. ``cfg.root``, which must exist and not be empty when given (unless ``cfg.download`` may fill it; a root
   holding only other datasets falls back to 2. with one line on stderr): torchvision's layout
   (``ROOT/FashionMNIST/raw/...``, ``ROOT/cifar-10-batches-py/``) or a flat
   directory holding the raw files (``*-ubyte[.gz]``, the CIFAR batches);
2. an OS-packaged copy, ``<system_dir>/<dataset-name>/`` (Debian's ``dataset-fashion-mnist`` installs
   ``/usr/share/datasets/fashion-mnist/*-ubyte.gz``);
3. torchvision's download, only when ``cfg.download`` is true (into ``cfg.root`` or ``./data``).

Everything comes back as whole tensors (float32 NCHW, normalised with the dataset's usual mean/std;
int64 0-based labels), because the trainer indexes batches straight out of them.

Why ~420 lines in one module: the specs, the file readers and the assembly into tensors implement the one
lookup order above; the readers are private steps of ``find_raw`` (``fedent.data.local`` borrows
``_search_dir``), and making them a public module would save only ~20 lines over 400.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedent.config import ConfigError, DataConfig
from fedent.data.cifar import (
    CIFAR10_DIR,
    CIFAR10_TEST,
    CIFAR10_TRAIN,
    CIFAR100_DIR,
    CIFAR100_TEST,
    CIFAR100_TRAIN,
    CifarFormatError,
    read_cifar_dir,
)
from fedent.data.idx import IdxFormatError, find_idx_file, read_idx
from fedent.data.synthetic import make_synthetic
from fedent.rng import numpy_rng

DATASETS = ("mnist", "fashion-mnist", "emnist-letters", "cifar10", "cifar100", "synthetic")
DEFAULT_SYSTEM_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets"),)
DEFAULT_DOWNLOAD_ROOT = Path("data")


class DatasetError(RuntimeError):
    """Base of the data-loading errors; the message is one line, fit for a CLI."""


class DatasetNotFoundError(DatasetError):
    """No copy of the dataset was found; the message names the three ways to provide one."""


class DatasetFormatError(DatasetError):
    """A file was found but is not in the expected format (truncated, wrong shape, labels out of range)."""


@dataclass(frozen=True, eq=False)
class FedDataset:
    name: str
    x_train: torch.Tensor = field(repr=False)  # float32, N x C x H x W, normalised
    y_train: torch.Tensor = field(repr=False)  # int64, 0-based class ids
    x_test: torch.Tensor = field(repr=False)
    y_test: torch.Tensor = field(repr=False)
    num_classes: int
    in_channels: int
    image_size: int
    source: str  # "root:/path", "system:/usr/share/...", "download:/path", "synthetic"

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])


@dataclass(frozen=True)
class DatasetSpec:
    """Static facts about one dataset: shapes, normalisation, file names, torchvision class."""

    name: str
    kind: str  # "idx" | "cifar" | "synthetic"
    num_classes: int
    in_channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    tv_class: str = ""  # torchvision.datasets class name
    tv_kwargs: tuple[tuple[str, str], ...] = ()
    idx_files: tuple[str, str, str, str] = ("", "", "", "")  # train images, train labels, test images, test labels
    cifar_dir: str = ""
    cifar_files: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    label_key: str = "labels"
    label_offset: int = 0  # EMNIST-Letters labels are 1..26
    transpose: bool = False  # EMNIST images are stored transposed


_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_EMNIST_FILES = (
    "emnist-letters-train-images-idx3-ubyte",
    "emnist-letters-train-labels-idx1-ubyte",
    "emnist-letters-test-images-idx3-ubyte",
    "emnist-letters-test-labels-idx1-ubyte",
)

SPECS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec("mnist", "idx", 10, 1, 28, (0.1307,), (0.3081,), "MNIST", idx_files=_MNIST_FILES),
    "fashion-mnist": DatasetSpec(
        "fashion-mnist", "idx", 10, 1, 28, (0.2860,), (0.3530,), "FashionMNIST", idx_files=_MNIST_FILES
    ),
    "emnist-letters": DatasetSpec(
        "emnist-letters",
        "idx",
        26,
        1,
        28,
        (0.1722,),
        (0.3309,),
        "EMNIST",
        tv_kwargs=(("split", "letters"),),
        idx_files=_EMNIST_FILES,
        label_offset=1,
        transpose=True,
    ),
    "cifar10": DatasetSpec(
        "cifar10",
        "cifar",
        10,
        3,
        32,
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        "CIFAR10",
        cifar_dir=CIFAR10_DIR,
        cifar_files=(CIFAR10_TRAIN, CIFAR10_TEST),
        label_key="labels",
    ),
    "cifar100": DatasetSpec(
        "cifar100",
        "cifar",
        100,
        3,
        32,
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        "CIFAR100",
        cifar_dir=CIFAR100_DIR,
        cifar_files=(CIFAR100_TRAIN, CIFAR100_TEST),
        label_key="fine_labels",
    ),
    "synthetic": DatasetSpec("synthetic", "synthetic", 10, 1, 28, (0.0,), (1.0,)),
}


@dataclass(frozen=True, eq=False)
class RawData:
    """Images as stored (uint8 N x C x H x W) and 0-based labels, before normalisation."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def get_spec(name: str) -> DatasetSpec:
    if name not in SPECS:
        raise ConfigError(f"data.name: unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    return SPECS[name]


# --------------------------------------------------------------------------------------------- readers


def _read_idx_dir(spec: DatasetSpec, directory: Path) -> Arrays | None:
    """The four IDX files from one flat directory, or None when any is missing."""
    paths = [find_idx_file(directory, base) for base in spec.idx_files]
    if any(p is None for p in paths):
        return None
    try:
        return tuple(read_idx(p) for p in paths if p is not None)  # type: ignore[return-value]
    except IdxFormatError as e:
        raise DatasetFormatError(f"dataset {spec.name}: {e}") from None


def _read_cifar(spec: DatasetSpec, directory: Path) -> Arrays | None:
    try:
        return read_cifar_dir(directory, spec.cifar_files[0], spec.cifar_files[1], spec.label_key)
    except CifarFormatError as e:
        raise DatasetFormatError(f"dataset {spec.name}: {e}") from None


def _tv_dataset(spec: DatasetSpec, root: Path, train: bool, download: bool) -> Any:
    import torchvision.datasets as tvd  # lazy: torchvision is slow to import and only needed here

    cls = getattr(tvd, spec.tv_class)
    return cls(str(root), train=train, download=download, **dict(spec.tv_kwargs))


def _read_torchvision(spec: DatasetSpec, root: Path, download: bool) -> Arrays:
    """Through torchvision's own classes: its layout under ``root`` (or its download into it)."""
    parts = []
    for train in (True, False):
        ds = _tv_dataset(spec, root, train, download)
        data, targets = ds.data, ds.targets
        parts.append(np.asarray(data.numpy() if isinstance(data, torch.Tensor) else data))
        parts.append(np.asarray(targets.numpy() if isinstance(targets, torch.Tensor) else targets, dtype=np.int64))
    return parts[0], parts[1], parts[2], parts[3]


def _flat_dirs(spec: DatasetSpec, base: Path) -> list[Path]:
    """Directories under ``base`` that may hold the raw files directly."""
    if spec.kind == "cifar":
        return [base / spec.cifar_dir, base, base / spec.name / spec.cifar_dir, base / spec.name]
    return [base, base / spec.name, base / spec.tv_class / "raw"]


def _search_dir(spec: DatasetSpec, base: Path) -> tuple[Arrays, Path] | None:
    reader: Callable[[DatasetSpec, Path], Arrays | None] = _read_cifar if spec.kind == "cifar" else _read_idx_dir
    for d in _flat_dirs(spec, base):
        if d.is_dir():
            found = reader(spec, d)
            if found is not None:
                return found, d
    return None


def _tv_layout_present(spec: DatasetSpec, root: Path) -> bool:
    raw = root / spec.tv_class / "raw"
    return spec.kind == "idx" and raw.is_dir() and all((raw / f).is_file() for f in spec.idx_files)


def _not_found(spec: DatasetSpec, root: Path | None, system_dirs: Sequence[Path], download: bool) -> str:
    searched = [str(root) if root else "(no data.root set)"] + [str(Path(d) / spec.name) for d in system_dirs]
    if spec.kind == "cifar":
        layout = f"ROOT/{spec.cifar_dir}/"
    else:
        layout = f"ROOT/{spec.tv_class}/raw/ or {spec.idx_files[0]}[.gz] etc."
    why_dl = "download failed" if download else "download is off"
    return (
        f"dataset {spec.name!r} not found (searched: {', '.join(searched)}; {why_dl}). Provide it one of three ways: "
        f"(1) data.root / --data-root pointing at a directory with {layout}; "
        f"(2) an OS package installing it under <dir>/{spec.name}/ (e.g. Debian's dataset-fashion-mnist -> "
        f"/usr/share/datasets/fashion-mnist/); "
        f"(3) data.download: true to let torchvision download it into data.root or ./data"
    )


def find_raw(spec: DatasetSpec, root: Path | None, download: bool, system_dirs: Sequence[Path]) -> RawData:
    """Search root, then the OS-packaged copies, then torchvision's download (docs/data.md)."""
    arrays: Arrays | None = None
    source = ""
    if root is not None and not root.is_dir() and not download:
        # an explicit root that is not there is a mistake to report, not a reason to read another copy
        raise DatasetNotFoundError(f"data.root / --data-root {root}: no such directory (dataset {spec.name!r})")
    if root is not None and not download and not any(root.iterdir()):
        # nor is an empty one (a mount that failed, a copy not made yet): reading the OS copy would hide it
        raise DatasetNotFoundError(_not_found(spec, root, system_dirs, download) + f" [data.root / --data-root {root} "
                                   "is empty, so no other copy is read instead]")
    if root is not None:
        if _tv_layout_present(spec, root):
            arrays, source = _read_torchvision(spec, root, download=False), f"root:{root} (torchvision layout)"
        else:
            hit = _search_dir(spec, root)
            if hit is not None:
                arrays, source = hit[0], f"root:{hit[1]}"
    if arrays is None:
        for sd in system_dirs:
            hit = _search_dir(spec, Path(sd) / spec.name) if (Path(sd) / spec.name).is_dir() else None
            if hit is not None:
                arrays, source = hit[0], f"system:{hit[1]}"
                if root is not None:  # a root shared by other datasets: said, not silent
                    print(f"data.root {root} holds no {spec.name} files; reading the OS copy {hit[1]}",
                          file=sys.stderr)
                break
    if arrays is None and download:
        target = root if root is not None else DEFAULT_DOWNLOAD_ROOT
        try:
            arrays, source = _read_torchvision(spec, target, download=True), f"download:{target}"
        except Exception as e:  # network, disk, checksum: all end in the same one-line error
            raise DatasetNotFoundError(
                _not_found(spec, root, system_dirs, True) + f" [download error: {e.__class__.__name__}: {e}]"
            ) from None
    if arrays is None:
        raise DatasetNotFoundError(_not_found(spec, root, system_dirs, download))
    return _to_nchw(spec, arrays, source)


def _to_nchw(spec: DatasetSpec, arrays: Arrays, source: str) -> RawData:
    """Shape checks, uint8 N x C x H x W, EMNIST transpose and label offset."""
    out = []
    for x, y, split in ((arrays[0], arrays[1], "train"), (arrays[2], arrays[3], "test")):
        x = np.asarray(x)
        y = np.asarray(y).astype(np.int64).reshape(-1) - spec.label_offset
        if x.ndim == 3:
            x = x[:, None, :, :]
        elif x.ndim == 4 and x.shape[-1] == spec.in_channels and x.shape[1] != spec.in_channels:
            x = x.transpose(0, 3, 1, 2)  # torchvision's CIFAR arrays are N x H x W x C
        if spec.transpose:
            x = x.transpose(0, 1, 3, 2)
        want = (spec.in_channels, spec.image_size, spec.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != want:
            raise DatasetFormatError(
                f"dataset {spec.name} ({source}): {split} images have shape {x.shape}, expected N x {want}"
            )
        if x.shape[0] != y.shape[0]:
            raise DatasetFormatError(
                f"dataset {spec.name} ({source}): {x.shape[0]} {split} images but {y.shape[0]} labels"
            )
        if y.size and (y.min() < 0 or y.max() >= spec.num_classes):
            lo, hi = spec.label_offset, spec.num_classes - 1 + spec.label_offset
            raise DatasetFormatError(
                f"dataset {spec.name} ({source}): {split} labels must lie in {lo}..{hi}, "
                f"found {y.min() + lo}..{y.max() + lo}"
            )
        out += [np.ascontiguousarray(x), y]
    return RawData(out[0], out[1], out[2], out[3], source)


# ------------------------------------------------------------------------------------------ assembly


def subsample_indices(n: int, limit: int | None, seed: int, stream: int) -> np.ndarray | None:
    """Sorted seeded subset of range(n) of size ``limit``; None when no subsampling is needed."""
    if limit is None or limit >= n:
        return None
    if limit < 1:
        raise ConfigError(f"data.max_{'train' if stream == 1 else 'test'}_samples: must be >= 1, got {limit}")
    return np.sort(numpy_rng(seed, "data", stream).choice(n, size=limit, replace=False))


def normalise(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 N x C x H x W -> float32 (x/255 - mean) / std per channel."""
    t = torch.from_numpy(x).to(torch.float32).div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return t.sub_(m).div_(s)


def _to_tensor(x: np.ndarray, spec: DatasetSpec) -> torch.Tensor:
    if x.dtype == np.uint8:
        return normalise(x, spec.mean, spec.std)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))  # synthetic: already standardised


def load_dataset(cfg: DataConfig, seed: int = 0, system_dirs: Sequence[Path] | None = None) -> FedDataset:
    """The dataset named by ``cfg.name``, normalised, optionally subsampled (seeded by ``seed``).

    A name that is not built in is a plug-in (``package.module:load`` or an entry point of ``fedent.datasets``):
    ``load(cfg, seed)`` returns the FedDataset, which is checked here like the built-in files are."""
    if cfg.name not in SPECS:
        from fedent import plugins

        if plugins.is_import_path(cfg.name) or plugins.has_entry_point("datasets", cfg.name):
            return _plugin_dataset(cfg, seed, plugins.dataset_loader(cfg.name))
    spec = get_spec(cfg.name)
    dirs = DEFAULT_SYSTEM_DIRS if system_dirs is None else tuple(system_dirs)
    if spec.kind == "synthetic":
        xtr, ytr, xte, yte = make_synthetic(cfg.synthetic_train, cfg.synthetic_test, seed)
        source = "synthetic"
    else:
        raw = find_raw(spec, Path(cfg.root).expanduser() if cfg.root else None, cfg.download, dirs)
        xtr, ytr, xte, yte, source = raw.x_train, raw.y_train, raw.x_test, raw.y_test, raw.source
    keep_tr = subsample_indices(len(ytr), cfg.max_train_samples, seed, 1)
    keep_te = subsample_indices(len(yte), cfg.max_test_samples, seed, 2)
    if keep_tr is not None:
        xtr, ytr = xtr[keep_tr], ytr[keep_tr]
    if keep_te is not None:
        xte, yte = xte[keep_te], yte[keep_te]
    return FedDataset(
        name=spec.name,
        x_train=_to_tensor(xtr, spec),
        y_train=torch.from_numpy(np.ascontiguousarray(ytr, dtype=np.int64)),
        x_test=_to_tensor(xte, spec),
        y_test=torch.from_numpy(np.ascontiguousarray(yte, dtype=np.int64)),
        num_classes=spec.num_classes,
        in_channels=spec.in_channels,
        image_size=spec.image_size,
        source=source,
    )


def _plugin_dataset(cfg: DataConfig, seed: int, load: Callable[[DataConfig, int], Any]) -> FedDataset:
    """Call a plug-in loader and check what it returned: float images N x C x S x S, labels 0..C-1."""
    try:
        ds = load(cfg, seed)
    except DatasetError:
        raise
    except Exception as e:  # the plug-in's own failure, still one line naming it
        raise DatasetFormatError(f"dataset {cfg.name}: the loader failed: {type(e).__name__}: {e}") from None
    missing = [a for a in ("x_train", "y_train", "x_test", "y_test", "num_classes", "in_channels", "image_size")
               if not hasattr(ds, a)]
    if missing:
        raise DatasetFormatError(f"dataset {cfg.name}: the loader returned {type(ds).__name__} without "
                                 f"{', '.join(missing)}; return a fedent.data.FedDataset")
    want = (int(ds.in_channels), int(ds.image_size), int(ds.image_size))
    for split in ("train", "test"):
        x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or tuple(x.shape[1:]) != want:
            raise DatasetFormatError(f"dataset {cfg.name}: x_{split} must be a float32 tensor N x {want}, got "
                                     f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
        if not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or y.shape != (x.shape[0],):
            raise DatasetFormatError(f"dataset {cfg.name}: y_{split} must be an int64 tensor of {x.shape[0]} labels")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= int(ds.num_classes)):
            raise DatasetFormatError(f"dataset {cfg.name}: {split} labels must lie in 0..{int(ds.num_classes) - 1}")
    if isinstance(ds, FedDataset):
        return ds
    return FedDataset(str(getattr(ds, "name", cfg.name)), ds.x_train, ds.y_train, ds.x_test, ds.y_test,
                      int(ds.num_classes), int(ds.in_channels), int(ds.image_size),
                      str(getattr(ds, "source", f"plugin:{cfg.name}")))
