"""Three run records (metrics.jsonl lines) of every shape the figures meet: an evaluated round with FedEnt's
diagnostics, one without an evaluation or FedEnt, and one with a single client; shared by the tests of
fedent.plot_data (what is read out of records) and fedent.plots (how it is drawn)."""

from __future__ import annotations

from typing import Any

RECS: list[dict[str, Any]] = [
    {"round": 0, "test_acc": 0.2, "train_loss": 2.0, "diagnostics": {"local_acc": [0.1, 0.3]},
     "fedent": {"phi2_pred": 5.0, "phi2_actual": 4.0, "entropy": -1.2,
                "clients": [{"client": 3, "eta": 0.01}, {"client": 7, "eta": 0.02}]}},
    {"round": 1, "test_acc": None, "train_loss": 1.5, "diagnostics": {}, "fedent": None},
    {"round": 2, "test_acc": 0.6, "train_loss": 1.0, "diagnostics": {"local_acc": [0.5]},
     "fedent": {"phi2_pred": 6.0, "phi2_actual": 6.5, "entropy": -1.1, "clients": [{"client": 3, "eta": 0.03}]}},
]


def edited_phi2_style(tmp_path: Any, monkeypatch: Any, first_label: str = "measured") -> dict[str, Any]:
    """A φ2 style file unlike the shipped one (order, labels, colours, dashes, markers), put in its place for
    the test: both fedent plot and the page must follow it. Returns its contents."""
    import json

    from fedent import plot_data

    edited = {"series": [
        {"key": "phi2_actual", "label": first_label, "color": "#123456", "dash": "dotted", "marker": "o"},
        {"key": "phi2_pred", "label": "guessed", "color": "#abcdef", "dash": "solid", "marker": "s"},
    ]}
    path = tmp_path / "phi2_style.json"
    path.write_text(json.dumps(edited), encoding="utf-8")
    monkeypatch.setattr(plot_data, "PHI2_STYLE_FILE", path)
    return edited
