"""The README's research commands, run verbatim (parsed from README.md, not retyped), only made small.

Each line of the bash block under "## Research: the simulator" runs as a subprocess in a scratch directory
that links ``configs/`` (so the README's relative paths hold and ``runs/``, ``part.json`` land there). The
``.venv/bin/fedent`` prefix becomes this interpreter's ``-m fedent.cli``; ``runs/<run-id>`` becomes the run
directory the first command (``simulate``) wrote. Appended, per subcommand, is only what makes a command
small (one round of one local epoch, 10 clients, a few hundred images; later ``--set``s win) and, for
``dashboard``, ``--port 0``: it is started, its page and API are fetched, then it is stopped.

Data: the Debian copy of Fashion-MNIST (``dataset-fashion-mnist``) when installed, which is what the README
means; otherwise real-format IDX files written here, passed as the data root (``--set data.root`` /
``--data-root``), the one addition that is not about size.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from datafiles import write_mnist_like

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SECTION = "## Research: the simulator"
PREFIX = ".venv/bin/fedent"
RUN_ID = "runs/<run-id>"
SYSTEM_COPY = Path("/usr/share/datasets/fashion-mnist")

FEDAVG = {"name": "fedavg", "replay_rates": None, "replay": "per_client"}  # FedAvg's defaults (no replay)
SMALL_RUN = ["--set", "train.rounds=1", "--set", "train.local_epochs=1", "--set", "data.num_clients=10",
             "--set", "data.max_train_samples=600", "--set", "data.max_test_samples=200"]
SMALL: dict[str, list[str]] = {"simulate": SMALL_RUN, "compare": SMALL_RUN, "plot": [], "tensorboard": [],
                               "partition": [], "dashboard": ["--port", "0"], "plugins": []}


def research_commands(text: str) -> list[list[str]]:
    """The argv of each command in the section's first bash block (continuations joined, comments dropped)."""
    _, found, rest = text.partition(SECTION)
    assert found, f"README.md has no {SECTION!r} section"
    block = re.search(r"```bash\n(.*?)```", rest, re.S)
    assert block, f"no bash block under {SECTION!r}"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [argv for argv in (shlex.split(line, comments=True) for line in lines) if argv]


def test_the_parser_reads_the_readme_as_written() -> None:
    cmds = research_commands(README.read_text(encoding="utf-8"))
    assert cmds and all(c[0] == PREFIX for c in cmds), cmds
    assert cmds[0][1] == "simulate", "the first command must write the run that runs/<run-id> refers to"
    assert {c[1] for c in cmds} <= set(SMALL), f"a new README command: say how to run it small in SMALL: {cmds}"
    assert any(RUN_ID in c for c in cmds)


def _data_overrides(tmp_path: Path) -> dict[str, list[str]]:
    if (SYSTEM_COPY / "train-labels-idx1-ubyte.gz").exists():
        return {}
    root = tmp_path / "data"
    write_mnist_like(root / "fashion-mnist", n_train=2000, n_test=300)
    return {"simulate": ["--set", f"data.root={root}"], "compare": ["--set", f"data.root={root}"],
            "partition": ["--data-root", str(root)]}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{shlex.join(argv)}\nexit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def _serve_dashboard(argv: list[str], cwd: Path, env: dict[str, str], run_dir: Path) -> None:
    log = cwd / "dashboard.log"
    with log.open("w") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "fedent dashboard: serving RUN_DIR at http://127.0.0.1:PORT/"
        url = re.search(r"at (http://\S+/)", line)
        assert url, f"{shlex.join(argv)}: {line!r}\n{log.read_text()[-4000:]}"
        with urllib.request.urlopen(url.group(1), timeout=60) as r:
            assert r.status == 200 and "html" in r.headers.get("content-type", "")
        with urllib.request.urlopen(url.group(1) + "api/config", timeout=60) as r:
            assert json.load(r)["config"]["algorithm"] == FEDAVG
        with urllib.request.urlopen(url.group(1) + "api/status", timeout=60) as r:
            assert json.load(r)["run_id"] == run_dir.name
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_readme_research_commands_run_verbatim(tmp_path: Path) -> None:
    cmds = research_commands(README.read_text(encoding="utf-8"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "configs").symlink_to(ROOT / "configs", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg")
    data = _data_overrides(tmp_path)
    run_dir: Path | None = None
    for readme_argv in cmds:
        sub = readme_argv[1]
        args = readme_argv[1:]
        if RUN_ID in args:
            assert run_dir is not None, "runs/<run-id> before any run was written"
            args = [str(run_dir.relative_to(work)) if a == RUN_ID else a for a in args]
        argv = [sys.executable, "-m", "fedent.cli", *args, *SMALL[sub], *data.get(sub, [])]
        if sub == "dashboard":
            assert run_dir is not None
            _serve_dashboard(argv, work, env, run_dir)
            continue
        before = set((work / "runs").glob("*")) if (work / "runs").exists() else set()
        if sub == "plot":
            assert run_dir is not None
            shutil.rmtree(run_dir / "plots")  # the simulator wrote them: see that plot writes them again
        _run(argv, work, env)
        if sub == "simulate" and run_dir is None:
            (run_dir,) = set((work / "runs").glob("*")) - before
            cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
            assert cfg["algorithm"] == FEDAVG  # FedEnt's options dropped with the name change
            assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
        if sub == "compare":
            (out,) = (work / "runs").glob("compare-*")
            assert (out / "compare.md").is_file()
            summary = json.loads((out / "summary.json").read_text())
            assert [a["algorithm"] for a in summary["algorithms"]] == args[args.index("--algorithms") + 1].split(",")
            assert not any(a["failed"] for a in summary["algorithms"])
        if sub == "plot":
            assert run_dir is not None
            fmts = args[args.index("--formats") + 1].split(",") if "--formats" in args else ["png"]
            assert all(any((run_dir / "plots").glob(f"*.{f}")) for f in fmts), fmts
        if sub == "tensorboard":
            assert run_dir is not None and any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
        if sub == "partition":
            assert (work / "part.json").is_file() and (work / "part.png").is_file()


