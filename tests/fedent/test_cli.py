"""The simulate/compare/plot commands: one-line errors with exit code 2, and a real end-to-end run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sim_support import write_tiny_config_file

from fedent import runlog
from fedent.cli import main


def test_bad_config_unknown_key_and_bad_set_exit_2_one_line(tmp_path: Path) -> None:
    """Through the real console entry point, in subprocesses (run concurrently to save interpreter start-ups)."""
    cfg = write_tiny_config_file(tmp_path / "c.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: {rounds: 2\n")
    cases = [
        (["--config", str(broken)], "config error: " + str(broken) + ":2:1: not valid YAML"),  # line:column
        (["--config", str(cfg), "--set", "train.bogus=1"], "config error: train: unknown key(s) bogus"),
        (["--config", str(cfg), "--set", "train.rounds"], "--set 'train.rounds': expected key=value"),  # a flag
    ]
    procs = [subprocess.Popen([sys.executable, "-m", "fedent.cli", "simulate", *args, "--out", str(tmp_path / "r")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for args, _ in cases]
    for proc, (args, needle) in zip(procs, cases, strict=True):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (args, err)
        assert err.startswith("fedent simulate: " + needle), err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--set", "train.lr=-1"], "train.lr: must be > 0"),
        (["--set", "algorithm.name=nope"], "unknown algorithm 'nope'"),
        (["--set", "algorithm.beta=2"], "algorithm.beta"),
        (["--local-eval", "-1"], "--local-eval"),
        (["missing"], "config file not found"),
    ],
)
def test_simulate_bad_values_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                    needle: str) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml", algorithm="fedent")
    if extra == ["missing"]:
        cfg, extra = tmp_path / "missing.yaml", []
    rc = main(["simulate", "--config", str(cfg), "--out", str(tmp_path / "runs"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_missing_dataset_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml")
    rc = main(["simulate", "--config", str(cfg), "--set", "data.name=cifar10", "--set", f"data.root={tmp_path}",
               "--out", str(tmp_path / "runs"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "cifar10" in err and len(err.strip().splitlines()) == 1


def test_compare_rejects_bad_lists_and_algo_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml")
    for extra, needle in ((["--algorithms", "fedavg,nope"], "unknown algorithm 'nope'"),
                          (["--seeds", "0,x"], "--seeds: cannot parse"),
                          (["--algo-set", "fedprox.bogus=1", "--algorithms", "fedprox"], "unknown key(s) bogus"),
                          (["--algo-set", "mu=1"], "expected ALGORITHM.KEY=VALUE"),
                          (["--target", "1.5"], "--target")):
        rc = main(["compare", "--config", str(cfg), "--out", str(tmp_path / "cmp"), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and needle in err, (extra, err)
    assert not (tmp_path / "cmp").exists()  # rejected before any training


def test_simulate_end_to_end_then_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml", algorithm="fedent", rounds=2)
    rc = main(["simulate", "--config", str(cfg), "--set", "model.name=lenet5", "--out", str(tmp_path / "runs"),
               "--run-id", "r1", "--no-progress", "--no-plots"])
    out = capsys.readouterr().out
    assert rc == 0 and "run dir" in out
    paths = runlog.RunPaths(tmp_path / "runs" / "r1")
    recs = runlog.read_metrics(paths.metrics)
    assert [r["round"] for r in recs] == [1, 2] and all(r["fedent"] for r in recs)
    part = json.loads(paths.partition.read_text())
    assert part["num_clients"] == 10 and len(part["md5"]) == 32 and sum(part["sizes"]) <= 400
    assert json.loads(paths.status.read_text())["phase"] == "done"
    assert main(["plot", str(paths.root), "--out", str(tmp_path / "p")]) == 0
    made = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert {"accuracy.png", "eta.png", "phi2.png", "train_loss.png"} <= set(made)
    rc = main(["plot", str(tmp_path)])
    assert rc == 2 and "not a run directory" in capsys.readouterr().err


def test_help_and_version_are_fast_imports_only(tmp_path: Path) -> None:
    """`fedent --help` lists every subcommand without importing torch, grpc or the dashboard (lazy CLI)."""
    code = ("import sys\nfrom fedent.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'grpc', 'fastapi', 'cryptography', 'matplotlib')"
            " if m in sys.modules)\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=120).stdout
    assert "HEAVY []" in out, out
    for name in ("partition", "simulate", "compare", "plot", "reproduce", "cluster", "dashboard", "certs"):
        assert f"    {name}" in out, out
    from importlib.metadata import version

    ver = subprocess.run([sys.executable, "-m", "fedent.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert ver.returncode == 0 and ver.stdout.strip() == f"fedent {version('fedent')}", ver


def test_chosen_subcommand_help_is_complete(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--help"])
    assert info.value.code == 0 and "--no-progress" in capsys.readouterr().out


def test_flag_mistakes_are_not_labelled_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml")
    assert main(["simulate", "--config", str(cfg), "--threads", "0", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "fedent simulate: --threads: must be >= 1", err
    assert main(["simulate", "--config", str(cfg), "--set", "train.rounds=x", "--set", "train.lr=y"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedent simulate: config error: train.rounds: expected an integer, got 'x'; "
                          "train.lr: expected a number, got 'y'") and len(err.strip().splitlines()) == 1, err


def test_missing_data_root_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml")
    missing = tmp_path / "no-such-dir"
    rc = main(["simulate", "--config", str(cfg), "--set", "data.name=fashion-mnist", "--set", f"data.root={missing}",
               "--out", str(tmp_path / "runs"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and str(missing) in err and "no such directory" in err and len(err.strip().splitlines()) == 1


def test_progress_is_a_plain_line_per_round_without_a_terminal(tmp_path: Path) -> None:
    """Batch jobs and nohup: stdout is a file or a pipe, so each round is one line (simulate and compare)."""
    cfg = write_tiny_config_file(tmp_path / "c.yaml", rounds=2)
    sim = subprocess.Popen([sys.executable, "-m", "fedent.cli", "simulate", "--config", str(cfg), "--out",
                            str(tmp_path / "runs"), "--no-plots"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    cmp = subprocess.Popen([sys.executable, "-m", "fedent.cli", "compare", "--config", str(cfg), "--algorithms",
                            "fedavg,fedprox", "--out", str(tmp_path / "cmp")], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    out, err = sim.communicate(timeout=300)
    assert sim.returncode == 0, err
    # a round slower than 10 s (a loaded machine) adds an in-round "clients k/n" line; the round lines stay the same
    rounds = [ln for ln in out.splitlines() if " round " in f" {ln}" and ": clients " not in ln]
    assert [ln.split(" acc")[0] for ln in rounds][:2] == ["round 1/2", "round 2/2"]
    assert "\x1b" not in out + err and "\r" not in out + err
    out, err = cmp.communicate(timeout=300)
    assert cmp.returncode == 0, err
    heads = [ln.split(" acc")[0] for ln in out.splitlines() if ln.startswith("run ") and ": clients " not in ln]
    assert heads == ["run 1/2 fedavg s0: round 1/2", "run 1/2 fedavg s0: round 2/2",
                     "run 2/2 fedprox s0: round 1/2", "run 2/2 fedprox s0: round 2/2"], out


def test_a_service_command_without_its_extra_names_the_extra(tmp_path: Path) -> None:
    """Installed as the core only (no grpc, no fastapi), fedent still runs its own commands, and cluster /
    dashboard say which extra to install instead of a traceback."""
    block = ("import sys\n"
             "class Block:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] in ('grpc', 'fastapi'):\n"
             "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
             "sys.meta_path.insert(0, Block())\n"
             "from fedent.cli import main\n"
             "sys.exit(main(sys.argv[1:]))\n")
    script = tmp_path / "core_only.py"
    script.write_text(block)

    def fedent(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)

    res = fedent("cluster", "up", "--config", "demo")
    assert res.returncode == 2 and "needs the [cluster] extra" in res.stderr and "Traceback" not in res.stderr
    res = fedent("dashboard", "runs/x")
    assert res.returncode == 2 and "pip install 'fedent[dashboard]'" in res.stderr, res.stderr
    res = fedent("plugins", "--kind", "models")
    assert res.returncode == 0 and "mnist-cnn" in res.stdout
