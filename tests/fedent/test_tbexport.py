"""fedent.tbexport: a run's metrics.jsonl scalars, read back from the TensorBoard event file, are the same values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sim_support import tiny_config, tiny_inputs

from fedent import runlog, tbexport
from fedent.sim.simulator import run_simulation

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
tensor_util = pytest.importorskip("tensorboard.util.tensor_util")


def read_events(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, wall_time, value)] of every scalar in the folder's event file."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return {tag: [(e.step, e.wall_time, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"] if not tag.startswith("custom_scalars")}


def expected(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """What the export must hold, straight from metrics.jsonl (not through tbexport.scalars)."""
    want: dict[str, list[tuple[int, float]]] = {}

    def put(tag: str, r: dict[str, Any], v: Any) -> None:
        if v is not None:
            want.setdefault(tag, []).append((r["round"], float(v)))

    for r in records:
        put("accuracy/test", r, r["test_acc"])
        put("loss/train", r, r["train_loss"])
        put("loss/test", r, r["test_loss"])
        fd = r["fedent"] or {}
        put("phi2/predicted", r, fd.get("phi2_pred"))
        put("phi2/actual", r, fd.get("phi2_actual"))
        put("entropy/uploads", r, fd.get("entropy"))
        for row in fd.get("clients") or []:
            put(f"eta/client_{row['client']}", r, row["eta"])
    return want


def test_export_holds_exactly_the_logged_scalars(tmp_path: Path) -> None:
    res = run_simulation(tiny_config("fedent", rounds=3), tmp_path / "run", progress=False, inputs=tiny_inputs(),
                         plots=False)
    records = runlog.read_metrics(runlog.RunPaths(res.run_dir).metrics)
    out = tbexport.export(res.run_dir)
    assert out == res.run_dir / "tensorboard" and len(list(out.glob(tbexport.EVENT_GLOB))) == 1
    got = read_events(out)
    want = expected(records)
    assert {"accuracy/test", "loss/train", "loss/test", "phi2/predicted", "phi2/actual", "entropy/uploads"} <= set(want)
    assert sum(t.startswith("eta/client_") for t in want) >= 3
    assert set(got) == set(want)
    for tag, rows in want.items():
        assert [(s, v) for s, _, v in got[tag]] == rows, tag  # exact: written in double precision
    started = runlog.read_json(runlog.RunPaths(res.run_dir).status)["started_at"]
    last = records[-1]
    assert got["loss/train"][-1][1] == pytest.approx(started + last["elapsed_s"], abs=1e-3)
    assert sorted(tbexport.scalars(records)) == sorted((t, s, v) for t, rows in want.items() for s, v in rows)

    again = tbexport.export(res.run_dir)  # re-export replaces, not duplicates
    assert again is not None and len(list(again.glob(tbexport.EVENT_GLOB))) == 1
    assert read_events(again)["accuracy/test"] == got["accuracy/test"]


def test_nothing_logged_yet_and_non_finite_values(tmp_path: Path) -> None:
    empty = runlog.RunPaths(tmp_path / "empty")
    empty.root.mkdir()
    empty.metrics.write_text("")
    assert tbexport.export(empty.root) is None and not (empty.root / "tensorboard").exists()
    recs = [{"round": 0, "test_acc": float("nan"), "train_loss": 1.0, "test_loss": None, "fedent": None}]
    assert list(tbexport.scalars(recs)) == [("loss/train", 1, 1.0)]
