"""``fedent simulate --procs P``: the ranks' command lines, and a real 2-process launch that equals one process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_parsers import fedent_parser
from sim_support import write_tiny_config_file

from fedent.commands.simulate import child_argv
from fedent.model_file import load_model_file


def test_child_argv_keeps_every_option_but_procs_and_fixes_run_id_and_threads() -> None:
    parser = fedent_parser("simulate")
    argv = ["simulate", "--config", "c.yaml", "--set", "train.rounds=3", "--set", "train.lr=0.1", "--device", "cpu",
            "--executor", "vectorised", "--max-parallel-clients", "4", "--out", "o", "--local-eval", "2",
            "--quorum", "0.5", "--round-retries", "-1", "--checkpoint-keep", "0", "--no-progress", "--no-plots",
            "--reduce", "gather", "--procs", "3"]
    args = parser.parse_args(argv)
    again = parser.parse_args(child_argv(args, "rid", 2))
    assert again.procs is None and again.run_id == "rid" and again.threads == 2
    for k in ("config", "overrides", "device", "executor", "max_parallel_clients", "out", "local_eval", "quorum",
              "round_retries", "checkpoint_keep", "no_progress", "no_plots", "reduce"):
        assert getattr(again, k) == getattr(args, k), k


@pytest.mark.slow  # two fedent processes and one more (~40 s on a busy 2-core box)
def test_procs_2_equals_one_process(tmp_path: Path) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml", rounds=1)
    common = [sys.executable, "-m", "fedent", "simulate", "--config", str(cfg), "--out", str(tmp_path),
              "--no-plots", "--no-progress"]
    two = subprocess.run([*common, "--run-id", "two", "--procs", "2", "--threads", "1"], capture_output=True, text=True,
                         timeout=300)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("final test accuracy") == 1  # only rank 0 reports
    one = subprocess.run([*common, "--run-id", "one", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    a = load_model_file(tmp_path / "one" / "model_final.pt").params
    b = load_model_file(tmp_path / "two" / "model_final.pt").params
    assert max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)) <= 1e-5


def test_reduce_choices_are_the_worlds() -> None:
    from fedent.commands.simulate import REDUCE_CHOICES
    from fedent.distributed import REDUCE_CHOICES as WORLD

    assert REDUCE_CHOICES == WORLD


def test_procs_must_be_positive(tmp_path: Path) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml")
    res = subprocess.run([sys.executable, "-m", "fedent", "simulate", "--config", str(cfg), "--procs", "0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--procs: must be >= 1" in res.stderr
