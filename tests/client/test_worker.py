"""client.worker: a damaged client-state file fails that client alone, in a probe as in a fit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from conftest import tiny_config, tiny_inputs

from client.worker import Worker, WorkerSettings
from fedent.rng import sample_clients
from fedent.runlog import read_metrics
from server.app import start_aggregator
from server.settings import AggregatorSettings

SETTINGS = AggregatorSettings(register_timeout_s=20.0, round_deadline_s=20.0, quorum=0.5)


def _first_new_client(seed: int, clients: int, fraction: float) -> tuple[int, int]:
    """(round r >= 1, a client sampled in r and in no earlier round): its state is loaded, never saved, first."""
    seen: set[int] = set()
    for rnd in range(20):
        picked = sample_clients(seed, rnd, clients, fraction)
        fresh = [c for c in picked if c not in seen]
        if rnd >= 1 and fresh:
            return rnd, fresh[0]
        seen.update(picked)
    raise AssertionError("no client joins late")


@pytest.mark.parametrize("algorithm", ["fedent", "scaffold"])  # FedEnt probes with the state, SCAFFOLD fits
def test_a_damaged_state_file_fails_only_its_client(tmp_path: Path, algorithm: str) -> None:
    cfg, inputs = tiny_config(algorithm, rounds=1), tiny_inputs()
    rnd, victim = _first_new_client(cfg.train.seed, cfg.data.num_clients, cfg.train.fraction)
    cfg = tiny_config(algorithm, rounds=rnd + 1)
    run_dir, state_dir = tmp_path / "run", tmp_path / "state"
    store = state_dir / run_dir.name
    store.mkdir(parents=True)
    (store / f"c{victim:06d}-r{rnd - 1:08d}.state").write_bytes(b"not a fedent state file")
    h = start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs)
    worker = Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=(0, 1, 2, 3), device="cpu",
                                   connect_timeout_s=10, state_dir=str(state_dir)), inputs=inputs)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        assert h.wait(60) and h.run.error is None, h.run.error
        t.join(10)
    finally:
        h.stop(grace_s=0.5)
    rec = read_metrics(run_dir / "metrics.jsonl")[rnd]
    failed = rec["diagnostics"].get("failed_clients", {})
    assert list(failed) == [str(victim)] and "ClientStoreError" in failed[str(victim)], rec["diagnostics"]
    assert "skipped" not in rec["diagnostics"]  # the worker's other client was aggregated
