"""``fedent plugins``: lists built-in and installed names; ``--check`` resolves one or says why not in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.cli import main


def test_lists_every_kind_with_the_built_ins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for header in ("models (fedent.models):", "datasets (fedent.datasets):", "strategies (fedent.strategies):"):
        assert header in out
    assert "mnist-cnn" in out and "fashion-mnist" in out and "fedent " in out


def test_lists_an_installed_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    dist = tmp_path / "extra-2.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extra\nVersion: 2.0\n")
    (dist / "entry_points.txt").write_text("[fedent.models]\nextra-net = extra.models:build\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["plugins", "--kind", "models"]) == 0
    out = capsys.readouterr().out
    assert "extra-net" in out and "extra.models:build" in out and "[extra]" in out and "datasets" not in out


def test_check_reports_a_broken_plugin_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--kind", "models", "--check", "fedent.models:count_parameters"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "expected f(num_classes, in_channels, image_size, dropout)" in err
    assert main(["plugins", "--kind", "models", "--check", "lenet5"]) == 0
    assert "built-in" in capsys.readouterr().out
