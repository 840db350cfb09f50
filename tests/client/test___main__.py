"""``python -m client --data``: unusable local data stops the worker with one line before it sends anything."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("layout", "needle"), [
    ("empty", "client 1: no training samples"),
    ("unreadable", "train.npz: unreadable"),
    ("missing", "client 1: no folder"),
])
def test_bad_local_data_exits_2_in_one_line_without_dialling(tmp_path: Path, layout: str, needle: str) -> None:
    for cid in (0, 1):
        d = tmp_path / f"client-{cid}"
        if layout == "missing" and cid == 1:
            continue
        d.mkdir()
        n = 0 if layout == "empty" and cid == 1 else 4
        np.savez(d / "train.npz", x=np.zeros((n, 1, 8, 8), np.float32), y=np.zeros(n, np.int64))
        if layout == "unreadable" and cid == 1:
            (d / "train.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with socket.socket() as listener:  # a stand-in aggregator that only counts connections
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "client", "--aggregator", f"127.0.0.1:{port}", "--clients",
                               "0-1", "--insecure", "--data", str(tmp_path)], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing was sent: no connection was even opened
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("worker: ") and needle in lines[0], proc.stderr
