"""Worker-local data: each hosted client's samples come from the worker's own disk (``python -m client --data``).

Two steps, because the second needs the run's config and the first must not wait for it:

1. ``read_local(spec, cids)`` before the worker dials out: every file is read and checked on its own (readable,
   images and labels agree in number, integer labels >= 0, no empty client). A problem is one
   ``LocalDataError`` line and the worker exits before sending anything.
2. ``prepare_local(raw, cfg, seed)`` once the aggregator's config is known: images are normalised as the
   dataset's are (uint8 -> ``(x/255 - mean) / std`` for a built-in data.name, else ``x/255``; float arrays are
   taken as they are), checked against the model's input and label range, and stacked into one tensor per
   split with each client's index range in it (the trainer indexes batches out of one tensor, as in the
   simulator, so a client's samples in file order give the simulator's batches bit for bit).

Layouts of ``--data DIR`` (a directory per client, ``DIR/client-<cid>/`` or ``DIR/<cid>/``), first match wins:
``train.npz`` / ``train.pt`` (+ ``test.*``) holding ``x`` and ``y``; torchvision's ImageFolder
(``train/<label>/*.png``, + ``test/<label>/``; folder names are the integer labels); the IDX files of
MNIST-style datasets; the CIFAR python batches. ``--data split:PATH`` is one local dataset (a ``.npz``/``.pt``
file with x_train, y_train[, x_test, y_test], or a directory in a built-in layout of data.name) that the worker
splits among its clients with the run's partition scheme.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedent.config import DataConfig, ExperimentConfig
from fedent.data.datasets import SPECS, DatasetError, normalise

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".pgm", ".ppm", ".tif", ".tiff", ".webp")


class LocalDataError(DatasetError):
    """Local data the worker cannot use; one line naming the client and the file."""


@dataclass(frozen=True)
class LocalDataSpec:
    """``--data`` parsed once: ``per-client:DIR`` (or just ``DIR``) or ``split:PATH``."""

    mode: Literal["per-client", "split"]
    path: Path

    @classmethod
    def parse(cls, text: str) -> LocalDataSpec:
        mode, sep, rest = text.partition(":")
        if sep and mode in ("per-client", "split"):
            path = rest
        else:
            mode, path = "per-client", text
        if not path:
            raise LocalDataError(f"--data {text!r}: empty path; use DIR, per-client:DIR or split:PATH")
        return cls(mode, Path(path).expanduser())  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False)
class RawSplit:
    """One client's split as stored: images (uint8 or float) and int64 labels, and where they came from."""

    x: np.ndarray
    y: np.ndarray
    source: str

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, eq=False)
class RawClient:
    cid: int
    train: RawSplit
    test: RawSplit | None


@dataclass(frozen=True, eq=False)
class RawLocal:
    """What ``read_local`` found: per client, or one dataset to split (``clients`` then empty)."""

    spec: LocalDataSpec
    cids: tuple[int, ...]
    clients: dict[int, RawClient] = field(default_factory=dict)
    whole: RawClient | None = None


@dataclass(frozen=True, eq=False)
class LocalData:
    """The hosted clients' data ready to train on: one tensor per split, each client's index range in it."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    train_indices: dict[int, np.ndarray]
    test_indices: dict[int, np.ndarray]
    sources: dict[int, str]
    num_classes: int

    def label_counts(self, cid: int) -> list[int]:
        y = self.y_train[torch.from_numpy(self.train_indices[cid])]
        return [int(v) for v in torch.bincount(y, minlength=self.num_classes)]


# ---------------------------------------------------------------------------------------------- reading


def _labels(y: Any, where: str) -> np.ndarray:
    arr = np.asarray(y)
    if arr.ndim != 1:
        arr = arr.reshape(-1) if arr.ndim == 2 and 1 in arr.shape else arr
    if arr.ndim != 1:
        raise LocalDataError(f"{where}: labels must be one integer per sample, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise LocalDataError(f"{where}: labels must be integers, got {arr.dtype}")
    out = arr.astype(np.int64)
    if out.size and out.min() < 0:
        raise LocalDataError(f"{where}: labels must be >= 0, found {int(out.min())}")
    return out


def _split(x: Any, y: Any, where: str) -> RawSplit:
    xs = np.asarray(x)
    if xs.dtype == object or not (np.issubdtype(xs.dtype, np.number)):
        raise LocalDataError(f"{where}: images must be a numeric array, got {xs.dtype}")
    ys = _labels(y, where)
    if xs.ndim < 2 or xs.shape[0] != ys.shape[0]:
        raise LocalDataError(f"{where}: {xs.shape[0] if xs.ndim else 0} images but {ys.shape[0]} labels")
    return RawSplit(xs, ys, where)


def _load_arrays(path: Path) -> dict[str, Any]:
    """Every array of a .npz or .pt (a dict of tensors) file; unreadable is one LocalDataError line."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        got = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unreadable, truncated, not that format: one line
        why = str(e).splitlines()[0] if str(e) else ""
        raise LocalDataError(f"{path}: unreadable ({type(e).__name__}: {why})") from None
    if not isinstance(got, dict):
        raise LocalDataError(f"{path}: expected a dict of tensors, got {type(got).__name__}")
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)) for k, v in got.items()}


