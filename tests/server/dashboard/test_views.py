"""Unit tests of the dashboard's run-dir readers, view builders and Prometheus text (no server, milliseconds)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from server.dashboard import prometheus, views
from server.dashboard.rundir import RunDirReader, Snapshot


def snap(metrics: list[dict[str, Any]] | None = None, **kw: Any) -> Snapshot:
    base: dict[str, Any] = dict(run_id="r1", config=None, partition=None, status=None, clients=None, estimator=None,
                                rounds=views.round_rows(metrics or []))
    base.update(kw)
    return Snapshot(**base)


def rec(r: int, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"round": r, "algorithm": "fedent", "test_acc": 0.5 + r / 100, "test_loss": 1.0,
                         "train_loss": 1.1, "clients": [r % 3, 3], "num_clients": 2, "wall_s": 2.0,
                         "elapsed_s": 2.0 * (r + 1), "fedent": None, "diagnostics": {}}
    d.update(kw)
    return d


def fedent_diag(r: int) -> dict[str, Any]:
    return {"phi2_pred": 10.0 + r, "phi2_actual": 10.5 + r, "entropy": -0.69, "guards": r % 2,
            "clients": [{"client": 3, "theta": 0.5, "eta": 0.01 * (r + 1), "eta_star": 0.02 * (r + 1),
                         "variant": "exact"}]}


def test_coercion_rejects_nan_bools_and_strings() -> None:
    assert views.num(float("nan")) is None and views.num(float("inf")) is None
    assert views.num(True) is None and views.num("1.0") is None
    assert views.num(3) == 3.0
    assert views.integer(2.0) == 2 and views.integer(2.5) is None and views.integer(False) is None
    assert views.timestamp("2026-01-01T00:00:00Z") == pytest.approx(1767225600.0)
    assert views.timestamp("yesterday") is None


def test_round_rows_skip_unusable_records_and_null_bad_values() -> None:
    rows = views.round_rows([
        {"round": "x"}, {"no": "round"},
        rec(0, test_acc=float("nan"), clients=[1, "two", 3.0], fedent={"clients": [{"client": None}, {"client": 4}]}),
    ])
    assert len(rows) == 1
    r = rows[0]
    assert r.test_acc is None and r.clients == [1, 3]
    assert r.fedent is not None and [c.client for c in r.fedent.clients] == [4]


def test_status_without_any_file_is_unknown_not_an_error() -> None:
    st = views.build_status(snap(), now=100.0)
    assert (st.run_id, st.phase, st.rounds, st.rounds_completed, st.eta_s) == ("r1", "unknown", None, 0, None)


def test_status_elapsed_and_eta_of_a_live_run() -> None:
    status = {"run_id": "live", "algorithm": "fedent", "phase": "training", "round": 2, "rounds": 10,
              "started_at": 1000.0, "updated_at": 1004.0}
    st = views.build_status(snap(status=status, metrics=[rec(0, wall_s=1.0), rec(1, wall_s=3.0)]), now=1010.0)
    assert st.elapsed_s == pytest.approx(10.0)
    assert st.eta_s == pytest.approx(8 * 2.0)  # 8 rounds left x mean round time
    assert st.progress == pytest.approx(0.2)


def test_status_of_finished_and_failed_runs() -> None:
    done = {"phase": "done", "rounds": 2, "started_at": 1000.0, "updated_at": 1030.0}
    st = views.build_status(snap(status=done, metrics=[rec(0), rec(1)]), now=5000.0)
    assert st.elapsed_s == pytest.approx(30.0) and st.eta_s == 0.0 and st.progress == 1.0
    failed = {"phase": "failed", "rounds": 5, "state": {"error": "SimulationError: diverged"}}
    st = views.build_status(snap(status=failed), now=0.0)
    assert st.error == "SimulationError: diverged" and st.eta_s is None


def test_status_falls_back_to_config_and_metrics() -> None:
    cfg = {"train": {"rounds": 2}, "algorithm": {"name": "fedavg"}}
    st = views.build_status(snap(config=cfg, metrics=[rec(0), rec(1)]), now=0.0)
    assert (st.rounds, st.algorithm, st.phase, st.elapsed_s) == (2, "fedavg", "done", 4.0)


def test_clients_fallback_from_metrics_counts_participation_and_last_eta() -> None:
    metrics = [rec(r, fedent=fedent_diag(r)) for r in range(3)]
    out = views.build_clients(snap(metrics=metrics, partition={"num_clients": 5, "sizes": [7, 8, 9, 10, 11]}), now=0.0)
    assert out.source == "metrics.jsonl"
    by = {c.cid: c for c in out.clients}
    assert sorted(by) == [0, 1, 2, 3, 4]
    assert by[3].participation == 3 and by[0].participation == 1 and by[4].participation == 0
    assert by[3].eta == pytest.approx(0.03) and by[3].eta_star == pytest.approx(0.06)
    assert by[4].samples == 11 and by[4].health == "unknown"


def test_client_health_and_traffic_from_clients_json() -> None:
    rows = {"clients": [
        {"cid": 0, "state": "training", "last_heartbeat": 95.0, "bytes": {"sent": 10, "received": 5}},
        {"cid": 1, "state": "training", "last_heartbeat": 10.0, "bytes": 99},
        {"cid": 2, "state": "lost", "last_heartbeat": 99.0},
        {"cid": 3, "state": "waiting"},
    ]}
    out = views.build_clients(snap(clients=rows, status={"phase": "training"}), now=100.0, stale_after_s=30.0)
    by = {c.cid: c for c in out.clients}
    assert [by[i].health for i in range(4)] == ["ok", "stale", "down", "unknown"]
    assert (by[0].bytes_sent, by[0].bytes_received, by[0].bytes_total) == (10, 5, 15)
    assert (by[1].bytes_sent, by[1].bytes_total) == (None, 99)
    assert by[0].heartbeat_age_s == pytest.approx(5.0)
    # a run that is over has no stale (nor ok) clients: nobody is connected or expected to heartbeat any more
    done = views.build_clients(snap(clients=rows, status={"phase": "done"}), now=100.0)
    assert [c.health for c in done.clients] == ["finished", "finished", "down", "finished"]
    failed = views.build_clients(snap(clients=rows, status={"phase": "failed"}), now=100.0)
    assert [c.health for c in failed.clients] == ["stopped", "stopped", "down", "stopped"]


def test_where_data_came_from_and_how_the_run_evaluates() -> None:
    rows = {"clients": [{"cid": 0, "data_source": "/data/client-0/train.npz", "samples": 17},
                        {"cid": 1, "data_source": "central (system:/usr/share/datasets/fashion-mnist)"}, {"cid": 2}]}
    cfg = {"train": {"evaluation": "federated"}, "data": {"placement": "workers"}}
    by = {c.cid: c for c in views.build_clients(snap(clients=rows), now=0.0).clients}
    assert [by[i].data_source for i in range(3)] == ["/data/client-0/train.npz",
                                                      "central (system:/usr/share/datasets/fashion-mnist)", None]
    st = views.build_status(snap(config=cfg, status={"phase": "training", "state": {"evaluation": "federated"}}), 0.0)
    assert (st.evaluation, st.data_placement) == ("federated", "workers")
    old = views.build_status(snap(config={"train": {}, "data": {}}), 0.0)  # a run from before these keys
    assert (old.evaluation, old.data_placement) == ("server", "central")
    assert (views.build_status(snap(), 0.0).evaluation, views.build_status(snap(), 0.0).data_placement) == (None, None)


def test_clients_of_a_finished_run_show_finished_even_without_status_json() -> None:
    """The phase /api/status infers (config rounds reached) is the one the clients' health follows."""
    metrics = [rec(r, fedent=fedent_diag(r)) for r in range(2)]
    s = snap(metrics=metrics, config={"train": {"rounds": 2}}, clients={"clients": [{"cid": 0}, {"cid": 3}]})
    assert views.build_status(s, 0.0).phase == "done"
    assert {c.health for c in views.build_clients(s, now=0.0).clients} == {"finished"}
    live = snap(metrics=metrics[:1], config={"train": {"rounds": 2}}, status={"phase": "training"},
                clients={"clients": [{"cid": 0, "state": "training"}]})
    assert {c.cid: c.health for c in views.build_clients(live, now=0.0).clients}[0] == "ok"


