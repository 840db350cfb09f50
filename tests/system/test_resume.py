"""Aggregator crash + restart on the same run directory: resumes from its checkpoint and, with the workers'
persisted client state, ends with exactly the model an uninterrupted simulation computes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_config, tiny_inputs

from client.worker import Worker, WorkerSettings
from fedent.checkpoint import CheckpointMismatchError, list_checkpoints
from fedent.inputs import RunInputs
from fedent.runlog import read_metrics
from fedent.sim.simulator import run_simulation
from server.app import AggregatorHandle, start_aggregator
from server.settings import AggregatorSettings

SETTINGS = AggregatorSettings(register_timeout_s=20.0, round_deadline_s=20.0)


class SimulatedCrash(RuntimeError):
    pass


def _workers(h: AggregatorHandle, inputs: RunInputs, state_dir: Path | None) -> list[threading.Thread]:
    threads = []
    for i, group in enumerate([(0, 1), (2, 3)]):
        w = Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=group, device="cpu",
                                  connect_timeout_s=10, state_dir=str(state_dir / f"w{i}") if state_dir else None),
                   inputs=inputs)
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        threads.append(t)
    return threads


def _run(cfg: Any, inputs: RunInputs, run_dir: Path, state_dir: Path | None,
         crash_at: tuple[str, int] | None = None) -> AggregatorHandle:
    h = start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs)
    if crash_at is not None:
        def crash(phase: str) -> None:
            if (phase, h.run.round) == crash_at:
                raise SimulatedCrash(f"killed at {phase} of round {h.run.round}")
        h.run.on_phase = crash
    threads = _workers(h, inputs, state_dir)
    try:
        assert h.wait(60), "the run did not finish"
        for t in threads:
            t.join(10)
    finally:
        h.stop(grace_s=0.5)
    return h


@pytest.mark.parametrize("algorithm", ["feddyn", "scaffold"])
def test_crash_after_workers_fitted_then_resume_equals_simulation(tmp_path: Path, algorithm: str) -> None:
    cfg = tiny_config(algorithm, rounds=3)
    inputs = tiny_inputs()
    run_dir, state_dir = tmp_path / "run", tmp_path / "worker-state"
    # crash when round 1's updates are in (the workers have already saved their round-1 client state)
    first = _run(cfg, inputs, run_dir, state_dir, crash_at=("aggregating", 1))
    assert first.run.error is not None and "SimulatedCrash" in first.run.error
    assert [r for r, _ in list_checkpoints(run_dir / "checkpoint")] == [0]

    second = _run(cfg, inputs, run_dir, state_dir)
    assert second.run.error is None, second.run.error
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    got = torch.load(run_dir / "model_final.pt")
    for a, b in zip(got, sim.params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    recs = read_metrics(run_dir / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1, 2]  # nothing logged twice
    assert [r["clients"] for r in recs] == [r["clients"] for r in sim.records]
    assert [r for r, _ in list_checkpoints(run_dir / "checkpoint")] == [2, 1]


def test_resume_with_a_different_config_is_refused(tmp_path: Path) -> None:
    inputs = tiny_inputs()
    run_dir = tmp_path / "run"
    _run(tiny_config("fedavg", rounds=2), inputs, run_dir, None, crash_at=("training", 1))
    h = _run(tiny_config("fedavg", rounds=2, lr=0.05), inputs, run_dir, None)
    assert h.run.error is not None and CheckpointMismatchError.__name__ in h.run.error