def _read_tensor_file(path: Path, split: bool = False) -> dict[str, RawSplit]:
    """A .npz/.pt file with ``x`` and ``y`` (one client's split), or for ``split:`` also x_train/y_train
    (+ x_test/y_test) as ``train``/``test``."""
    arrays = _load_arrays(path)
    if split and "x_train" in arrays and "y_train" in arrays:
        out = {"train": _split(arrays["x_train"], arrays["y_train"], str(path))}
        if "x_test" in arrays and "y_test" in arrays:
            out["test"] = _split(arrays["x_test"], arrays["y_test"], str(path))
        return out
    if "x" in arrays and "y" in arrays:
        return {"train": _split(arrays["x"], arrays["y"], str(path))}
    want = "x/y or x_train/y_train" if split else "x and y"
    raise LocalDataError(f"{path}: no {want} arrays (found {', '.join(sorted(arrays)) or 'none'})")


def _read_image_folder(root: Path) -> RawSplit:
    """torchvision's ImageFolder layout, ``root/<label>/<image>``, with integer folder names as labels."""
    from PIL import Image

    xs: list[np.ndarray] = []
    ys: list[int] = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if not d.name.isdigit():
            raise LocalDataError(f"{d}: ImageFolder class folders must be named by their integer label (0, 1, ...)")
        for f in sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
            try:
                with Image.open(f) as im:
                    a = np.asarray(im.convert("L" if im.mode in ("1", "L", "I", "I;16") else "RGB"))
            except Exception as e:
                raise LocalDataError(f"{f}: unreadable image ({type(e).__name__})") from None
            xs.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
            ys.append(int(d.name))
    if not xs:
        return RawSplit(np.zeros((0, 1, 1, 1), np.uint8), np.zeros(0, np.int64), str(root))
    if len({x.shape for x in xs}) > 1:
        raise LocalDataError(f"{root}: images differ in size/channels ({sorted({x.shape for x in xs})[:3]})")
    return RawSplit(np.stack(xs), np.asarray(ys, np.int64), f"imagefolder:{root}")


def _read_builtin_layout(directory: Path, data_name: str | None) -> dict[str, RawSplit] | None:
    """IDX or CIFAR files of a built-in dataset in ``directory`` (``data_name`` picks which files), or None."""
    from fedent.data.datasets import DatasetFormatError, _search_dir

    names = [data_name] if data_name in SPECS else [n for n in SPECS if n != "synthetic"]
    for name in names:
        spec = SPECS[name]
        if spec.kind == "synthetic":
            continue
        try:
            hit = _search_dir(spec, directory)
        except DatasetFormatError as e:
            raise LocalDataError(str(e)) from None
        if hit is not None:
            (xtr, ytr, xte, yte), d = hit
            where = f"{spec.kind}:{d}"
            return {"train": _split(xtr, np.asarray(ytr) - spec.label_offset, where),
                    "test": _split(xte, np.asarray(yte) - spec.label_offset, where)}
    return None


