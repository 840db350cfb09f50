"""Reader for the IDX format of (Fashion-/E)MNIST, gzipped or not.

Written here (not borrowed from torchvision) so the flat layout and OS-packaged copies, e.g. Debian's
``dataset-fashion-mnist`` with only ``*-ubyte.gz`` files, load without torchvision's folder conventions.
Format: 2 zero bytes, a type byte, a dimension count byte, one big-endian uint32 per dimension, data.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

# IDX type byte -> big-endian numpy dtype
IDX_DTYPES: dict[int, str] = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class IdxFormatError(ValueError):
    """The file is not a valid IDX file (truncated, wrong magic, wrong dtype)."""


def read_idx_bytes(data: bytes, where: str = "<bytes>") -> np.ndarray:
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise IdxFormatError(f"{where}: not an IDX file (bad magic number)")
    type_code, ndim = data[2], data[3]
    if type_code not in IDX_DTYPES:
        raise IdxFormatError(f"{where}: unknown IDX data type 0x{type_code:02x}")
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise IdxFormatError(f"{where}: truncated IDX header")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(IDX_DTYPES[type_code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise IdxFormatError(f"{where}: expected {expected} data bytes for shape {shape}, found {len(data) - header}")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file; ``.gz`` files are decompressed transparently."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError) as e:
        raise IdxFormatError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None
    return read_idx_bytes(data, str(path))


def find_idx_file(directory: Path, base: str) -> Path | None:
    """``base`` (e.g. ``train-images-idx3-ubyte``) in ``directory``, raw or gzipped, dash or dot spelling."""
    names = [base, base.replace("-idx", ".idx")]
    for name in names:
        for candidate in (directory / name, directory / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None
