"""`fedent cluster up` prints one progress line per completed round."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.cli import main
from fedent.config import ExperimentConfig, load_config
from server.launcher_cli import round_line


def test_round_line_formats_a_metrics_record() -> None:
    rec = {"round": 2, "test_acc": 0.51234, "train_loss": 1.5, "num_clients": 5, "wall_s": 2.04}
    assert round_line(rec, 5) == "fedent cluster: round 3/5: test acc 0.5123, train loss 1.5000, 5 clients, 2.0s"


def test_round_line_without_evaluation() -> None:
    rec = {"round": 0, "test_acc": None, "train_loss": None, "num_clients": 3, "wall_s": None}
    assert round_line(rec, None) == "fedent cluster: round 1: test acc -, train loss -, 3 clients, -"


def test_cluster_up_on_missing_data_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Like `fedent simulate`: no traceback when the dataset is not there (data.root points at nothing)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: t\ndata: {name: fashion-mnist, num_clients: 4}\n"
                   "train: {rounds: 1, device: cpu}\nalgorithm: {name: fedavg}\n")
    missing = tmp_path / "empty-root"
    rc = main(["cluster", "up", "--config", str(cfg), "--set", f"data.root={missing}", "--workers", "1",
               "--insecure", "--no-dashboard", "--exit-when-done", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("fedent cluster: ") and str(missing) in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_aggregator_logs_a_line_per_round() -> None:
    from server.__main__ import round_log_line

    rec = {"round": 2, "test_acc": 0.51234, "train_loss": 1.5, "num_clients": 5, "wall_s": 2.04}
    assert round_log_line(rec, 5) == "round 3/5 done: test acc 0.5123, train loss 1.5000, 5 clients, 2.0s"


def _synthetic(tmp_path: Path) -> tuple[Path, ExperimentConfig]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: t\ndata: {name: synthetic, num_clients: 4}\n"
                   "train: {rounds: 3, device: cpu}\nalgorithm: {name: fedavg}\n")
    return cfg, load_config(cfg)


@pytest.mark.parametrize("entry", ["cluster", "server"])
def test_a_finished_run_is_reported_exit_0_and_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          entry: str) -> None:
    from rundirs import cluster_run_dir, digest

    from server.__main__ import main as server_main

    cfg_file, cfg = _synthetic(tmp_path)
    out = tmp_path / "run"
    cluster_run_dir(out, cfg, rounds_logged=3, checkpoints=(1, 2), phase="done")
    before = digest(out)
    if entry == "cluster":
        rc = main(["cluster", "up", "--config", str(cfg_file), "--workers", "3", "--no-dashboard",
                   "--exit-when-done", "--out", str(out)])
    else:
        rc = server_main(["--config", str(cfg_file), "--insecure", "--port", "0", "--out", str(out)])
    assert rc == 0
    assert "finished (3 rounds, final test accuracy 0.5200" in capsys.readouterr().out
    assert digest(out) == before  # no pki/, no config.yaml or status.json rewritten


def test_corrupt_checkpoints_are_one_line_exit_2_naming_them(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from rundirs import cluster_run_dir, damage, digest

    from fedent.checkpoint import list_checkpoints

    cfg_file, cfg = _synthetic(tmp_path)
    out = tmp_path / "run"
    cluster_run_dir(out, cfg, rounds_logged=2, checkpoints=(0, 1))
    for _, p in list_checkpoints(out / "checkpoint"):
        damage(p)
    before = digest(out)
    rc = main(["cluster", "up", "--config", str(cfg_file), "--workers", "1", "--no-dashboard",
               "--exit-when-done", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "round-00000000.ckpt" in err and "round-00000001.ckpt" in err and "--fresh" in err
    assert digest(out) == before