def _read_dir(d: Path, data_name: str | None) -> dict[str, RawSplit]:
    for suffix in (".npz", ".pt"):
        if (d / f"train{suffix}").is_file():
            out = {"train": _read_tensor_file(d / f"train{suffix}")["train"]}
            if (d / f"test{suffix}").is_file():
                out["test"] = _read_tensor_file(d / f"test{suffix}")["train"]
            return out
    if (d / "train").is_dir():
        out = {"train": _read_image_folder(d / "train")}
        if (d / "test").is_dir():
            out["test"] = _read_image_folder(d / "test")
        return out
    found = _read_builtin_layout(d, data_name)
    if found is not None:
        return found
    raise LocalDataError(f"{d}: no data found (expected train.npz/train.pt with x and y, an ImageFolder train/ "
                         "directory, IDX files or CIFAR batches)")


def client_dir(root: Path, cid: int) -> Path | None:
    for name in (f"client-{cid}", f"client_{cid}", str(cid)):
        if (root / name).is_dir():
            return root / name
    return None


def read_local(spec: LocalDataSpec, cids: Sequence[int], data_name: str | None = None) -> RawLocal:
    """Read and check every hosted client's files (no config needed); LocalDataError on the first problem."""
    cids = tuple(sorted(int(c) for c in cids))
    if not spec.path.exists():
        raise LocalDataError(f"--data {spec.path}: no such file or directory")
    if spec.mode == "split":
        if spec.path.is_file():
            if spec.path.suffix not in (".npz", ".pt"):
                raise LocalDataError(f"--data split:{spec.path}: expected a .npz or .pt file or a directory")
            got = _read_tensor_file(spec.path, split=True)
        else:
            got = _read_dir(spec.path, data_name)
        if "train" not in got or len(got["train"]) < len(cids):
            n = len(got["train"]) if "train" in got else 0
            raise LocalDataError(f"{spec.path}: {n} training samples cannot be split among {len(cids)} clients")
        return RawLocal(spec, cids, whole=RawClient(-1, got["train"], got.get("test")))
    if not spec.path.is_dir():
        raise LocalDataError(f"--data {spec.path}: expected a directory with one folder per client "
                             "(client-<cid>/ or <cid>/), or split:FILE")
    clients: dict[int, RawClient] = {}
    for cid in cids:
        d = client_dir(spec.path, cid)
        if d is None:
            raise LocalDataError(f"client {cid}: no folder {spec.path / f'client-{cid}'} (or {spec.path / str(cid)})")
        got = _read_dir(d, data_name)
        if len(got["train"]) == 0:
            raise LocalDataError(f"client {cid}: no training samples in {got['train'].source}")
        clients[cid] = RawClient(cid, got["train"], got.get("test"))
    return RawLocal(spec, cids, clients=clients)


# ---------------------------------------------------------------------------------------------- preparing


def _images(split: RawSplit, data: DataConfig, shape: tuple[int, int, int], who: str) -> torch.Tensor:
    """Normalised float32 N x C x H x W; an image shape that does not fit the model is a LocalDataError."""
    x = split.x
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[1] != shape[0] and x.shape[-1] == shape[0]:
        x = x.transpose(0, 3, 1, 2)  # N x H x W x C
    if x.ndim != 4 or tuple(x.shape[1:]) != shape:
        raise LocalDataError(f"{who} ({split.source}): images have shape {tuple(split.x.shape[1:])}, but the "
                             f"model takes {shape} (C x H x W)")
    x = np.ascontiguousarray(x)
    if x.dtype == np.uint8:
        spec = SPECS.get(data.name)
        if spec is not None and spec.kind != "synthetic":
            return normalise(x, spec.mean, spec.std)
        return torch.from_numpy(x).to(torch.float32).div_(255.0)
    return torch.from_numpy(x.astype(np.float32, copy=False))


def _check_labels(split: RawSplit, num_classes: int, who: str) -> None:
    if len(split) and int(split.y.max()) >= num_classes:
        raise LocalDataError(f"{who} ({split.source}): label {int(split.y.max())} is out of range for "
                             f"{num_classes} classes (0..{num_classes - 1})")


