"""examples/digits end to end: its README's commands, run as written (made a little smaller), in a scratch
directory linking ``examples/``: per-client files from the plug-in dataset, the simulation, and the cluster
whose three workers read only their own clients' files; the cluster's model equals the simulation's."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fedent.model_file import load_model_file
from fedent.runlog import read_json, read_metrics

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits"
SMALL = ["--set", "train.rounds=2"]

pytest.importorskip("sklearn", reason="the example's dataset is scikit-learn's bundled digits")


def example_commands() -> list[list[str]]:
    block = re.search(r"```bash\n(.*?)```", (EXAMPLE / "README.md").read_text(encoding="utf-8"), re.S)
    assert block, "examples/digits/README.md has no bash block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    cmds = [shlex.split(line, comments=True) for line in lines if line.strip()]
    assert cmds[0] == ["export", "PYTHONPATH=$PWD/examples/digits"], cmds[0]  # set here as the test's env
    return cmds[1:]


def test_the_example_runs_in_the_simulator_and_on_worker_local_files(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]), "PYTHONUNBUFFERED": "1"}
    cmds = example_commands()
    assert [c[:2] for c in cmds] == [[".venv/bin/python", "-m"], [".venv/bin/fedent", "simulate"],
                                     [".venv/bin/fedent", "cluster"]]
    for argv in cmds:
        if argv[0] == ".venv/bin/fedent":
            argv = [sys.executable, "-m", "fedent.cli", *argv[1:], *SMALL]
        elif argv[0] == ".venv/bin/python":
            argv = [sys.executable, *argv[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, f"{argv}: {proc.stderr[-2000:]}"
    clients = tmp_path / "digits-clients"
    assert sorted(p.name for p in clients.iterdir()) == [*(f"client-{c}" for c in range(6)), "server_test.npz"]
    sim_dir = next((tmp_path / "digits-sim").glob("**/model_final.pt")).parent
    cluster = tmp_path / "digits-cluster"
    a, b = load_model_file(cluster / "model_final.pt").params, load_model_file(sim_dir / "model_final.pt").params
    rel = max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)) / max(float(y.abs().max()) for y in b)
    assert rel <= 1e-5
    recs = read_metrics(cluster / "metrics.jsonl")
    assert recs[-1]["algorithm"] == "fedavgm" and recs[-1]["diagnostics"]["evaluation"]["mode"] == "server"
    assert recs[-1]["test_acc"] == pytest.approx(read_metrics(sim_dir / "metrics.jsonl")[-1]["test_acc"], abs=1e-9)
    rows = read_json(cluster / "clients.json")["clients"]
    assert len({r["worker"] for r in rows}) == 3
    assert all(f"client-{r['cid']}/train.npz" in r["data_source"] for r in rows)
