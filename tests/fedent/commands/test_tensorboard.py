"""``fedent tensorboard``: one run into RUN_DIR/tensorboard, several into --out/<run>, clear errors otherwise."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest

from fedent.cli import main

pytest.importorskip("tensorboard")

RECS = ('{"round": 0, "test_acc": 0.5, "train_loss": 1.0, "test_loss": 1.1, "fedent": null}\n'
        '{"round": 1, "test_acc": 0.6, "train_loss": 0.9, "test_loss": 1.0, "fedent": null}\n')


def _run(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text(RECS)
    return root


def test_one_run_and_several(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert main(["tensorboard", str(a)]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard --logdir {a / 'tensorboard'}" in out
    assert len(list((a / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert main(["tensorboard", str(a), str(b), "--out", str(tmp_path / "tb")]) == 0
    assert all(len(list((tmp_path / "tb" / n).glob("events.out.tfevents.*"))) == 1 for n in "ab")


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert main(["tensorboard", str(tmp_path)]) == 2 and "not a run directory" in capsys.readouterr().err
    assert main(["tensorboard", str(a), str(b)]) == 2 and "--out" in capsys.readouterr().err
    real_import = builtins.__import__

    def no_tensorboard(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("TensorBoard logging requires TensorBoard")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    assert main(["tensorboard", str(a)]) == 2
    assert "pip install 'fedent[tracking]'" in capsys.readouterr().err
