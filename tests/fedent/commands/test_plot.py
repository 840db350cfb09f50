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


def _png_size(path: Path) -> tuple[int, int]:
    import struct

    w, h = struct.unpack(">II", path.read_bytes()[16:24])  # the IHDR chunk
    return int(w), int(h)


def test_width_and_paper_style_make_one_column_figures(tmp_path: Path) -> None:
    """--style paper: exactly 3.4 in wide at the given dpi, the two panels stacked, the legend below the axes;
    --width sets any figure's width exactly; without either the figures keep their size."""
    from plot_records import RECS as FEDENT_RECS

    from fedent import plots
    from fedent.plots import FigureStyle

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(RECS)
    paper = tmp_path / "paper"
    assert main(["plot", str(run), "--out", str(paper), "--style", "paper", "--dpi", "100"]) == 0
    w, h = _png_size(paper / "accuracy.png")
    assert w == 340 and h > 200, (w, h)  # 3.4 in at 100 dpi
    wide = tmp_path / "wide"
    assert main(["plot", str(run), "--out", str(wide), "--width", "5", "--dpi", "100"]) == 0
    assert _png_size(wide / "accuracy.png")[0] == 500
    default = tmp_path / "default"
    assert main(["plot", str(run), "--out", str(default), "--dpi", "100"]) == 0
    assert _png_size(default / "accuracy.png")[0] > 600  # 6.5 in unless told
    fig = plots.draw_phi2(FEDENT_RECS, FigureStyle(paper=True))
    assert fig is not None and tuple(fig.get_size_inches())[0] == plots.PAPER_WIDTH
    (a, b) = fig.axes[:2]
    assert a.get_position().y0 > b.get_position().y0 and a.get_position().x0 == b.get_position().x0  # stacked
    (legend,) = fig.legends
    assert legend._loc in (8, "lower center") or "lower" in str(getattr(legend, "_outside_loc", ""))


def test_width_out_of_range_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(RECS)
    assert main(["plot", str(run), "--width", "0.2"]) == 2
    assert "--width: 0.2 inches; expected 1 to 20" in capsys.readouterr().err