@pytest.mark.parametrize(("raw", "expected"), [
    ({"bytes": 99}, (None, None, 99)),
    ({"bytes": {"sent": 10, "received": 5}}, (10, 5, 15)),
    ({"bytes": {"sent": 10, "received": 5, "total": 99}}, (10, 5, 15)),  # the directions win over a wrong total
    ({"bytes": [7, 3]}, (7, 3, 10)),
    ({"bytes": {"sent": 10}}, (10, None, 10)),
    ({"bytes_sent": 4, "bytes_received": 6, "bytes": 1}, (4, 6, 10)),
    ({"bytes": -5}, (None, None, None)),
    ({}, (None, None, None)),
])
def test_client_traffic_never_contradicts_itself(raw: dict[str, Any], expected: tuple[Any, ...]) -> None:
    c = views.build_clients(snap(clients={"clients": [{"cid": 0, **raw}]}), now=0.0).clients[0]
    assert (c.bytes_sent, c.bytes_received, c.bytes_total) == expected


def test_estimator_overlays_metrics_on_estimator_json() -> None:
    est = {"mode": "offline", "report": {"sweeps": 3, "stopped_by": "eps2"},
           "trajectory": [{"round": 0, "phi2_pred": 1.0}, {"round": 5, "phi2_pred": 6.0, "phi2_actual": float("nan")}]}
    out = views.build_estimator(snap(estimator=est, metrics=[rec(0, fedent=fedent_diag(0))]))
    assert out.available and out.mode == "offline" and out.report["sweeps"] == 3
    assert [p.round for p in out.trajectory] == [1, 6]  # unmarked (an old run directory): read 1..R too
    assert out.trajectory[0].phi2_pred == 10.0 and out.trajectory[0].phi2_actual == 10.5  # metrics win
    assert out.trajectory[1].phi2_actual is None
    assert not views.build_estimator(snap()).available
    from_config = views.build_estimator(snap(config={"algorithm": {"name": "fedent", "estimator": "online"}},
                                             metrics=[rec(0, fedent=fedent_diag(0))]))
    assert from_config.mode == "online"


