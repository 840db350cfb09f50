"""Aggregator crash + restart on the same run directory: resumes from its checkpoint and, with the workers'
persisted client state, ends with exactly the model an uninterrupted simulation computes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_config, tiny_inputs
from rundirs import digest as _digest

from client.settings import WorkerSettings
from client.worker import Worker
from fedent.checkpoint import list_checkpoints
from fedent.inputs import RunInputs
from fedent.model_file import load_model_file
from fedent.rounds.rundir import RunDirError, RunFinished
from fedent.runlog import read_json, read_metrics
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
            if (phase, h.run.engine.round) == crash_at:
                raise SimulatedCrash(f"killed at {phase} of round {h.run.engine.round}")
        h.run.engine.on_phase = crash
    return _finish(h, inputs, state_dir)


def _finish(h: AggregatorHandle, inputs: RunInputs, state_dir: Path | None) -> AggregatorHandle:
    """Two in-process workers (state under ``state_dir/w0``, ``w1``) on a started aggregator, to the end."""
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
    got = load_model_file(run_dir / "model_final.pt").params
    for a, b in zip(got, sim.params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    recs = read_metrics(run_dir / "metrics.jsonl")
    assert [r["round"] for r in recs] == [1, 2, 3]  # nothing logged twice
    assert [r["clients"] for r in recs] == [r["clients"] for r in sim.records]
    assert [r for r, _ in list_checkpoints(run_dir / "checkpoint")] == [2, 1]


def _settled_digest(root: Path) -> dict[str, str]:
    """The digest once the crashed run's leftover in-process threads (workers leaving, the registry marking
    them down) have stopped writing."""
    last = _digest(root)
    for _ in range(50):
        time.sleep(0.2)
        now = _digest(root)
        if now == last:
            return now
        last = now
    raise AssertionError(f"{root} never settled")


def test_resume_with_a_different_config_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    inputs = tiny_inputs()
    run_dir = tmp_path / "run"
    _run(tiny_config("fedavg", rounds=2), inputs, run_dir, None, crash_at=("training", 1))
    before = _settled_digest(run_dir)
    with pytest.raises(RunDirError, match="different config"):
        start_aggregator(tiny_config("fedavg", rounds=2, lr=0.05), SETTINGS, run_dir, inputs=inputs)
    assert _digest(run_dir) == before


def test_a_finished_run_restarted_is_reported_and_left_untouched(tmp_path: Path) -> None:
    """No workers are started the second time: the finished run must not wait for them, flip to failed,
    or retrain; with another config it is refused before config.yaml, status.json or clients.json change."""
    cfg, inputs = tiny_config("scaffold", rounds=2), tiny_inputs()
    run_dir = tmp_path / "run"
    assert _run(cfg, inputs, run_dir, tmp_path / "state").run.error is None
    before = _settled_digest(run_dir)
    with pytest.raises(RunFinished, match="finished"):
        start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs)
    with pytest.raises(RunDirError, match="different config"):
        start_aggregator(tiny_config("scaffold", rounds=3), SETTINGS, run_dir, inputs=inputs)
    assert _digest(run_dir) == before
    assert read_json(run_dir / "status.json")["phase"] == "done"


def test_a_simulator_run_is_not_resumed_by_the_cluster(tmp_path: Path) -> None:
    cfg, inputs = tiny_config("fedavg", rounds=2), tiny_inputs()
    run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    before = _digest(tmp_path / "sim")
    with pytest.raises(RunDirError, match="holds a simulator run"):
        start_aggregator(cfg, SETTINGS, tmp_path / "sim", inputs=inputs)
    assert _digest(tmp_path / "sim") == before


@pytest.mark.parametrize("algorithm", ["scaffold"])
def test_every_checkpoint_corrupt_is_refused_and_fresh_starts_over_equal_to_simulation(
        tmp_path: Path, algorithm: str) -> None:
    cfg, inputs = tiny_config(algorithm, rounds=3), tiny_inputs()
    run_dir, state_dir = tmp_path / "run", tmp_path / "worker-state"
    _run(cfg, inputs, run_dir, state_dir, crash_at=("aggregating", 2))
    for _, p in list_checkpoints(run_dir / "checkpoint"):
        p.write_bytes(p.read_bytes()[:-5])  # torn: every one of them
    before = _settled_digest(run_dir)
    with pytest.raises(RunDirError, match=r"none is intact.*round-00000001\.ckpt.*--fresh"):
        start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs)
    assert _digest(run_dir) == before  # no round 0 appended again

    fresh = _finish(start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs, fresh=True), inputs,
                    state_dir)  # the same workers' state dirs: the old run's states there
    assert fresh.run.error is None, fresh.run.error
    old = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(old) == 1 and _digest(old[0]) == before
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    for a, b in zip(load_model_file(run_dir / "model_final.pt").params, sim.params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert [r["round"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3]


def test_fresh_keys_standalone_workers_state_apart_from_the_old_runs(tmp_path: Path) -> None:
    """``--fresh`` on the same directory (here with another seed) while the workers keep their ``--state-dir``:
    the new run has a new key (``runlog.run_key``), so client 0, fitted in the old run's round 0 and first
    fitted in round 1 of the new one, starts from a clean SCAFFOLD state. With the key the directory's name
    alone, it read the old run's round-0 state and the model left the simulation's."""
    inputs = tiny_inputs()
    run_dir, state_dir = tmp_path / "run", tmp_path / "worker-state"
    old = _run(tiny_config("scaffold", rounds=3, seed=1), inputs, run_dir, state_dir)
    assert old.run.error is None and [r["clients"] for r in read_metrics(run_dir / "metrics.jsonl")][0] == [0, 3]
    cfg = tiny_config("scaffold", rounds=3, seed=2)
    fresh = _finish(start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs, fresh=True), inputs, state_dir)
    assert fresh.run.error is None, fresh.run.error
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    assert [r["clients"] for r in sim.records][:2] == [[1, 3], [0, 1]]  # client 0's first fit: round 1
    for a, b in zip(load_model_file(run_dir / "model_final.pt").params, sim.params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    keys = sorted(p.name for p in (state_dir / "w0").iterdir())
    assert len(keys) == 2 and all(k.startswith("run.") for k in keys), keys  # one per run, both "<id>.<instance>"
    assert (run_dir / "instance").read_text().strip() in {k.split(".", 1)[1] for k in keys}
