"""`fedent cluster up` prints one progress line per completed round."""

from __future__ import annotations

from server.launcher_cli import round_line


def test_round_line_formats_a_metrics_record() -> None:
    rec = {"round": 2, "test_acc": 0.51234, "train_loss": 1.5, "num_clients": 5, "wall_s": 2.04}
    assert round_line(rec, 5) == "fedent cluster: round 3/5: test acc 0.5123, train loss 1.5000, 5 clients, 2.0s"


def test_round_line_without_evaluation() -> None:
    rec = {"round": 0, "test_acc": None, "train_loss": None, "num_clients": 3, "wall_s": None}
    assert round_line(rec, None) == "fedent cluster: round 1: test acc -, train loss -, 3 clients, -"
