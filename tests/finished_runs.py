"""A run directory as a successful run leaves it (status done, metrics, model_final.pt), for the tests of
serving a finished run read-only (tests/server/test_finished.py, tests/client/test_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fedent import runlog


def make_finished_run(run_dir: Path, phase: str = "done", model: bool = True) -> Path:
    paths = runlog.create_run_dir(run_dir, exist_ok=True)
    runlog.atomic_write_json(paths.status, runlog.status_record(paths.run_id, "fedent", phase, 1, 2, 1.0,
                                                                updated_at=2.0))
    paths.metrics.write_text("".join(json.dumps({"round": r, "test_acc": 0.5}) + "\n" for r in range(2)))
    if model:
        torch.save({"w": torch.zeros(3)}, paths.model)
    return run_dir