def test_config_redaction_hides_secrets_everywhere() -> None:
    cfg = {"name": "x", "cluster": {"auth_token": "tok-123", "tls": {"key_password": "pw", "ca": "-----BEGIN X"}},
           "workers": [{"api_key": "k1", "host": "h"}], "train": {"lr": 0.1}}
    out = views.build_config(snap(config=cfg))
    text = json.dumps(out.config)
    for secret in ("tok-123", "pw", "BEGIN", "k1"):
        assert secret not in text
    assert out.config["train"] == {"lr": 0.1} and out.config["workers"][0]["host"] == "h"
    assert sorted(out.redacted) == ["cluster.auth_token", "cluster.tls.ca", "cluster.tls.key_password",
                                    "workers[0].api_key"]


def test_partition_rejects_ragged_counts() -> None:
    ok = views.build_partition(snap(partition={"scheme": "iid", "label_counts": [[1, 2], [3, 4]]}))
    assert (ok.num_clients, ok.num_classes, ok.sizes) == (2, 2, [3, 7])
    bad = views.build_partition(snap(partition={"label_counts": [[1, 2], [3]]}))
    assert bad.label_counts == [] and bad.available


_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? -?[0-9.e+-]+$')


def test_prometheus_text_is_well_formed_and_escapes_labels() -> None:
    s = snap(status={"run_id": 'we"ird\nid', "phase": "training", "rounds": 4, "errors": 2},
             metrics=[rec(r, fedent=fedent_diag(r)) for r in range(2)],
             clients={"clients": [{"cid": 3, "bytes": 100, "state": "training"}]})
    body = prometheus.render(views.build_status(s, 0.0), s.rounds, views.build_clients(s, 0.0),
                             views.build_estimator(s), s.status)
    samples = [ln for ln in body.splitlines() if ln and not ln.startswith("#")]
    for ln in samples:
        assert _SAMPLE.match(ln), ln
    values = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in samples}
    assert values["fedent_rounds_completed"] == 2
    assert values["fedent_round_duration_seconds_count"] == 2
    assert values["fedent_bytes_total"] == 100
    assert values["fedent_errors_total"] == 2
    assert values['fedent_phase{phase="training"}'] == 1 and values['fedent_phase{phase="done"}'] == 0
    assert 'run_id="we\\"ird\\nid"' in body
    assert all(math.isfinite(v) for v in values.values())


def _metrics(s: Snapshot, now: float = 100.0) -> dict[str, float]:
    body = prometheus.render(views.build_status(s, now), s.rounds, views.build_clients(s, now),
                             views.build_estimator(s), s.status)
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
            for ln in body.splitlines() if ln and not ln.startswith("#")}


