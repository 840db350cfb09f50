"""plan_run_dir: every decision about an existing run directory is taken before anything is written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_config
from rundirs import cluster_run_dir as _cluster_run
from rundirs import damage as _damage
from rundirs import digest as _digest

from fedent import runlog
from fedent.checkpoint import checkpoint_path
from fedent.rounds.rundir import CLUSTER, SIMULATOR, RunDirError, move_aside, plan_run_dir, run_kind


def test_an_empty_or_missing_directory_is_a_new_run(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=3)
    assert plan_run_dir(tmp_path / "missing", cfg, CLUSTER).action == "new"
    (tmp_path / "pki-only" / "pki").mkdir(parents=True)  # what a launch that failed to start leaves
    assert plan_run_dir(tmp_path / "pki-only", cfg, CLUSTER).action == "new"


def test_every_checkpoint_corrupt_is_refused_naming_them_and_nothing_changes(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=5)
    root = tmp_path / "run"
    _cluster_run(root, cfg, rounds_logged=4, checkpoints=(2, 3))
    for r in (2, 3):
        _damage(checkpoint_path(root / "checkpoint", r))
    before = _digest(root)
    with pytest.raises(RunDirError) as err:
        plan_run_dir(root, cfg, CLUSTER)
    msg = str(err.value)
    assert "\n" not in msg and "round-00000002.ckpt" in msg and "round-00000003.ckpt" in msg
    assert "none is intact" in msg and "--fresh" in msg
    assert _digest(root) == before


def test_fresh_moves_the_old_run_aside_and_starts_new(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=5)
    root = tmp_path / "run"
    _cluster_run(root, cfg, rounds_logged=4, checkpoints=(3,))
    _damage(checkpoint_path(root / "checkpoint", 3))
    before = _digest(root)
    plan = plan_run_dir(root, cfg, CLUSTER, fresh=True)
    assert plan.action == "new" and plan.moved_to is not None
    assert plan.moved_to.name.startswith("run.old-") and not root.exists()
    assert _digest(plan.moved_to) == before  # moved whole, not changed
    root.mkdir()
    assert move_aside(root, now=0).name == "run.old-19700101-000000"


def test_a_newer_corrupt_checkpoint_falls_back_to_an_intact_one(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=5)
    root = tmp_path / "run"
    _cluster_run(root, cfg, rounds_logged=4, checkpoints=(2, 3))
    _damage(checkpoint_path(root / "checkpoint", 3))
    plan = plan_run_dir(root, cfg, CLUSTER)
    assert plan.action == "resume" and "round 3" in plan.detail  # checkpoint file 2 holds round 3 (1..R)


def test_logged_rounds_without_any_checkpoint_are_refused_but_a_crash_in_round_0_restarts(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=5)
    _cluster_run(tmp_path / "far", cfg, rounds_logged=3, checkpoints=())
    with pytest.raises(RunDirError, match="no checkpoint to resume from"):
        plan_run_dir(tmp_path / "far", cfg, CLUSTER)
    # killed after logging round 0, before its first checkpoint: round 0 again is the same computation
    _cluster_run(tmp_path / "early", cfg, rounds_logged=1, checkpoints=())
    assert plan_run_dir(tmp_path / "early", cfg, CLUSTER).action == "new"


def test_a_finished_run_is_reported_and_left_untouched(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=3)
    root = tmp_path / "run"
    _cluster_run(root, cfg, rounds_logged=3, checkpoints=(1, 2), phase="done")
    before = _digest(root)
    plan = plan_run_dir(root, cfg, CLUSTER)
    assert plan.action == "finished" and "finished" in plan.detail and "0.5200" in plan.detail
    assert _digest(root) == before


def test_another_config_or_another_kind_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=3)
    root = tmp_path / "run"
    _cluster_run(root, cfg, rounds_logged=3, checkpoints=(2,), phase="done")
    before = _digest(root)
    with pytest.raises(RunDirError, match="different config"):
        plan_run_dir(root, tiny_config(rounds=3, lr=0.01), CLUSTER)
    with pytest.raises(RunDirError, match="holds a cluster run"):
        plan_run_dir(root, cfg, SIMULATOR)
    assert _digest(root) == before
    # a device change does not change what is computed: still this run
    assert plan_run_dir(root, tiny_config(rounds=3, device="cuda"), CLUSTER).action == "finished"


def test_the_kind_comes_from_status_json_or_the_checkpoints(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=3)
    paths = runlog.create_run_dir(tmp_path / "sim", exist_ok=True)
    runlog.atomic_write_json(paths.status, runlog.status_record("sim", "fedavg", "done", 2, 3, 0.0, {}))
    assert run_kind(paths) == SIMULATOR  # simulator runs written before the mode key existed
    runlog.atomic_write_json(paths.status, runlog.status_record("sim", "fedavg", "done", 2, 3, 0.0,
                                                                {"mode": SIMULATOR}))
    torch.save([torch.zeros(2)], paths.model)
    runlog.write_config(paths.config, cfg.to_dict())
    with pytest.raises(RunDirError, match=f"{paths.root} holds a simulator run; the cluster does not"):
        plan_run_dir(paths.root, cfg, CLUSTER)
    bare = runlog.RunPaths(tmp_path / "bare")
    runlog.create_run_dir(bare.root, exist_ok=True)
    runlog.write_config(bare.config, cfg.to_dict())  # killed before its status.json: nothing ran
    assert run_kind(bare) is None and plan_run_dir(bare.root, cfg, CLUSTER).action == "new"
    bare.checkpoint.mkdir()
    assert run_kind(bare) == CLUSTER


# ---- the run-directory lock (issue 25: a second owner flipped a live run to failed; --fresh moved it away) ----

_HOLDER = ("import sys\nfrom fedent.rounds.rundir import lock_run_dir\nlock_run_dir(sys.argv[1])\n"
           "print('held', flush=True)\nsys.stdin.read()\n")


def _hold(root: Path) -> subprocess.Popen[str]:
    """Another process that owns ``root`` (until its stdin closes or it is killed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[3]),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_run_directory_refuses_a_second_owner_simulate_aggregator_and_fresh(tmp_path: Path) -> None:
    from fedent.rounds.rundir import lock_run_dir
    from fedent.sim.simulator import run_simulation
    from server.app import start_aggregator
    from server.settings import AggregatorSettings

    cfg = tiny_config(rounds=5)
    root = tmp_path / "run"
    _cluster_run(root, cfg, rounds_logged=2, checkpoints=(1,))
    before = _digest(root)
    holder = _hold(root)
    try:
        with pytest.raises(RunDirError) as err:
            lock_run_dir(root)
        msg = str(err.value)
        assert "\n" not in msg and f"pid {holder.pid} on {socket.gethostname()}" in msg and str(root) in msg
        with pytest.raises(RunDirError, match=f"in use by pid {holder.pid}"):
            start_aggregator(cfg, AggregatorSettings(), root, fresh=True)  # --fresh on a live run: refused
        with pytest.raises(RunDirError, match=f"in use by pid {holder.pid}"):
            start_aggregator(cfg, AggregatorSettings(), root)
        with pytest.raises(RunDirError, match=f"in use by pid {holder.pid}"):
            run_simulation(cfg, root, progress=False, plots=False)
        assert root.is_dir() and not list(tmp_path.glob("run.old-*")) and _digest(root) == before
    finally:
        holder.kill()
        holder.wait()
    # the holder died without letting go: its lock is stale and taken over, with a note naming it
    lock = lock_run_dir(root)
    try:
        assert f"pid {holder.pid}" in lock.note and "stale" in lock.note
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert not lock.path.exists()


def test_the_lock_is_reentrant_in_its_process_and_released_by_the_last_holder(tmp_path: Path) -> None:
    from fedent.rounds.rundir import lock_run_dir

    root = tmp_path / "run"
    a = lock_run_dir(root)
    b = lock_run_dir(root)  # the launcher and its in-process aggregator: one owner
    assert a is b and a.note == ""
    info = json.loads(a.path.read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and not root.exists()
    b.release()
    assert a.path.exists()
    a.release()
    assert not a.path.exists()
