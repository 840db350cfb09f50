"""The README's "Workers on other machines" block, run as written on one machine.

Parsed from README.md (not retyped): SERVER_NAME becomes localhost and SERVER_IP 127.0.0.1 (the names
the certificate holds), ``cuda:0`` becomes ``cpu``, the fixed ports become free ones, and the aggregator gets
``--set train.rounds=1`` (small). Lines ending in ``&`` start in the background, the worker lines (one per
"machine") run side by side; everything else is verbatim: the PKI paths ``fedent certs`` writes, the
identities, the estimator's token, the client ranges of configs/demo.yaml.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### Workers on other machines"
DATA = Path("/usr/share/datasets/fashion-mnist")


def block_commands(text: str) -> list[tuple[list[str], bool]]:
    """(argv, background) for each command of the section's bash block."""
    _, found, rest = text.partition(SECTION)
    assert found, f"README.md has no {SECTION!r} section"
    block = re.search(r"```bash\n(.*?)```", rest, re.S)
    assert block
    out = []
    for line in block.group(1).replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            background = argv[-1] == "&"
            out.append((argv[:-1] if background else argv, background))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def localize(argv: list[str], ports: dict[str, str]) -> list[str]:
    text = shlex.join(argv)
    for old, new in ports.items():
        text = re.sub(rf"\b{old}\b", new, text)
    text = text.replace("SERVER_NAME", "localhost").replace("SERVER_IP", "127.0.0.1").replace("cuda:0", "cpu")
    argv = shlex.split(text)
    if argv[0] == ".venv/bin/fedent":
        return [sys.executable, "-m", "fedent.cli", *argv[1:]]
    assert argv[0] == ".venv/bin/python", argv
    return [sys.executable, *argv[1:]]


def test_the_block_is_what_the_test_expects() -> None:
    cmds = block_commands((ROOT / "README.md").read_text())
    kinds = [(c[0] if c[0] == ".venv/bin/fedent" else c[2], bg) for c, bg in cmds]
    assert kinds == [(".venv/bin/fedent", False), ("estimator", True), ("server", True), ("client", False),
                     ("client", False)]


@pytest.mark.skipif(not (DATA / "train-labels-idx1-ubyte.gz").exists(), reason="needs dataset-fashion-mnist")
def test_readme_multi_machine_block_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    ports = {p: str(_free_port()) for p in ("50051", "50052", "8080")}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        for i, (argv, _background) in enumerate(block_commands((ROOT / "README.md").read_text())):
            name = "certs" if argv[0] == ".venv/bin/fedent" else argv[2]
            argv = localize(argv, ports)
            if name == "server":
                argv += ["--set", "train.rounds=1"]
            if name == "certs":
                res = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
                assert res.returncode == 0, res.stderr
                continue
            log = (tmp_path / f"{name}-{i}.log").open("w")
            procs.append((name, subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 text=True)))
            if name == "estimator":  # the next line dials it
                time.sleep(3)
        def log_of(name: str) -> str:
            return "\n".join(p.read_text()[-3000:] for p in sorted(tmp_path.glob(f"{name}-*.log")))

        server = next(p for n, p in procs if n == "server")
        for name, p in procs:
            if name == "client":
                assert p.wait(timeout=600) == 0, log_of("client")
        assert server.wait(timeout=120) == 0, log_of("server")
        run_dirs = list((tmp_path / "runs").glob("*/model_final.pt"))
        assert len(run_dirs) == 1, "the aggregator's default run directory holds the final model"
        assert "registered clients 10-19" in log_of("server")
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
