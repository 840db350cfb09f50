"""kill -9 with real processes on loopback: a worker dies mid-run and is restarted; the aggregator dies
mid-run and is restarted on the same port while its workers keep running and reconnect by themselves;
the estimator service dies mid-fixed-point (FedEnt offline, Algorithm 1) and is restarted on its port.

Every client takes part in every round, so "recovered" is checked exactly: the final model equals the
uninterrupted in-process simulation (1e-5 relative) and every round is in metrics.jsonl once with all
its clients aggregated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from procs import (
    ENV,
    REPO,
    Procs,
    free_port,
    port_of,
    rounds_logged,
    simulate,
    stop_all,
    wait_for,
)
from procs import aggregator as _aggregator
from procs import check_equals_simulation as _check
from procs import estimator as _estimator
from procs import worker as _worker

from fedent.runlog import read_json, read_metrics

ROUNDS = 6
CONFIG = f"""\
name: faults
data: {{name: synthetic, num_clients: 4, partition: iid, synthetic_train: 40, synthetic_test: 20}}
model: {{name: mnist-cnn}}
train: {{rounds: {ROUNDS}, fraction: 1.0, local_epochs: 1, batch_size: 10, lr: 0.05, seed: 3, device: cpu}}
algorithm: {{name: fedavg}}
"""


# FedEnt offline: Algorithm 1 runs on the estimator service before round 0; tiny eps keep it sweeping
# (all max_sweeps: 4 clients x 2 rounds x 2 sweeps = 16 CNN gradients) long enough to be killed midway
FEDENT_ROUNDS = 2
FEDENT_CONFIG = CONFIG.replace(f"rounds: {ROUNDS},", f"rounds: {FEDENT_ROUNDS},").replace(
    "algorithm: {name: fedavg}",
    "algorithm: {name: fedent, estimator: offline, max_sweeps: 2, eps1: 1.0e-12, eps2: 1.0e-12}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[torch.Tensor]:
    """The uninterrupted simulation's final model, computed once for both FedAvg tests (same config)."""
    return simulate(tmp_path_factory.mktemp("sim"), CONFIG)


@pytest.fixture
def procs() -> Iterator[Procs]:
    started: Procs = []
    yield started
    stop_all(started)


@pytest.mark.slow
def test_worker_killed_mid_run_restarts_and_the_run_completes(
        tmp_path: Path, procs: Procs, reference: list[torch.Tensor]) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "run"
    # quorum 1.0 with retries: the round a worker dies in is retried once the restarted worker is back
    agg = _aggregator(procs, cfg, out, 0, tmp_path / "port", "--quorum", "1.0", "--round-retries", "3")
    port = port_of(tmp_path / "port")
    _worker(procs, port, "0-1", "wa")
    wb = _worker(procs, port, "2-3", "wb")
    wait_for(lambda: rounds_logged(out) >= 1, "the first round")
    wb.send_signal(signal.SIGKILL)
    wb.wait(10)
    _worker(procs, port, "2-3", "wb")  # a fresh process for the same clients
    assert agg.wait(120) == 0, agg.stderr.read()[-2000:] if agg.stderr else ""
    _check(out, reference, ROUNDS)
    recs = read_metrics(out / "metrics.jsonl")
    assert any("retried" in r["diagnostics"] for r in recs), "the kill landed after the last round"


@pytest.mark.slow
def test_aggregator_killed_mid_run_restarts_on_its_port_and_workers_reconnect(
        tmp_path: Path, procs: Procs, reference: list[torch.Tensor]) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "run"
    agg = _aggregator(procs, cfg, out, 0, tmp_path / "port")
    port = port_of(tmp_path / "port")
    workers = [_worker(procs, port, "0-1", "wa"), _worker(procs, port, "2-3", "wb")]
    wait_for(lambda: rounds_logged(out) >= 2, "two rounds")
    agg.send_signal(signal.SIGKILL)
    agg.wait(10)
    killed_at = rounds_logged(out)
    assert killed_at < ROUNDS, "the run finished before the kill; make the rounds slower"
    again = _aggregator(procs, cfg, out, port, tmp_path / "port2")  # same run dir: resumes from the checkpoint
    assert again.wait(120) == 0, again.stderr.read()[-2000:] if again.stderr else ""
    for w in workers:  # the original worker processes reconnected, finished the run and left cleanly
        assert w.wait(30) == 0, w.stderr.read()[-2000:] if w.stderr else ""
    _check(out, reference, ROUNDS)


