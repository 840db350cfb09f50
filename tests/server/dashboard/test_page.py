"""The page rendered with the run's state in it (server/dashboard/page.py): no server, milliseconds."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from plot_records import edited_phi2_style

from fedent import plot_data
from server.dashboard import page, views
from server.dashboard.app import STATIC_DIR
from server.dashboard.rundir import Snapshot

TEMPLATE = STATIC_DIR / "index.html"


def snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = dict(run_id="r1", config=None, partition=None, status=None, clients=None, estimator=None,
                                rounds=[])
    base.update(kw)
    return Snapshot(**base)


def rec(r: int) -> dict[str, Any]:
    return {"round": r, "algorithm": "fedent", "test_acc": 0.25 + r / 10, "test_loss": 1.0, "train_loss": 1.1,
            "clients": [0, 1], "num_clients": 2, "wall_s": 2.0, "elapsed_s": 2.0 * (r + 1),
            "fedent": {"phi2_pred": 1.0, "phi2_actual": 1.1, "entropy": -0.5, "guards": 0,
                       "clients": [{"client": 0, "eta": 0.01, "eta_star": 0.02}]},
            "diagnostics": {}}


def text_of(body: str, element_id: str) -> str:
    m = re.search(r'id="' + re.escape(element_id) + r'"[^>]*>([^<]*)<', body)
    assert m, element_id
    return html.unescape(m.group(1))


def initial_data(body: str, block: str = "initial-data") -> Any:
    m = re.search(r'<script type="application/json" id="' + block + r'">(.*?)</script>', body, re.S)
    assert m
    return json.loads(m.group(1)) if m.group(1) else None


STYLE_FILE = Path(plot_data.__file__).parent / "phi2_style.json"  # the one the plot test checks fedent plot against


LIVE = snap(status={"run_id": "live-run", "algorithm": "fedent", "phase": "training", "round": 3, "round_base": 1,
                    "rounds": 10, "started_at": 1000.0, "updated_at": 1004.0},
            rounds=views.round_rows([rec(0), rec(1)]),
            clients={"clients": [{"cid": 0, "state": "training", "last_heartbeat": 1009.0, "bytes": 5},
                                 {"cid": 1, "state": "training", "last_heartbeat": 1009.0}]},
            partition={"scheme": "iid", "label_counts": [[1, 2], [3, 4]]})


def test_the_page_carries_the_header_numbers_as_text() -> None:
    body = page.render_index(TEMPLATE, LIVE, now=1010.0, stale_after_s=30.0)
    assert "$" not in body  # every placeholder filled
    got = {i: text_of(body, i) for i in ("run-id", "algorithm", "round", "rounds", "phase", "elapsed", "eta",
                                         "last-acc", "progress-text")}
    assert got == {"run-id": "live-run", "algorithm": "fedent", "round": "2", "rounds": "10", "phase": "training",
                   "elapsed": "10 s", "eta": "16 s", "last-acc": "35.0%",
                   "progress-text": "2 / 10 rounds · 20% · round 3 training"}  # rounds 1, 2 done
    assert 'data-phase="training"' in body and 'aria-valuenow="20"' in body


def test_the_page_embeds_what_the_api_would_answer() -> None:
    data = initial_data(page.render_index(TEMPLATE, LIVE, now=1010.0, stale_after_s=30.0))
    assert data["status"] == views.build_status(LIVE, 1010.0).model_dump(mode="json")
    assert data["rounds"] == views.build_rounds(LIVE, 0, page.FIRST_ROUNDS).model_dump(mode="json")
    assert data["clients"] == views.build_clients(LIVE, 1010.0, 30.0).model_dump(mode="json")
    assert data["estimator"] == views.build_estimator(LIVE).model_dump(mode="json")
    assert data["partition"] == views.build_partition(LIVE).model_dump(mode="json")
    assert [c["health"] for c in data["clients"]["clients"]] == ["ok", "ok"]


def test_without_a_snapshot_the_page_holds_no_run_data() -> None:
    """With a token configured the page is open to anyone, so it stays a shell: dashes, no embedded data."""
    body = page.render_index(TEMPLATE, None, now=0.0, stale_after_s=30.0)
    assert "$" not in body and initial_data(body) is None
    for i in ("run-id", "round", "rounds", "phase", "elapsed", "eta", "last-acc", "progress-text"):
        assert text_of(body, i) == page.DASH, i


def test_hostile_values_cannot_break_out_of_the_page() -> None:
    evil = '</script><script>alert(1)</script><!-- & "x"'
    s = snap(status={"run_id": evil, "algorithm": evil, "phase": "done", "rounds": 1},
             rounds=views.round_rows([rec(0)]), clients={"clients": [{"cid": 0, "worker": evil}]})
    body = page.render_index(TEMPLATE, s, now=0.0, stale_after_s=30.0)
    assert body.count("</script>") == 3 and "<script>" not in body and "<!--" not in body  # 2 data blocks, main.js
    assert text_of(body, "run-id") == evil
    data = initial_data(body)
    assert data["status"]["run_id"] == evil and data["clients"]["clients"][0]["worker"] == evil


def test_the_page_carries_the_phi2_style_of_fedent_plot() -> None:
    """The φ2 chart's style is the core's style file, embedded with and without run data (a token): the same file
    tests/fedent/test_plots.py checks `fedent plot`'s φ2 lines against, so the two cannot diverge."""
    raw = json.loads(STYLE_FILE.read_text(encoding="utf-8"))
    for s in (LIVE, None):
        body = page.render_index(TEMPLATE, s, now=1010.0, stale_after_s=30.0)
        assert initial_data(body, "phi2-style") == {"series": raw["series"]}


