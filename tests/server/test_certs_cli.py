"""``fedent certs --if-missing`` (containers run it on every start) and ``--dashboard-token``."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fedent.cli import main as fedent_main


def _snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_if_missing_makes_the_pki_once_and_then_keeps_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pki"
    args = ["certs", "--out", str(out), "--workers", "aggregator,worker-0", "--dashboard-token", "--if-missing"]
    assert fedent_main(args) == 0
    first = _snapshot(out)
    assert {"ca.crt", "server.crt", "tokens.json", "tokens/worker-0.token", "dashboard.token"} <= set(first)
    assert stat.S_IMODE((out / "dashboard.token").stat().st_mode) == 0o600
    token = first["dashboard.token"].decode().strip()
    assert len(token) >= 40 and token not in capsys.readouterr().out

    assert fedent_main(args) == 0  # a container restart: nothing rewritten, servers' certificates stay valid
    assert "kept the PKI already in" in capsys.readouterr().out
    assert _snapshot(out) == first


def test_if_missing_adds_only_a_missing_dashboard_token(tmp_path: Path) -> None:
    out = tmp_path / "pki"
    assert fedent_main(["certs", "--out", str(out), "--workers", "w"]) == 0
    before = _snapshot(out)
    assert fedent_main(["certs", "--out", str(out), "--workers", "w", "--if-missing", "--dashboard-token"]) == 0
    after = _snapshot(out)
    assert set(after) - set(before) == {"dashboard.token"}
    assert {k: after[k] for k in before} == before


def test_if_missing_refuses_a_pki_without_a_requested_worker(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pki"
    assert fedent_main(["certs", "--out", str(out), "--workers", "worker-0"]) == 0
    capsys.readouterr()
    assert fedent_main(["certs", "--out", str(out), "--workers", "worker-0,worker-1", "--if-missing"]) == 2
    err = capsys.readouterr().err
    assert "tokens/worker-1.token" in err and "--force" in err


def test_if_missing_and_force_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        fedent_main(["certs", "--out", str(tmp_path), "--if-missing", "--force"])
    assert e.value.code == 2