def _by_health(values: dict[str, float]) -> dict[str, float]:
    return {k[len('fedent_clients{health="'):-2]: v for k, v in values.items() if k.startswith("fedent_clients{")}


def test_prometheus_traffic_counters_add_up() -> None:
    totals_only = {"clients": [{"cid": 0, "bytes": 100}, {"cid": 1, "bytes": 33}, {"cid": 2}]}
    v = _metrics(snap(clients=totals_only, status={"phase": "training"}))
    assert v["fedent_bytes_total"] == 133
    # a writer that records only totals (simulator, round engine) gets no sent/received, never a 0 beside the total
    assert "fedent_bytes_sent_total" not in v and "fedent_bytes_received_total" not in v
    split = {"clients": [{"cid": 0, "bytes": {"sent": 60, "received": 40, "total": 1}},
                         {"cid": 1, "bytes_sent": 20, "bytes_received": 13}, {"cid": 2}]}
    v = _metrics(snap(clients=split, status={"phase": "training"}))
    assert v["fedent_bytes_sent_total"] + v["fedent_bytes_received_total"] == v["fedent_bytes_total"] == 133
    assert (v["fedent_bytes_sent_total"], v["fedent_bytes_received_total"]) == (80, 53)
    mixed = {"clients": [{"cid": 0, "bytes": {"sent": 60, "received": 40}}, {"cid": 1, "bytes": 33}]}
    v = _metrics(snap(clients=mixed, status={"phase": "training"}))
    assert v["fedent_bytes_total"] == 133 and "fedent_bytes_sent_total" not in v


def test_prometheus_client_counts_add_up_and_a_finished_run_has_none_connected() -> None:
    rows = {"clients": [
        {"cid": 0, "state": "training", "last_heartbeat": 95.0}, {"cid": 1, "state": "training", "last_heartbeat": 1.0},
        {"cid": 2, "state": "lost"}, {"cid": 3, "state": "waiting"},
        {"cid": 4, "state": "idle", "last_heartbeat": 99.0},
    ]}
    live = _metrics(snap(clients=rows, status={"phase": "training"}))
    health = _by_health(live)
    assert sum(health.values()) == 5 and set(health) == set(views.HEALTHS)
    assert (health["ok"], health["stale"], health["down"], health["unknown"]) == (2, 1, 1, 1)
    assert live["fedent_connected_clients"] == health["ok"] and live["fedent_down_clients"] == health["down"]
    for phase, ended in (("done", "finished"), ("failed", "stopped")):
        v = _metrics(snap(clients=rows, status={"phase": phase}))
        health = _by_health(v)
        assert v["fedent_connected_clients"] == 0 and v["fedent_down_clients"] == 1
        assert health[ended] == 4 and sum(health.values()) == 5


def test_reader_skips_torn_line_and_sees_updates(tmp_path: Path) -> None:
    reader = RunDirReader(tmp_path)
    assert reader.snapshot().rounds == [] and reader.status() is None
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps(rec(0)) + "\n" + '{"round": 1, "test_a')
    assert [r.round for r in reader.rounds()] == [1]  # unmarked lines (an old run) are read 1..R
    with open(metrics, "a") as f:  # the writer finishes the torn line and appends another, plus garbage
        f.write('cc": 0.9}\nnot json\n' + json.dumps(rec(2)) + "\n")
    rows = reader.rounds()
    assert [r.round for r in rows] == [1, 2, 3] and rows[1].test_acc == 0.9
    assert reader.rounds() is rows  # unchanged file: cached, nothing re-parsed
    metrics.write_text(json.dumps(rec(7)) + "\n")  # shorter: a new log replaced the old one
    assert [r.round for r in reader.rounds()] == [8]
    replaced = tmp_path / "new.jsonl"
    replaced.write_text("".join(json.dumps(rec(r)) + "\n" for r in (4, 5, 6)))
    replaced.replace(metrics)  # a different file (inode) even though it is longer
    assert [r.round for r in reader.rounds()] == [5, 6, 7]
    metrics.unlink()
    assert reader.rounds() == []
    (tmp_path / "status.json").write_text('{"phase": "trai')
    assert reader.status() is None
    (tmp_path / "status.json").write_bytes(b"\xff\xfe garbage")
    assert reader.status() is None