@pytest.mark.slow
def test_estimator_killed_mid_fixed_point_restarts_on_its_port_and_the_run_recovers(
        tmp_path: Path, procs: Procs) -> None:
    """The aggregator's long poll on the job breaks and it starts the job again on the new estimator; the
    worker re-opens its Oracle stream by itself. Algorithm 1 is deterministic, so the run equals the
    simulation."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(FEDENT_CONFIG)
    out = tmp_path / "run"
    log1, log2 = tmp_path / "estimator1.log", tmp_path / "estimator2.log"
    # ports picked up front so the three processes start (import torch) at once; everyone dials with
    # wait_for_ready / reconnects, so start order does not matter
    est_port, port = free_port(), free_port()
    est = _estimator(procs, est_port, tmp_path / "est-port", log1)
    agg = _aggregator(procs, cfg, out, port, tmp_path / "port", "--estimator", f"127.0.0.1:{est_port}")
    _worker(procs, port, "0-3", "wa", "--estimator", f"127.0.0.1:{est_port}")
    wait_for(lambda: " started: " in log1.read_text() and "oracle stream from worker" in log1.read_text(),
              "Algorithm 1 to start with the worker's Oracle stream")
    time.sleep(0.3)  # let it serve some gradient requests
    est.send_signal(signal.SIGKILL)
    est.wait(10)
    first = log1.read_text()
    assert " started: " in first and " done: " not in first, f"the kill missed the fixed point:\n{first}"
    assert not (out / "metrics.jsonl").exists() or rounds_logged(out) == 0, "round 0 ran before φ2 was known"
    _estimator(procs, est_port, tmp_path / "est-port2", log2)  # same port: the aggregator and worker dial it
    assert agg.wait(120) == 0, agg.stderr.read()[-2000:] if agg.stderr else ""
    second = log2.read_text()
    assert " started: " in second and " done: " in second, second
    agg_log = agg.stderr.read() if agg.stderr else ""
    assert "offline job lost" in agg_log, agg_log[-2000:]
    report = read_json(out / "estimator.json")["report"]
    assert report["mode"] == "offline" and report["sweeps"] == 2, report
    _check(out, simulate(tmp_path / "sim", FEDENT_CONFIG), FEDENT_ROUNDS)


def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            except (OSError, IndexError, ValueError):
                continue
            if int(ppid) == pid and state != "Z":
                found.append(int(d.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the launcher's children")
def test_cluster_up_killed_takes_its_estimator_and_workers_with_it(
        tmp_path: Path, procs: Procs) -> None:
    """SIGKILL of `fedent cluster up` (no handler runs): the estimator service and the workers it started
    see their lifeline pipe close and exit within seconds instead of running (and reconnecting) forever."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(FEDENT_CONFIG.replace(f"rounds: {FEDENT_ROUNDS},", "rounds: 500,"))
    out = tmp_path / "run"
    with (tmp_path / "launcher.log").open("w") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "fedent.cli", "cluster", "up", "--config", str(cfg), "--workers", "2",
             "--out", str(out), "--no-dashboard", "--insecure", "--register-timeout", "120"],
            cwd=REPO, env=ENV, stdout=log, stderr=subprocess.STDOUT, text=True)
    procs.append(launcher)

    def all_ready() -> bool:
        try:
            clients = read_json(out / "clients.json")["clients"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return len(clients) == 4 and all(c["state"] not in ("waiting", "registered") for c in clients)

    wait_for(all_ready, "every worker to be ready", timeout=180)
    children = _children(launcher.pid)
    assert len(children) == 3, f"expected the estimator and 2 workers, got {children}"
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(10)
    end = time.monotonic() + 20
    while any(_alive(c) for c in children):
        if time.monotonic() > end:
            left = [c for c in children if _alive(c)]
            for c in left:  # do not leak them into the rest of the session
                os.kill(c, signal.SIGKILL)
            raise AssertionError(f"children {left} outlived the launcher by 20 s")
        time.sleep(0.1)