def prepare_local(raw: RawLocal, cfg: ExperimentConfig, shape: tuple[int, int, int], num_classes: int) -> LocalData:
    """Normalise, check against the model's input ``shape`` and ``num_classes``, split (``split:`` mode) and stack."""
    clients = raw.clients
    if raw.whole is not None:
        clients = _split_among(raw.whole, raw.cids, cfg, num_classes)
    xs_tr, ys_tr, xs_te, ys_te = [], [], [], []
    tr_ix: dict[int, np.ndarray] = {}
    te_ix: dict[int, np.ndarray] = {}
    n_tr = n_te = 0
    for cid in raw.cids:
        c = clients[cid]
        who = f"client {cid}"
        _check_labels(c.train, num_classes, who)
        xs_tr.append(_images(c.train, cfg.data, shape, who))
        ys_tr.append(torch.from_numpy(c.train.y))
        tr_ix[cid] = np.arange(n_tr, n_tr + len(c.train), dtype=np.int64)
        n_tr += len(c.train)
        test = c.test if c.test is not None else RawSplit(np.zeros((0, *shape), np.float32), np.zeros(0, np.int64), "")
        _check_labels(test, num_classes, who)
        xs_te.append(_images(test, cfg.data, shape, who) if len(test) else torch.zeros((0, *shape)))
        ys_te.append(torch.from_numpy(test.y))
        te_ix[cid] = np.arange(n_te, n_te + len(test), dtype=np.int64)
        n_te += len(test)
    sources = {cid: clients[cid].train.source for cid in raw.cids}
    return LocalData(torch.cat(xs_tr), torch.cat(ys_tr), torch.cat(xs_te), torch.cat(ys_te), tr_ix, te_ix,
                     sources, num_classes)


def _split_among(whole: RawClient, cids: Sequence[int], cfg: ExperimentConfig,
                 num_classes: int) -> dict[int, RawClient]:
    """One local dataset cut among the hosted clients with the run's partition scheme (seeded by train.seed);
    its test split is cut IID (fedent.rounds.evaluation.test_shards)."""
    import dataclasses

    from fedent.data.partition import PartitionError, make_partition
    from fedent.rounds.evaluation import test_shards

    part_cfg = dataclasses.replace(cfg.data, num_clients=len(cids))
    try:
        part = make_partition(whole.train.y, part_cfg, cfg.train.seed, num_classes=num_classes)
    except (PartitionError, ValueError) as e:
        raise LocalDataError(f"{whole.train.source}: cannot split among {len(cids)} clients: {e}") from None
    test_parts = test_shards(len(whole.test), len(cids), cfg.train.seed) if whole.test is not None else None
    out: dict[int, RawClient] = {}
    for k, cid in enumerate(cids):
        ix = np.asarray(part.client_indices[k])
        if ix.size == 0:
            raise LocalDataError(f"client {cid}: the split of {whole.train.source} left it no samples")
        src = f"split:{whole.train.source}"
        train = RawSplit(whole.train.x[ix], whole.train.y[ix], src)
        test = None
        if whole.test is not None and test_parts is not None:
            tix = test_parts[k]
            test = RawSplit(whole.test.x[tix], whole.test.y[tix], src)
        out[cid] = RawClient(cid, train, test)
    return out


def write_client_files(out: Path, clients: Mapping[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                              torch.Tensor | None]]) -> list[Path]:
    """``out/client-<cid>/train.npz`` (+ ``test.npz``) with x and y: the per-client layout ``--data`` reads."""
    written = []
    for cid, (x, y, xt, yt) in clients.items():
        d = out / f"client-{cid}"
        d.mkdir(parents=True, exist_ok=True)
        np.savez(d / "train.npz", x=x.cpu().numpy(), y=y.cpu().numpy())
        written.append(d / "train.npz")
        if xt is not None and yt is not None:
            np.savez(d / "test.npz", x=xt.cpu().numpy(), y=yt.cpu().numpy())
            written.append(d / "test.npz")
    return written


def export_partition(x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor,
                     client_indices: Sequence[np.ndarray], seed: int, out: Path) -> list[Path]:
    """A central run's partition as per-client files: client k's training samples in index order (so its
    batches are the simulator's) and its IID test shard (``test_shards``, what federated evaluation uses)."""
    from fedent.rounds.evaluation import test_shards

    shards = test_shards(int(y_test.shape[0]), len(client_indices), seed)
    clients = {}
    for cid, ix in enumerate(client_indices):
        t = torch.from_numpy(np.array(ix, dtype=np.int64))
        s = torch.from_numpy(shards[cid])
        clients[cid] = (x_train[t], y_train[t], x_test[s], y_test[s])
    return write_client_files(Path(out), clients)
