"""fedent.runlog: atomic files, the metrics log and its tolerant reader, layout, redaction."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedent import runlog


def test_atomic_write_json_replaces_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    p = tmp_path / "status.json"
    runlog.atomic_write_json(p, {"a": 1})
    runlog.atomic_write_json(p, {"b": [1, 2]})
    assert json.loads(p.read_text()) == {"b": [1, 2]}
    assert sorted(os.listdir(tmp_path)) == ["status.json"]


def test_atomic_write_failure_keeps_old_content(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    runlog.atomic_write_json(p, {"ok": True})
    with pytest.raises(TypeError):
        runlog.atomic_write_json(p, {"bad": object()})
    assert json.loads(p.read_text()) == {"ok": True}
    assert sorted(os.listdir(tmp_path)) == ["x.json"]


def test_jsonable_converts_numpy_torch_and_non_finite() -> None:
    out = runlog.jsonable({"a": np.float32(0.5), "b": torch.tensor([1, 2]), "c": math.nan, "d": (np.int64(3),),
                           "e": float("inf")})
    assert out == {"a": 0.5, "b": [1, 2], "c": None, "d": [3], "e": None}
    json.dumps(out, allow_nan=False)


def test_metrics_log_roundtrip_and_torn_last_line(tmp_path: Path) -> None:
    log = runlog.MetricsLog(tmp_path / "metrics.jsonl")
    for r in range(3):
        log.append(runlog.metrics_record(round=r, algorithm="fedavg", test_acc=0.1 * r))
    with open(log.path, "a") as f:
        f.write('{"round": 3, "algo')  # a writer died mid-line
    recs = runlog.read_metrics(log.path)
    assert [r["round"] for r in recs] == [0, 1, 2]
    assert all(set(r) == set(runlog.METRIC_KEYS) for r in recs)
    assert recs[0]["test_loss"] is None and recs[0]["diagnostics"] == {}
    assert runlog.final_accuracy(recs) == pytest.approx(0.2)
    assert runlog.read_metrics(tmp_path / "missing.jsonl") == []


def test_metrics_record_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="acc"):
        runlog.metrics_record(round=0, acc=0.5)


def test_status_and_client_rows(tmp_path: Path) -> None:
    st = runlog.status_record("r1", "fedent", "training", 2, 5, started_at=10.0)
    assert set(st) == set(runlog.STATUS_KEYS) and st["phase"] == "training"
    with pytest.raises(ValueError, match="phase"):
        runlog.status_record("r1", "fedent", "sleeping", 0, 5, started_at=0.0)
    row = runlog.client_row(3, samples=10, eta=0.01)
    assert set(row) == set(runlog.CLIENT_KEYS) and row["worker"] is None
    runlog.write_clients(tmp_path / "clients.json", [row])
    assert runlog.read_clients(tmp_path / "clients.json") == [row]
    assert runlog.read_clients(tmp_path / "nope.json") == []


def test_create_run_dir_never_reuses_a_full_directory(tmp_path: Path) -> None:
    a = runlog.create_run_dir(tmp_path / "run")
    (a.root / "metrics.jsonl").write_text("")
    b = runlog.create_run_dir(tmp_path / "run")
    assert a.root != b.root and b.plots.is_dir()
    assert runlog.create_run_dir(tmp_path / "run", exist_ok=True).root == a.root


def test_write_config_redacts_secrets(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    runlog.write_config(p, {"train": {"lr": 0.1}, "tls": {"key_password": "hunter2", "api_token": None}})
    loaded = yaml.safe_load(p.read_text())
    assert loaded["train"]["lr"] == 0.1
    assert loaded["tls"]["key_password"] == runlog.REDACTED and loaded["tls"]["api_token"] is None
    assert "hunter2" not in p.read_text()


def test_new_run_id_is_filesystem_safe() -> None:
    rid = runlog.new_run_id("my exp/1", "fedent", 3, now=0.0)
    assert rid == "my_exp_1-fedent-s3-19700101-000000"


def test_run_files_share_one_permission_policy(tmp_path: Path) -> None:
    """config.yaml, status.json (atomic writes) and metrics.jsonl (appended) get the same mode: open()'s."""
    old = os.umask(0o022)
    runlog._UMASK = None  # read afresh under the umask set here
    try:
        paths = runlog.create_run_dir(tmp_path / "run")
        runlog.write_config(paths.config, {"name": "x", "token": "secret"})
        runlog.atomic_write_json(paths.status, {"phase": "done"})
        runlog.MetricsLog(paths.metrics).append(runlog.metrics_record(round=0))
        modes = {p.name: p.stat().st_mode & 0o777 for p in (paths.config, paths.status, paths.metrics)}
        assert modes == {"config.yaml": 0o644, "status.json": 0o644, "metrics.jsonl": 0o644}, modes
        assert "secret" not in paths.config.read_text()  # why 0644 is safe: secrets are redacted
        runlog.atomic_write_bytes(tmp_path / "key.pem", b"k", mode=0o600)
        assert (tmp_path / "key.pem").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
        runlog._UMASK = None


