"""``python -m server`` on a port already in use (issue 27: it printed a gRPC C-core line or "[Errno 98]" without the
port, and left a stub run directory): one line naming the port and its flag, exit 2, no run directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag", ["--port", "--dashboard-port"])
def test_a_used_port_is_named_with_its_flag_and_leaves_no_run_directory(tmp_path: Path, flag: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        used = held.getsockname()[1]
        ports = {"--port": "0", "--dashboard-port": "0", flag: str(used)}
        out = tmp_path / "run"
        res = subprocess.run([sys.executable, "-m", "server", "--config", str(ROOT / "configs" / "demo.yaml"),
                              "--host", "127.0.0.1", "--insecure", "--out", str(out),
                              *(x for kv in ports.items() for x in kv)],
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr[-2000:])
    assert f"port {used}" in res.stderr and flag in res.stderr and "in use" in res.stderr, res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_the_download_flags_reach_the_settings() -> None:
    import argparse

    from server.__main__ import add_settings_args, settings_from_args

    p = argparse.ArgumentParser()
    add_settings_args(p)
    s = settings_from_args(p.parse_args(["--download-encoding", "delta", "--delta-history", "3"]))
    assert (s.download_encoding, s.delta_history) == ("delta", 3)
    assert settings_from_args(p.parse_args([])).download_encoding == "full"
    with pytest.raises(SystemExit):
        p.parse_args(["--download-encoding", "xor"])
