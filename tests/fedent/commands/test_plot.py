"""``fedent plot`` flags: --formats writes each figure once per format, --no-title, bad formats are usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.cli import main

RECS = ('{"round": 0, "test_acc": 0.5, "train_loss": 1.0, "test_loss": 1.1, "fedent": null, "diagnostics": {}}\n'
        '{"round": 1, "test_acc": 0.6, "train_loss": 0.9, "test_loss": 1.0, "fedent": null, "diagnostics": {}}\n')


def test_formats_and_no_title(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(RECS)
    out = tmp_path / "figs"
    assert main(["plot", str(run), "--out", str(out), "--formats", "pdf,SVG", "--no-title", "--dpi", "150"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"{s}.{f}" for s in ("accuracy", "train_loss", "test_loss") for f in ("pdf", "svg"))
    assert sorted(capsys.readouterr().out.split()) == sorted(str(out / n) for n in names)
    assert b"global model accuracy" not in (out / "accuracy.svg").read_bytes()  # the title's text
    assert main(["plot", str(run), "--out", str(tmp_path / "t"), "--formats", "svg"]) == 0
    assert b"global model accuracy" in (tmp_path / "t" / "accuracy.svg").read_bytes()


def test_bad_formats_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("eps", "png,jpg", ","):
        with pytest.raises(SystemExit) as e:
            main(["plot", str(tmp_path), "--formats", bad])
        assert e.value.code == 2 and "choose from png,pdf,svg" in capsys.readouterr().err