def test_metrics_log_refuses_a_file_replaced_under_it(tmp_path: Path) -> None:
    """A writer whose run directory was removed and made again stops instead of appending to the new run's log."""
    import shutil

    run = tmp_path / "run"
    log = runlog.MetricsLog(run / "metrics.jsonl")
    log.append(runlog.metrics_record(round=0))
    log.append(runlog.metrics_record(round=1))
    shutil.rmtree(run)
    run.mkdir()
    fresh = runlog.MetricsLog(run / "metrics.jsonl")
    fresh.append(runlog.metrics_record(round=0))  # the new run's first line
    with pytest.raises(runlog.ReplacedRunError, match="removed or replaced"):
        log.append(runlog.metrics_record(round=2))
    assert [r["round"] for r in runlog.read_metrics(run / "metrics.jsonl")] == [0]
    (run / "metrics.jsonl").unlink()
    with pytest.raises(runlog.ReplacedRunError):
        fresh.append(runlog.metrics_record(round=1))


def test_a_run_instance_is_written_once_and_read_back(tmp_path: Path) -> None:
    paths = runlog.RunPaths(tmp_path / "run")
    paths.root.mkdir()
    assert runlog.run_instance(paths, create=False) == ""  # a resume never invents one
    assert not paths.instance.exists() and runlog.run_key(paths, "") == "run"
    first = runlog.run_instance(paths, create=True)
    assert len(first) == 12 and runlog.run_instance(paths, create=True) == first  # a restart keeps it
    assert runlog.run_instance(paths, create=False) == first and runlog.run_key(paths, first) == f"run.{first}"
    other = runlog.RunPaths(tmp_path / "again")
    other.root.mkdir()
    assert runlog.run_instance(other, create=True) != first


def test_a_damaged_run_instance_is_refused(tmp_path: Path) -> None:
    paths = runlog.RunPaths(tmp_path)
    paths.instance.write_text("../../etc\n")
    with pytest.raises(ValueError, match="not a run instance"):
        runlog.run_instance(paths, create=True)
    assert paths.instance.read_text() == "../../etc\n"  # not overwritten


def test_rounds_are_numbered_1_to_r_and_an_old_log_reads_the_same(tmp_path: Path) -> None:
    """One numbering (issue 27): a written line says round 1 for the first round and carries the marker; a
    line from before the marker (rounds 0..R-1) reads as the same round; marked lines are left alone."""
    new = runlog.metrics_record(round=1, algorithm="fedavg")
    assert (new["round"], new["round_base"]) == (1, runlog.ROUND_BASE) == (1, 1)
    old = tmp_path / "old.jsonl"
    old.write_text('{"round": 0, "test_acc": 0.5}\n{"round": 1, "test_acc": 0.6}\n')
    assert [(r["round"], r["round_base"]) for r in runlog.read_metrics(old)] == [(1, 1), (2, 1)]
    cur = tmp_path / "new.jsonl"
    cur.write_text('{"round": 1, "round_base": 1}\n{"round": 2, "round_base": 1}\n')
    assert [r["round"] for r in runlog.read_metrics(cur)] == [1, 2]
    assert runlog.round_of({"round": 4}) == 5 and runlog.round_of({"round": 4, "round_base": 1}) == 4
    status = runlog.status_record("r", "fedavg", "training", 3, 5, 0.0)
    assert (status["round"], status["round_base"]) == (3, 1)
