"""Real service processes on loopback for the process-fault tests and the chaos harness (tests/chaos.py).

One place that knows how to start ``python -m server`` / ``client`` / ``estimator`` for a fault test, wait
for what they write, and check a finished run against the in-process simulation, so the kill-one-process
tests and the random-kill harness start the services the same way.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch

from fedent.config import load_config
from fedent.model_file import load_model_file
from fedent.runlog import read_json, read_metrics
from fedent.sim.simulator import run_simulation

REPO = Path(__file__).resolve().parents[1]
# one torch thread per process unless told otherwise: many processes on few cores
ENV = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1"}
Procs = list[subprocess.Popen[str]]


def _err(log: Path | None) -> IO[str] | int:
    """Where a process's stderr goes: a file (read while it runs, never a pipe that a long run could fill)."""
    return log.open("a") if log is not None else subprocess.PIPE


def _spawn(procs: Procs, args: list[str], log: Path | None, stdout: int | None = None) -> subprocess.Popen[str]:
    err = _err(log)
    try:
        p = subprocess.Popen([sys.executable, *args], cwd=REPO, env=ENV, stdout=stdout, stderr=err, text=True)
    finally:
        if not isinstance(err, int):
            err.close()
    procs.append(p)
    return p


def aggregator(procs: Procs, cfg: Path, out: Path, port: int, port_file: Path, *extra: str,
               log: Path | None = None) -> subprocess.Popen[str]:
    return _spawn(procs, [
        "-m", "server", "--config", str(cfg), "--insecure", "--port", str(port), "--port-file", str(port_file),
        "--out", str(out), "--round-deadline", "30", "--register-timeout", "60", "--heartbeat", "0.5", *extra],
        log, stdout=subprocess.PIPE if log is None else subprocess.DEVNULL)


def worker(procs: Procs, port: int, clients: str, name: str, *extra: str,
           log: Path | None = None) -> subprocess.Popen[str]:
    return _spawn(procs, [
        "-m", "client", "--aggregator", f"127.0.0.1:{port}", "--clients", clients, "--insecure", "--device", "cpu",
        "--name", name, "--connect-timeout", "30", "--reconnect-attempts", "200", "--backoff-base", "0.05",
        "--backoff-cap", "0.3", "--log-level", "WARNING", *extra], log, stdout=subprocess.DEVNULL)


def estimator(procs: Procs, port: int, port_file: Path, log: Path) -> subprocess.Popen[str]:
    """Its INFO log goes to ``log`` (a file, read while it runs: job started / done)."""
    return _spawn(procs, [
        "-m", "estimator", "--host", "127.0.0.1", "--port", str(port), "--port-file", str(port_file), "--insecure",
        "--wait-workers", "60", "--oracle-timeout", "30"], log, stdout=subprocess.DEVNULL)


def stop_all(procs: Procs) -> None:
    """Kill the processes a test started, each by its own handle."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def free_port() -> int:
    """A port the OS just handed out (bound to port 0, then released), for a process restarted on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], object], what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def port_of(port_file: Path) -> int:
    wait_for(lambda: port_file.exists() and port_file.read_text().strip(), f"the port file {port_file.name}")
    return int(port_file.read_text().strip())


def rounds_logged(out: Path) -> int:
    try:
        return len(read_metrics(out / "metrics.jsonl"))
    except (OSError, ValueError):
        return 0


def simulate(tmp: Path, config: str) -> list[torch.Tensor]:
    """The uninterrupted in-process simulation's final model for ``config`` (YAML text), computed with the
    torch thread count the spawned processes use (``ENV``), so the two are comparable to 1e-5."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "cfg.yaml").write_text(config)
    # at the cluster processes' thread count: another count reduces in another order (1e-4 apart by round 10)
    before = torch.get_num_threads()
    torch.set_num_threads(int(ENV["OMP_NUM_THREADS"]))
    try:
        return list(run_simulation(load_config(tmp / "cfg.yaml"), tmp / "sim", progress=False, plots=False).params)
    finally:
        torch.set_num_threads(before)


def relative_error(got: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    num = max(float((a - b).abs().max()) for a, b in zip(got, reference, strict=True))
    return num / max(float(b.abs().max()) for b in reference)


def check_equals_simulation(out: Path, reference: list[torch.Tensor], rounds: int, clients: int = 4) -> None:
    """Done, every round logged once with all its clients aggregated, final model = simulation (1e-5)."""
    assert read_json(out / "status.json")["phase"] == "done"
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["round"] for r in recs] == list(range(1, rounds + 1))
    assert all(r["num_clients"] == clients and "skipped" not in r["diagnostics"] for r in recs)
    assert relative_error(load_model_file(out / "model_final.pt").params, reference) <= 1e-5
