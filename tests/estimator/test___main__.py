"""``python -m estimator`` as a process: announces its port, answers health probes, stops on SIGTERM;
``python -m server.healthcheck`` (the containers' probe) tells SERVING from unreachable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server import healthcheck

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def test_estimator_process_listens_on_a_free_port_and_stops_on_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "estimator", "--host", "127.0.0.1", "--port", "0",
                             "--port-file", str(port_file), "--run-dir", str(tmp_path), "--insecure"],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # blocks until the service is up (or the process died)
        assert line.startswith("LISTENING port="), (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split("=", 1)[1])
        assert port > 0 and port_file.read_text().strip() == str(port)
        ok, status = healthcheck.check(f"127.0.0.1:{port}", "fedentrpc.v1.EstimatorService")
        assert ok and status.endswith("SERVING")
        probe = subprocess.run([sys.executable, "-m", "server.healthcheck", f"127.0.0.1:{port}"], cwd=ROOT,
                               env=_env(), capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0


def test_healthcheck_reports_unreachable_and_bad_addresses() -> None:
    ok, status = healthcheck.check("127.0.0.1:1", timeout_s=0.5)
    assert not ok and "UNAVAILABLE" in status or "DEADLINE" in status
    assert healthcheck.main(["not-an-address"]) == 2
    t0 = time.monotonic()
    assert healthcheck.main(["127.0.0.1:1", "--timeout", "0.5"]) == 1
    assert time.monotonic() - t0 < 10


def test_bad_flags_are_one_line_errors() -> None:
    r = subprocess.run([sys.executable, "-m", "estimator", "--port", "70000", "--insecure"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "estimator: port: must be in [0, 65535], got 70000"


def test_estimator_requires_tls_or_explicit_insecure() -> None:
    env = {k: v for k, v in _env().items() if not k.startswith("FEDENT_")}
    r = subprocess.run([sys.executable, "-m", "estimator", "--port", "0"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("estimator: TLS needs --tls-cert") and r.stderr.count("\n") == 1
