"""The aggregator's dashboard token: ``python -m server`` / ``fedent cluster up`` flags, the default token on a
non-loopback address, and the 401 answers in the OpenAPI schema."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fedent.cli import build_parser
from server.dashboard.app import create_app
from server.dashboard_access import (
    ENV_TOKEN,
    DashboardToken,
    DashboardTokenError,
    add_dashboard_token_args,
    dashboard_lines,
    dashboard_token_from_args,
    is_loopback,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = """\
name: dashauth
data: {name: synthetic, num_clients: 2, partition: iid, synthetic_train: 40, synthetic_test: 20}
model: {name: mnist-cnn}
train: {rounds: 1, fraction: 1.0, local_epochs: 1, batch_size: 10, lr: 0.05, seed: 3, device: cpu}
algorithm: {name: fedavg}
"""
DATA_ROUTES = ["/api/status", "/api/rounds", "/api/clients", "/api/estimator", "/api/config", "/api/partition",
               "/api/events", "/metrics"]


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_dashboard_token_args(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "192.168.1.2", "example.org"])
def test_non_loopback_hosts(host: str) -> None:
    assert not is_loopback(host)


def test_loopback_without_a_token_stays_open() -> None:
    assert dashboard_token_from_args(_args(), "127.0.0.1", env={}) == DashboardToken(None, generated=False)


def test_non_loopback_without_a_token_generates_one() -> None:
    a = dashboard_token_from_args(_args(), "0.0.0.0", env={})
    b = dashboard_token_from_args(_args(), "0.0.0.0", env={})
    assert a.generated and a.token and len(a.token) >= 43  # secrets.token_urlsafe(32)
    assert a.token != b.token
    assert a.token not in repr(a)


def test_flag_file_and_env_win_over_generation(tmp_path: Path) -> None:
    f = tmp_path / "dash.token"
    f.write_text("from-file\n")
    assert dashboard_token_from_args(_args("--dashboard-token", "t1"), "0.0.0.0", env={ENV_TOKEN: "e"}) == \
        DashboardToken("t1")
    assert dashboard_token_from_args(_args("--dashboard-token-file", str(f)), "0.0.0.0", env={}) == \
        DashboardToken("from-file")
    assert dashboard_token_from_args(_args(), "0.0.0.0", env={ENV_TOKEN: " e "}) == DashboardToken("e")
    assert dashboard_token_from_args(_args(), "127.0.0.1", env={ENV_TOKEN: "e"}) == DashboardToken("e")


def test_bad_token_options_are_one_line_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(DashboardTokenError, match="empty"):
        dashboard_token_from_args(_args("--dashboard-token-file", str(empty)), "0.0.0.0", env={})
    with pytest.raises(DashboardTokenError, match="cannot read"):
        dashboard_token_from_args(_args("--dashboard-token-file", str(tmp_path / "nope")), "0.0.0.0", env={})
    with pytest.raises(DashboardTokenError, match="must not be empty"):
        dashboard_token_from_args(_args("--dashboard-token", " "), "0.0.0.0", env={})
    with pytest.raises(SystemExit):
        _args("--dashboard-token", "a", "--dashboard-token-file", str(empty))


def test_only_a_generated_token_is_printed() -> None:
    url = "http://0.0.0.0:8080"
    assert dashboard_lines("dashboard: ", url, DashboardToken()) == [f"dashboard: {url}"]
    given = dashboard_lines("dashboard: ", url, DashboardToken("secret-given"))
    assert not any("secret-given" in line for line in given)
    made = dashboard_lines("dashboard: ", url, DashboardToken("secret-made", generated=True))
    assert made[0] == f"dashboard: {url}/?token=secret-made"
    assert sum(line.count("secret-made") for line in made) == 1


def test_cluster_up_takes_the_dashboard_token_options() -> None:
    argv = ["cluster", "up", "--config", "c.yaml", "--dashboard-token", "tok"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert dashboard_token_from_args(args, "127.0.0.1", env={}) == DashboardToken("tok")


def test_openapi_declares_401_on_every_data_route(tmp_path: Path) -> None:
    paths = create_app(tmp_path, token="t").openapi()["paths"]
    for route in DATA_ROUTES:
        responses = paths[route]["get"]["responses"]
        assert "401" in responses, route
        assert responses["401"]["content"]["application/json"]["schema"], route
    assert "401" not in paths["/healthz"]["get"]["responses"]


# ---- python -m server, as the README starts it ------------------------------------------------------------

@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[tuple[list[subprocess.Popen[bytes]], Path]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started, tmp_path
    for p in started:  # only the processes this test started, each by its own handle
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _start_server(started: list[subprocess.Popen[bytes]], tmp: Path, host: str) -> tuple[str, str, Path]:
    """(printed dashboard line, dashboard port, stderr log): a standalone aggregator with --dashboard-port 0."""
    cfg = tmp / "c.yaml"
    cfg.write_text(CONFIG)
    out, err = tmp / "stdout.txt", tmp / "stderr.txt"
    env = {k: v for k, v in os.environ.items() if k != ENV_TOKEN}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    with out.open("wb") as o, err.open("wb") as e:
        started.append(subprocess.Popen(
            [sys.executable, "-m", "server", "--config", str(cfg), "--insecure", "--host", host, "--port", "0",
             "--dashboard-port", "0", "--out", str(tmp / "run"), "--register-timeout", "120"],
            cwd=REPO, env=env, stdout=o, stderr=e))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        for line in out.read_text().splitlines():
            m = re.match(r"dashboard: http://[^:/]+:(\d+)", line)
            if m:
                return line, m.group(1), err
        assert started[-1].poll() is None, err.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no dashboard line: {out.read_text()} {err.read_text()}")


def test_server_on_all_interfaces_requires_the_printed_token(
        aggregator: tuple[list[subprocess.Popen[bytes]], Path]) -> None:
    started, tmp = aggregator
    line, port, err = _start_server(started, tmp, "0.0.0.0")
    m = re.search(r"\?token=(\S+)", line)
    assert m, line
    token = m.group(1)
    base = f"http://127.0.0.1:{port}"
    for route in ("/api/config", "/api/clients", "/metrics"):
        r = httpx.get(base + route, timeout=10)
        assert r.status_code == 401, (route, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(base + route, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
        ok = httpx.get(base + route, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert ok.status_code == 200, (route, ok.text)
    assert httpx.get(base + "/healthz", timeout=10).status_code == 200
    stdout = (tmp / "stdout.txt").read_text()
    assert stdout.count(token) == 1, stdout  # printed once, on stdout only
    assert token not in err.read_text()
    assert token not in "".join(p.read_text(errors="replace") for p in (tmp / "run").rglob("*") if p.is_file())


def test_server_on_loopback_stays_open_without_a_token(
        aggregator: tuple[list[subprocess.Popen[bytes]], Path]) -> None:
    started, tmp = aggregator
    line, port, _ = _start_server(started, tmp, "127.0.0.1")
    assert "token" not in line, line
    r = httpx.get(f"http://127.0.0.1:{port}/api/config", timeout=10)
    assert r.status_code == 200, r.text
