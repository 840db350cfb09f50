"""fedent.experiments.archive_runs: the same kept logs give the same bytes whatever the order they were written in
and their timestamps; unpacking and archiving again gives the same sha256; checkpoints, unfinished runs and
superseded copies stay out, a diverged run is kept."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest

from fedent.experiments import archive_runs


def _run(root: Path, rel: str, phase: str = "done", error: str = "", order: int = 1) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    files = {
        "config.yaml": f"name: {rel}\n",
        "metrics.jsonl": json.dumps({"round": 1, "test_acc": 0.5}) + "\n",
        "partition.json": json.dumps({"md5": "m"}),
        "provenance.json": json.dumps({"commit": "abc"}),
        "status.json": json.dumps({"phase": phase, "round": 1, "rounds": 2, "error": error}),
        "checkpoint/model.pt": "weights",
        "clients.json": "{}",
    }
    for name, text in list(files.items())[::order]:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)


def _tree(root: Path, order: int = 1) -> Path:
    root.mkdir()
    (root / "command.json").write_text(json.dumps({"argv": ["reproduce"]}))
    for rel in ["runs/b/fedent-s0", "runs/a/fedavg-s1", "runs/a/fedavg-s0"][::order]:
        _run(root, rel, order=order)
    _run(root, "runs/a/fedadam-s0", phase="failed", error="model is not finite at round 1", order=order)
    _run(root, "runs/a/fedent-s0", phase="training", order=order)
    _run(root, "runs/a/fedavg-s0.superseded-1", order=order)
    (root / "reproduce.log").write_text("not kept")
    return root


def test_same_logs_same_bytes_whatever_order_and_time(tmp_path: Path) -> None:
    one = _tree(tmp_path / "one")
    two = _tree(tmp_path / "two", order=-1)
    for i, f in enumerate(sorted(two.rglob("*"))):
        os.utime(f, (1_000_000 + i, 1_000_000 + i))
    a = archive_runs.archive(one, tmp_path / "one.tar.gz")
    b = archive_runs.archive(two, tmp_path / "two.tar.gz")
    assert (tmp_path / "one.tar.gz").read_bytes() == (tmp_path / "two.tar.gz").read_bytes()
    assert a.sha256 == b.sha256 == hashlib.sha256((tmp_path / "one.tar.gz").read_bytes()).hexdigest()
    # gzip's header: no file name (flags 0), no time, so a rebuild tomorrow gives these bytes too
    assert (tmp_path / "one.tar.gz").read_bytes()[3:8] == bytes(5)


def test_only_the_logs_of_finished_runs_are_kept(tmp_path: Path) -> None:
    root = _tree(tmp_path / "out")
    done = archive_runs.archive(root, tmp_path / "logs.tar.gz")
    assert done.runs == ("runs/a/fedadam-s0", "runs/a/fedavg-s0", "runs/a/fedavg-s1", "runs/b/fedent-s0")
    assert done.left_out == ("runs/a/fedavg-s0.superseded-1 (superseded copy)",
                             "runs/a/fedent-s0 (training, not finished)")
    with tarfile.open(tmp_path / "logs.tar.gz") as tar:
        infos = tar.getmembers()
    files = [i.name for i in infos if i.isfile()]
    assert files[0] == "command.json"
    assert sorted(n.rsplit("/", 1)[1] for n in files if "/fedavg-s1/" in n) == sorted(archive_runs.RUN_FILES)
    assert not any("checkpoint" in n or "clients.json" in n or n.endswith(".log") for n in files)
    assert {(i.uid, i.gid, i.uname, i.gname, i.mtime) for i in infos} == {(0, 0, "", "", archive_runs.MTIME)}
    assert [i.name for i in infos] == sorted(i.name for i in infos)


def test_unpacked_and_archived_again_gives_the_same_sha(tmp_path: Path) -> None:
    first = archive_runs.archive(_tree(tmp_path / "out"), tmp_path / "logs.tar.gz")
    unpacked = tmp_path / "unpacked"
    with tarfile.open(tmp_path / "logs.tar.gz") as tar:
        tar.extractall(unpacked, filter="data")
    again = archive_runs.archive(unpacked, tmp_path / "again.tar.gz")
    assert again.sha256 == first.sha256 and again.left_out == ()


def test_nothing_finished_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "out"
    _run(root, "runs/a/fedent-s0", phase="training")
    with pytest.raises(ValueError, match="no finished run.*fedent-s0 \\(training"):
        archive_runs.archive(root, tmp_path / "x.tar.gz")
    assert archive_runs.main([str(root), str(tmp_path / "x.tar.gz")]) == 2
    assert "no finished run" in capsys.readouterr().err and not (tmp_path / "x.tar.gz").exists()
    assert archive_runs.main([str(tmp_path / "missing"), str(tmp_path / "x.tar.gz")]) == 2


def test_cli_prints_the_sha_and_what_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path / "out")
    assert archive_runs.main([str(root), str(tmp_path / "logs.tar.gz")]) == 0
    out = capsys.readouterr().out
    sha = hashlib.sha256((tmp_path / "logs.tar.gz").read_bytes()).hexdigest()
    assert f"4 runs, sha256 {sha}" in out and "left out: runs/a/fedent-s0 (training, not finished)" in out
