"""Kept run logs as a byte-reproducible archive: ``python -m fedent.experiments.archive_runs OUT_DIR ARCHIVE``.

Why: a published number traces to run logs kept in the repository, and the page quotes the archive's sha256. If
the archive's bytes depended on the machine (file order, owners, timestamps, gzip's header), nobody could check
that the archive holds exactly the files the page was generated from, nor rebuild it. Here the same files give the
same bytes anywhere: members sorted, owner 0 with no names, one fixed timestamp, gzip level 9 without a name or
time, so unpacking a published archive and archiving it again yields its sha256 (a test does this).

What is kept: the output directory's records of the calls (``command.json``, ``commands.jsonl``; a tuning
search's ``tune.md``, ``tuned.json``) and, for every run directory below it (one holding ``status.json``), the
logs the reports read: ``config.yaml``, ``metrics.jsonl``, ``partition.json``, ``provenance.json``,
``status.json``. Checkpoints, models and caches stay out. A run still training, stopped or failed is left out and
named (``reproduce.finished`` decides, so a diverged run is kept: it is a result), as are superseded copies
(``<run>.superseded-<n>``): a page is generated from finished runs only.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import sys
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedent import runlog
from fedent.experiments.reproduce import SUPERSEDED, finished

CALL_FILES = ("command.json", "commands.jsonl", "tune.md", "tuned.json")
_LAYOUT = runlog.RunPaths(Path("."))
RUN_FILES = tuple(p.name for p in (_LAYOUT.config, _LAYOUT.metrics, _LAYOUT.partition, _LAYOUT.provenance,
                                     _LAYOUT.status))
# 2026-12-02 00:00 UTC: one timestamp for every member (the archives' shared date, not a build time)
MTIME = 1796169600


@dataclass(frozen=True)
class Archived:
    """What went into an archive: its sha256, the runs kept and the run directories left out, with why."""

    sha256: str
    runs: tuple[str, ...]
    left_out: tuple[str, ...] = field(default=())


def run_dirs(root: Path) -> list[Path]:
    """Every run directory below ``root`` (a directory holding ``status.json``), sorted."""
    return sorted(p.parent for p in root.rglob(_LAYOUT.status.name) if p.parent != root)


def _why_left_out(run: Path, root: Path) -> str | None:
    rel = run.relative_to(root)
    if any(SUPERSEDED in part for part in rel.parts):
        return f"{rel.as_posix()} (superseded copy)"
    if not finished(run):
        status = runlog.read_json(runlog.RunPaths(run).status, default=None)
        phase = status.get("phase") if isinstance(status, dict) else "unreadable status.json"
        return f"{rel.as_posix()} ({phase}, not finished)"
    return None


def members(root: Path) -> tuple[list[Path], list[str], list[str]]:
    """The files to archive (below ``root``), the runs they hold and the runs left out with why."""
    files = [root / name for name in CALL_FILES if (root / name).is_file()]
    kept: list[str] = []
    left_out: list[str] = []
    for run in run_dirs(root):
        why = _why_left_out(run, root)
        if why is not None:
            left_out.append(why)
            continue
        kept.append(run.relative_to(root).as_posix())
        files += [run / name for name in RUN_FILES if (run / name).is_file()]
    return files, kept, left_out


def _dirs_of(names: Iterable[str]) -> list[str]:
    dirs = {"/".join(parts[:i]) for parts in (n.split("/") for n in names) for i in range(1, len(parts))}
    return sorted(dirs)


def _info(name: str, size: int, directory: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory else 0o644
    info.size = 0 if directory else size
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def tar_bytes(root: Path, files: Sequence[Path]) -> bytes:
    """The gzip'd tar of ``files`` (paths below ``root``, any order), the same bytes for the same files anywhere."""
    names = [f.relative_to(root).as_posix() for f in files]
    entries: list[tuple[str, Path | None]] = [(d, None) for d in _dirs_of(names)]
    entries = sorted(entries + list(zip(names, files, strict=True)), key=lambda e: e[0])
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, path in entries:
            if path is None:
                tar.addfile(_info(name, 0, directory=True))
            else:
                data = path.read_bytes()
                tar.addfile(_info(name, len(data), directory=False), io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def archive(root: Path, dest: Path) -> Archived:
    """Write the archive of ``root``'s kept logs to ``dest`` (atomically) and say what it holds."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such output directory")
    files, kept, left_out = members(root)
    if not kept:
        raise ValueError(f"{root}: no finished run to archive"
                         + (f" (left out: {', '.join(left_out)})" if left_out else ""))
    data = tar_bytes(root, files)
    runlog.atomic_write_bytes(dest, data)
    return Archived(hashlib.sha256(data).hexdigest(), tuple(kept), tuple(left_out))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedent.experiments.archive_runs", description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path, help="a reproduce, compare or tune output directory")
    ap.add_argument("archive", type=Path, help="the .tar.gz to write")
    args = ap.parse_args(argv)
    try:
        done = archive(args.out_dir, args.archive)
    except (OSError, ValueError) as e:
        print(f"archive_runs: {e}", file=sys.stderr)
        return 2
    print(f"{args.archive}: {len(done.runs)} runs, sha256 {done.sha256}")
    for why in done.left_out:
        print(f"left out: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
