"""`fedent cluster up` prints one progress line per completed round."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedent.cli import main
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