def test_the_page_follows_an_edited_style_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = edited_phi2_style(tmp_path, monkeypatch, "measured </script>")
    body = page.render_index(TEMPLATE, LIVE, now=1010.0, stale_after_s=30.0)
    assert initial_data(body, "phi2-style") == edited and body.count("</script>") == 3


def test_no_module_of_the_page_spells_a_phi2_label() -> None:
    """The page's JavaScript takes the φ2 series' labels from the embedded block only: a copy in a module would be
    a second style that `fedent plot` does not follow."""
    labels = [s["label"] for s in json.loads(STYLE_FILE.read_text(encoding="utf-8"))["series"]]
    for js in STATIC_DIR.glob("*.js"):
        text = js.read_text(encoding="utf-8")
        assert not [lab for lab in labels if lab in text], js.name
        assert "predicted φ2" not in text and "actual φ2" not in text, js.name  # the labels before the style file


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "–"), (0.04, "0.0 s"), (0.05, "0.1 s"), (9.95, "9.9 s"), (59.4, "59 s"), (125.9, "2 m 05 s"),
    (3725.0, "1 h 02 m"), (-3.0, "0.0 s"), (float("inf"), "–"),
])
def test_durations_read_as_format_js_writes_them(seconds: float | None, text: str) -> None:
    assert page.fmt_duration(seconds) == text


@pytest.mark.parametrize(("v", "text"), [
    (None, "–"), (0.15, "15.0%"), (1 / 3, "33.3%"), (0.0005, "0.1%"), (1.0, "100.0%"),
])
def test_percentages_read_as_format_js_writes_them(v: float | None, text: str) -> None:
    assert page.fmt_pct(v) == text


def test_a_stopped_run_ends_the_phase_strip_in_stopped() -> None:
    """SIGTERM/SIGINT end a run "stopped" (resumable): the strip has that step, shown by the section's phase
    (the CSS shows an end-only step only for its phase), and no round is "in flight" any more."""
    stopped = snap(status={"run_id": "s", "algorithm": "fedavg", "phase": "stopped", "round": 3, "round_base": 1,
                           "rounds": 10, "started_at": 1000.0, "updated_at": 1004.0,
                           "state": {"reason": "stopped by SIGTERM"}},
                   rounds=views.round_rows([rec(0), rec(1)]))
    body = page.render_index(TEMPLATE, stopped, now=1010.0, stale_after_s=30.0)
    assert '<section class="progress" aria-label="run progress" data-phase="stopped">' in body
    assert '<li data-phase="stopped" class="end-only">stopped</li>' in body
    assert text_of(body, "progress-text") == "2 / 10 rounds · 20%"
    css = (Path(page.__file__).parent / "static" / "style.css").read_text()
    assert '.progress[data-phase="stopped"] .phases li[data-phase="stopped"]' in css
