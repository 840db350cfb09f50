"""fedent new DIR: the starter project is written from package data, refuses to overwrite, and runs with
fedent simulate from its own directory (the plug-ins found there, not installed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedent import runlog
from fedent.cli import main
from fedent.commands.new import FILES

FMNIST = Path("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")


def test_new_writes_the_starter_files_and_refuses_a_used_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    proj = tmp_path / "proj"
    assert main(["new", str(proj)]) == 0
    assert sorted(p.name for p in proj.iterdir()) == sorted(FILES)
    cfg = (proj / "config.yaml").read_text()
    assert 'name: "my_model:build"' in cfg and 'name: "my_strategy:MyFedAvg"' in cfg
    assert "fedent simulate --config config.yaml" in (proj / "README.md").read_text()
    assert f"cd {proj} && fedent simulate --config config.yaml" in capsys.readouterr().out
    (proj / "my_model.py").write_text("# mine\n")
    assert main(["new", str(proj)]) == 2  # not empty: nothing overwritten
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert (proj / "my_model.py").read_text() == "# mine\n"


@pytest.mark.skipif(not FMNIST.exists(), reason="needs dataset-fashion-mnist (make data)")
def test_the_starter_project_runs_from_its_directory_with_its_plugins(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proj = tmp_path / "proj"
    assert main(["new", str(proj)]) == 0
    monkeypatch.chdir(proj)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(proj))])  # as a console script
    for mod in ("my_model", "my_strategy"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    rc = main(["simulate", "--config", "config.yaml", "--set", "train.rounds=1", "--set", "data.max_train_samples=300",
               "--set", "data.max_test_samples=200", "--no-plots", "--no-progress", "--device", "cpu"])
    assert rc == 0
    (run,) = (proj / "runs").iterdir()
    recs = runlog.read_metrics(run / "metrics.jsonl")
    assert [r["round"] for r in recs] == [1] and recs[0]["algorithm"] == "my-fedavg"
    assert sys.modules["my_model"].__file__ == str(proj / "my_model.py")
    for mod in ("my_model", "my_strategy"):
        sys.modules.pop(mod, None)
