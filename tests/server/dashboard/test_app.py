"""The dashboard against a REAL FedEnt simulator run: REST API through uvicorn on port 0, SSE, token, CLI,
and the live page in headless Chromium (skipped only when /usr/bin/chromium is missing)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml

from fedent import runlog
from fedent.cli import main as fedent_main
from fedent.config import config_from_dict
from fedent.sim.simulator import run_simulation
from server.dashboard import DashboardServer, create_app, serve_dashboard

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "dash-T0ken-6f1c"
ROUNDS = 3
NUM_CLIENTS = 4


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny but real FedEnt simulation (synthetic data, LeNet-5), so every run file is the genuine article."""
    cfg = config_from_dict({
        "name": "dash",
        "data": {"name": "synthetic", "num_clients": NUM_CLIENTS, "partition": "dirichlet", "alpha": 0.5,
                 "synthetic_train": 160, "synthetic_test": 40, "min_samples": 5},
        "model": {"name": "lenet5"},
        "train": {"rounds": ROUNDS, "fraction": 0.5, "local_epochs": 1, "batch_size": 32, "lr": 0.05,
                  "device": "cpu", "seed": 3},
        "algorithm": {"name": "fedent"},
    })
    run_dir = tmp_path_factory.mktemp("dash") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core box, one thread is ~10x faster than two contending ones
    try:
        run_simulation(cfg, run_dir, progress=False, plots=False)
    finally:
        torch.set_num_threads(threads)
    return run_dir


def metrics_of(run_dir: Path) -> list[dict[str, Any]]:
    return runlog.read_metrics(run_dir / "metrics.jsonl")


@pytest.fixture()
def serve() -> Iterator[Any]:
    """serve(run_dir, **create_app kwargs) -> base URL; every server is stopped after the test."""
    handles: list[DashboardServer] = []

    def start(run_dir: Path, **kw: Any) -> str:
        handle, port = serve_dashboard(create_app(run_dir, **kw), port=0)
        handles.append(handle)
        assert port > 0 and handle.port == port
        return handle.url

    yield start
    for h in handles:
        h.stop()
        assert not h.thread.is_alive()


@pytest.fixture(scope="module")
def api(real_run: Path) -> Iterator[str]:
    handle, _ = serve_dashboard(create_app(real_run), port=0)
    yield handle.url
    handle.stop()


_HTTP = httpx.Client(timeout=10)  # one client: building an SSL context per request costs ~50 ms


def get(url: str, **kw: Any) -> httpx.Response:
    return _HTTP.get(url, **kw)


# ---- the API over a real run ------------------------------------------------------------------------------------

def test_status_of_the_finished_run(api: str, real_run: Path) -> None:
    st = get(api + "/api/status").json()
    assert st["run_id"] == real_run.name and st["algorithm"] == "fedent"
    assert (st["phase"], st["rounds"], st["rounds_completed"], st["progress"], st["eta_s"]) == (
        "done", ROUNDS, ROUNDS, 1.0, 0.0)
    assert st["round"] == ROUNDS  # one numbering (1..R): done after round R, not "round R-1 of R completed"
    assert st["elapsed_s"] > 0


def test_rounds_are_paged_and_match_metrics_jsonl(api: str, real_run: Path) -> None:
    recs = metrics_of(real_run)
    page = get(api + "/api/rounds", params={"offset": 1, "limit": 1}).json()
    assert (page["total"], page["offset"], page["limit"]) == (ROUNDS, 1, 1)
    assert [r["round"] for r in page["items"]] == [2] == [recs[1]["round"]]  # the second round, 1..R
    assert page["items"][0]["test_acc"] == recs[1]["test_acc"]
    assert page["items"][0]["fedent"]["phi2_pred"] == recs[1]["fedent"]["phi2_pred"]
    got, logged = page["items"][0]["fedent"], recs[1]["fedent"]  # spec §5's fields reach the API as logged
    assert (got["eta_max"], got["phi2_rate"]) == (logged["eta_max"], logged["phi2_rate"]) == (1.0, "used")
    assert [c["eta_prev"] for c in got["clients"]] == [c["eta_prev"] for c in logged["clients"]]
    everything = get(api + "/api/rounds").json()
    assert [r["round"] for r in everything["items"]] == list(range(1, ROUNDS + 1))
    assert get(api + "/api/rounds", params={"offset": 50}).json()["items"] == []


@pytest.mark.parametrize("params", [
    {"limit": 0}, {"limit": "ten"}, {"offset": -1}, {"limit": 100000}, {"offset": "1.5"},
])
def test_bad_paging_params_are_422(api: str, params: dict[str, Any]) -> None:
    r = get(api + "/api/rounds", params=params)
    assert r.status_code == 422, r.text


def test_clients_carry_participation_and_fedent_eta(api: str, real_run: Path) -> None:
    recs = metrics_of(real_run)
    out = get(api + "/api/clients").json()
    assert out["source"] == "clients.json"
    rows = {c["cid"]: c for c in out["clients"]}
    assert sorted(rows) == list(range(NUM_CLIENTS))
    sizes = json.loads((real_run / "partition.json").read_text())["sizes"]
    assert [rows[i]["samples"] for i in range(NUM_CLIENTS)] == sizes
    assert sum(c["participation"] for c in rows.values()) == sum(r["num_clients"] for r in recs)
    last_eta: dict[int, float] = {}
    for r in recs:
        for d in r["fedent"]["clients"]:
            last_eta[d["client"]] = d["eta"]
    assert last_eta, "a FedEnt run records per-client eta"
    for cid, eta in last_eta.items():
        assert rows[cid]["eta"] == pytest.approx(eta)
    assert all(c["health"] == "finished" for c in rows.values())  # the run is done: nobody is "ok" (connected)


def test_estimator_trajectory_matches_the_rounds(api: str, real_run: Path) -> None:
    recs = metrics_of(real_run)
    est = get(api + "/api/estimator").json()
    assert est["available"]
    assert [p["round"] for p in est["trajectory"]] == list(range(1, ROUNDS + 1))
    for p, r in zip(est["trajectory"], recs, strict=True):
        assert p["phi2_pred"] == r["fedent"]["phi2_pred"] and p["phi2_actual"] == r["fedent"]["phi2_actual"]
        assert p["entropy"] == r["fedent"]["entropy"]


def test_partition_and_config(api: str, real_run: Path) -> None:
    part = json.loads((real_run / "partition.json").read_text())
    p = get(api + "/api/partition").json()
    assert p["available"] and p["label_counts"] == part["label_counts"] and p["num_clients"] == NUM_CLIENTS
    cfg = get(api + "/api/config").json()
    assert cfg["available"] and cfg["config"]["algorithm"]["name"] == "fedent"
    assert cfg["config"]["train"]["rounds"] == ROUNDS


def test_prometheus_metrics(api: str, real_run: Path) -> None:
    r = get(api + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    values = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
              for ln in r.text.splitlines() if ln and not ln.startswith("#")}
    clients = json.loads((real_run / "clients.json").read_text())["clients"]
    assert values["fedent_rounds_completed"] == ROUNDS
    assert values["fedent_round_duration_seconds_count"] == ROUNDS
    assert values["fedent_bytes_total"] == sum(c["bytes"] for c in clients) > 0
    assert values['fedent_phase{phase="done"}'] == 1
    assert values["fedent_errors_total"] == 0
    # the counters agree with each other: the simulator records one total per client, so no sent/received
    # beside it (they used to read 0), and a finished run has nobody connected
    assert "fedent_bytes_sent_total" not in values and "fedent_bytes_received_total" not in values
    assert values["fedent_connected_clients"] == 0 and values["fedent_down_clients"] == 0
    by_health = {k: v for k, v in values.items() if k.startswith("fedent_clients{")}
    assert by_health['fedent_clients{health="finished"}'] == sum(by_health.values()) == NUM_CLIENTS
    participation = sum(v for k, v in values.items() if k.startswith("fedent_client_participation_total{"))
    assert participation == sum(r["num_clients"] for r in metrics_of(real_run))
    api_clients = get(api + "/api/clients").json()["clients"]
    assert values["fedent_bytes_total"] == sum(c["bytes_total"] for c in api_clients)


def test_openapi_documents_every_route(api: str) -> None:
    paths = get(api + "/openapi.json").json()["paths"]
    for route in ("/api/status", "/api/rounds", "/api/clients", "/api/estimator", "/api/config", "/api/partition",
                  "/api/events", "/healthz", "/metrics"):
        assert route in paths, route


def test_page_and_assets_are_served(api: str) -> None:
    page = get(api + "/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert 'id="chart-accuracy"' in page.text and "http" not in page.text.replace("http-equiv", "")  # no CDN
    assert get(f"{api}/static/style.css").status_code == 200
    # one classic-free entry point: the page's JavaScript is ES modules, loaded from main.js
    assert re.findall(r"<script[^>]*\bsrc=[^>]*>", page.text) == ['<script type="module" src="static/main.js">']
    served = _served_modules(api)
    assert served == _static_modules()  # every module is reached from main.js, none is left over
    # the φ2 chart's style, as served in the page, is the core's style file (the one fedent plot draws with)
    style = re.search(r'<script type="application/json" id="phi2-style">(.*?)</script>', page.text, re.S)
    assert style and json.loads(style.group(1)) == {"series": _phi2_style_file()["series"]}


def _phi2_style_file() -> dict[str, Any]:
    return json.loads((ROOT / "fedent" / "phi2_style.json").read_text(encoding="utf-8"))


def _static_modules() -> set[str]:
    from server.dashboard.app import STATIC_DIR

    return {p.name for p in STATIC_DIR.glob("*.js")}


def _served_modules(api: str) -> set[str]:
    """The modules main.js imports, transitively, each fetched as the browser would: a module runs only when it
    is served with a JavaScript MIME type, and only its relative imports of this directory are allowed."""
    seen: set[str] = set()
    todo = ["main.js"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        r = get(f"{api}/static/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"].split(";")[0] in ("text/javascript", "application/javascript"), name
        assert r.text.startswith("/* "), f"{name}: no header comment saying what the module is for"
        for spec in re.findall(r'^\s*import\b[^;]*?from\s+"([^"]+)"', r.text, re.MULTILINE | re.DOTALL):
            assert re.fullmatch(r"\./[a-z0-9_]+\.js", spec), f"{name} imports {spec}: only ./<module>.js"
            todo.append(spec[2:])
    return seen


def test_page_arrives_with_the_run_in_it(api: str, serve: Any, real_run: Path) -> None:
    """The first paint needs no fetch: the header numbers are in the HTML and the API's JSON is embedded."""
    body = get(api + "/").text
    assert re.search(r'<span id="round">3</span> / <span id="rounds">3</span>', body)
    assert re.search(r'id="phase"[^>]*data-phase="done">done<', body) and re.search(r'id="eta">done<', body)
    last_acc = [r["test_acc"] for r in metrics_of(real_run) if r["test_acc"] is not None][-1]
    assert re.search(r'id="last-acc">' + re.escape(f"{100 * last_acc:.1f}%") + "<", body)
    data = json.loads(re.search(r'id="initial-data">(.*?)</script>', body, re.S).group(1))  # type: ignore[union-attr]
    assert data["status"] == get(api + "/api/status").json() | {"elapsed_s": data["status"]["elapsed_s"]}
    assert data["rounds"] == get(api + "/api/rounds", params={"limit": 1000}).json()
    ages = ("heartbeat_age_s",)  # measured at each request
    assert [{k: v for k, v in c.items() if k not in ages} for c in data["clients"]["clients"]] == [
        {k: v for k, v in c.items() if k not in ages} for c in get(api + "/api/clients").json()["clients"]]
    assert {c["health"] for c in data["clients"]["clients"]} == {"finished"}
    assert data["partition"] == get(api + "/api/partition").json()
    # with a token the page is open to anyone, so it must not carry the run: a shell that fetches with the token
    guarded = get(serve(real_run, token=TOKEN) + "/").text
    assert re.search(r'id="initial-data"></script>', guarded) and re.search(r'<span id="round">–</span>', guarded)


def test_charts_have_axis_titles_and_the_page_explains_eta(api: str) -> None:
    html = get(api + "/").text
    found = re.findall(r'id="(chart-[a-z0-9]+|heatmap)".*?class="ytitle">(.*?)</span>.*?class="xtitle">(.*?)</span>',
                       html, re.S)
    titles = {cid: (y, x) for cid, y, x in found}
    assert titles == {
        "chart-accuracy": ("test accuracy", "round"), "chart-loss": ("loss", "round"), "chart-bytes": ("MB", "round"),
        "chart-phi2": ("φ<sub>2</sub>", "round"), "chart-eta": ("η (learning rate)", "round"),
        "chart-entropy": ("entropy", "round"), "heatmap": ("class", "client"),
    }
    note = re.search(r'id="eta-note">(.*?)</p>', html, re.S)
    assert note and "trained with" in note.group(1) and "Proposition 1" in note.group(1)
    assert "before this decay" in note.group(1)
    for th in ("η", "η*"):  # the table's columns say what they are on hover too
        assert re.search(r'<th class="num" title="[^"]+">' + re.escape(th) + "</th>", html), th


def _local_refs(html: str) -> list[str]:
    """Every src/href of a page, and the schema URL Swagger UI is told to load."""
    return re.findall(r'(?:src|href)="([^"]*)"', html) + re.findall(r"url: '([^']*)'", html)


def test_docs_are_served_from_the_package_not_a_cdn(api: str) -> None:
    r = get(api + "/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "://" not in r.text and "cdn" not in r.text.lower()  # FastAPI's default loads jsDelivr
    assert "default-src 'self'" in r.headers["content-security-policy"]  # the browser may fetch nothing else
    refs = _local_refs(r.text)
    kinds = {
        "/static/swagger/swagger-ui-bundle.js": "javascript", "/static/swagger/swagger-ui.css": "text/css",
        "/static/swagger/favicon-32x32.png": "image/png", "/openapi.json": "application/json",
    }
    assert sorted(refs) == sorted(kinds)
    for ref, kind in kinds.items():
        asset = get(api + ref)
        assert asset.status_code == 200 and kind in asset.headers["content-type"], ref
    assert b"SwaggerUIBundle" in get(api + "/static/swagger/swagger-ui-bundle.js").content
    assert get(api + "/redoc").status_code == 404  # ReDoc would need a CDN too: off


def test_vendored_swagger_ui_is_package_data() -> None:
    """pyproject's package-data globs cover every vendored file, so a wheel serves /docs as the checkout does."""
    import ast
    import fnmatch

    from server.dashboard.app import SWAGGER_DIR

    line = re.search(r'^"server\.dashboard" = (\[.*\])$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert line, "pyproject.toml lists no package-data for server.dashboard"
    globs = [g.split("/") for g in ast.literal_eval(line.group(1))]
    pkg = SWAGGER_DIR.parents[1]
    files = [f.relative_to(pkg).as_posix() for f in SWAGGER_DIR.iterdir() if f.is_file()]
    required = {"static/swagger/swagger-ui-bundle.js", "static/swagger/swagger-ui.css", "static/swagger/LICENSE"}
    assert required <= set(files)
    for f in files:  # setuptools globs: "*" stays within one path segment
        parts = f.split("/")
        assert any(len(g) == len(parts) and all(map(fnmatch.fnmatchcase, parts, g)) for g in globs), f


# ---- damaged, missing and live run directories ------------------------------------------------------------------

def test_empty_and_missing_run_dirs_give_empty_200s(serve: Any, tmp_path: Path) -> None:
    for run_dir in (tmp_path / "empty", tmp_path / "not-created-yet"):
        if run_dir.name == "empty":
            run_dir.mkdir()
        url = serve(run_dir)
        for route in ("/api/status", "/api/rounds", "/api/clients", "/api/estimator", "/api/config",
                      "/api/partition", "/metrics", "/healthz"):
            assert get(url + route).status_code == 200, route
        assert get(url + "/api/status").json()["phase"] == "unknown"
        assert get(url + "/api/rounds").json()["total"] == 0
        assert get(url + "/api/clients").json()["clients"] == []
        assert get(url + "/api/estimator").json()["available"] is False
        assert get(url + "/api/partition").json()["available"] is False
        assert get(url + "/api/config").json() == {"available": False, "config": {}, "redacted": []}


def test_torn_and_garbage_files_do_not_break_the_api(serve: Any, real_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"round": 3, "test_acc": 0.')  # a writer caught mid-line
    (run / "status.json").write_text('{"phase": "train')
    (run / "clients.json").write_text("[1, 2, null]")
    (run / "estimator.json").write_text('{"trajectory": "nope", "report": [1, NaN]}')
    (run / "partition.json").write_text('{"label_counts": [[1, 2], "x"]}')
    url = serve(run)
    assert get(url + "/api/rounds").json()["total"] == ROUNDS
    st = get(url + "/api/status").json()
    assert st["phase"] == "done" and st["rounds"] == ROUNDS  # falls back to config.yaml + metrics
    assert get(url + "/api/partition").json()["label_counts"] == []
    assert get(url + "/api/estimator").json()["trajectory"][0]["round"] == 1  # from metrics.jsonl
    assert get(url + "/api/clients").json()["source"] == "metrics.jsonl"
    assert get(url + "/metrics").status_code == 200


def test_config_secrets_are_redacted(serve: Any, real_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["cluster"] = {"auth_token": "very-secret-1", "tls": {"private_key": "-----BEGIN KEY-----abc"}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    body = get(serve(run) + "/api/config").text
    assert "very-secret-1" not in body and "BEGIN KEY" not in body
    assert json.loads(body)["config"]["cluster"]["auth_token"] == "***"


def test_token_guards_data_routes_but_not_healthz(serve: Any, real_run: Path) -> None:
    url = serve(real_run, token=TOKEN)
    good = {"Authorization": f"Bearer {TOKEN}"}
    for route in ("/api/status", "/api/rounds", "/api/clients", "/api/estimator", "/api/config", "/api/partition",
                  "/metrics"):
        assert get(url + route).status_code == 401, route
        assert get(url + route, headers={"Authorization": "Bearer wrong"}).status_code == 401, route
        assert get(url + route, params={"token": TOKEN}).status_code == 401, route  # query only for SSE
        ok = get(url + route, headers=good)
        assert ok.status_code == 200, route
        assert TOKEN not in ok.text
    unauth = get(url + "/api/status")
    assert unauth.headers["www-authenticate"] == "Bearer" and TOKEN not in unauth.text
    assert get(url + "/healthz").status_code == 200
    assert TOKEN not in get(url + "/").text
    assert get(url + "/api/events").status_code == 401
    with httpx.stream("GET", url + "/api/events", params={"token": TOKEN}, timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")


def test_event_stream_reports_run_dir_changes(serve: Any, real_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    url = serve(run, poll_interval_s=0.05)
    with httpx.stream("GET", url + "/api/events", timeout=10) as r:
        lines = r.iter_lines()
        events: list[tuple[str, dict[str, Any]]] = []

        def next_event() -> tuple[str, dict[str, Any]]:
            name = None
            for line in lines:
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: ") and name is not None:
                    events.append((name, json.loads(line[6:])))
                    return events[-1]
            raise AssertionError("stream ended")

        name, hello = next_event()
        assert name == "hello" and hello["phase"] == "done"
        runlog.atomic_write_json(run / "status.json", {**json.loads((run / "status.json").read_text()),
                                                       "phase": "training", "round": 3})
        name, change = next_event()
        assert name == "change" and change["files"] == ["status.json"] and change["phase"] == "training"
        runlog.MetricsLog(run / "metrics.jsonl").append(dict(metrics_of(run)[-1], round=3))
        name, change = next_event()
        assert name == "change" and "metrics.jsonl" in change["files"]


# ---- CLI --------------------------------------------------------------------------------------------------------

def test_cli_rejects_bad_input_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fedent_main(["dashboard", str(tmp_path / "nope")]) == 2
    assert fedent_main(["dashboard", str(tmp_path), "--port", "70000"]) == 2
    assert fedent_main(["dashboard", str(tmp_path), "--token", " "]) == 2
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert fedent_main(["dashboard", str(tmp_path), "--port", str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("fedent dashboard: ") for line in err)
    assert "Traceback" not in "".join(err)


def test_cli_serves_until_terminated(real_run: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen(
        # the light entry point (no torch import) of the same command that `fedent dashboard` dispatches to
        [sys.executable, "-m", "server.dashboard_cli", str(real_run), "--port", "0", "--token-file", str(token_file)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert TOKEN not in line
        url = line.split(" at ", 1)[1].split()[0].rstrip("/")
        deadline = time.monotonic() + 15
        while True:
            try:
                r = get(url + "/api/status", headers={"Authorization": f"Bearer {TOKEN}"})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "CLI server never answered"
                time.sleep(0.1)
        assert r.status_code == 200 and r.json()["rounds_completed"] == ROUNDS
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=15)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the process reports how it ended
    assert proc.returncode in (0, -15), err
    assert "Traceback" not in err and TOKEN not in out + err


# ---- the live page in headless Chromium ----------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs /usr/bin/chromium")


def recording_chromium(**kw: Any) -> Any:
    """A ``Chromium`` that also records every URL the page requests and the browser's own error log
    (CSP violations and failed loads land there, not in the console)."""
    from browser import Chromium

    class Recording(Chromium):
        def start(self) -> None:
            self.requests: list[str] = []
            self.log_errors: list[str] = []
            super().start()
            self.call("Network.enable")
            self.call("Log.enable")

        def _event(self, msg: dict[str, Any]) -> None:
            super()._event(msg)
            params = msg.get("params", {})
            if msg.get("method") == "Network.requestWillBeSent":
                self.requests.append(params["request"]["url"])
            elif msg.get("method") == "Log.entryAdded" and params["entry"].get("level") == "error":
                self.log_errors.append(params["entry"].get("text", ""))

    return Recording(**kw)


@pytest.mark.browser
@needs_chromium
def test_first_paint_shows_the_run_in_a_plain_dump_dom(api: str, tmp_path: Path) -> None:
    """``chromium --dump-dom`` shows the run's numbers, not dashes. With JavaScript on, the fetches may also have
    landed by the time of the dump; with it off, only the server's rendering can have put them there."""
    from browser import CHROMIUM, FLAGS

    def dump(*extra: str) -> str:
        profile = tmp_path / f"profile{len(extra)}"
        out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, "--dump-dom", api + "/"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-400:]
        return out.stdout

    dom = dump()
    assert re.search(r'<span id="round">3</span> / <span id="rounds">3</span>', dom)
    assert 'data-rows="4"' in dom and "finished" in dom
    assert re.search(r'id="chart-accuracy"[^>]*data-points="3"', dom)
    # even without JavaScript the header is the run's, rendered by the server
    bare = dump("--blink-settings=javascriptEnabled=false")
    assert re.search(r'<span id="round">3</span>', bare) and re.search(r'id="eta">done<', bare)


@pytest.mark.browser
@needs_chromium
def test_first_paint_draws_everything_before_any_fetch(api: str) -> None:
    """With every /api/ request blocked, the page still draws its charts, table and header from the embedded state."""
    with recording_chromium() as page:
        page.call("Network.setBlockedURLs", urls=["*/api/*"])
        page.navigate(api + "/")
        state = page.evaluate("({initial: fedentDashboard.initial, refreshes: fedentDashboard.refreshes, "
                              "round: document.querySelector('#round').textContent, "
                              "acc: document.querySelector('#chart-accuracy').dataset.points, "
                              "heat: document.querySelector('#heatmap').dataset.points, "
                              "rows: document.querySelector('#clients').dataset.rows, "
                              "width: document.querySelector('#progress-fill').style.width})")
        assert state == {"initial": True, "refreshes": 0, "round": str(ROUNDS), "acc": str(ROUNDS),
                         "heat": state["heat"], "rows": str(NUM_CLIENTS), "width": "100%"}
        assert int(state["heat"]) > 0
        page.screenshot(ARTIFACTS / "dashboard-first-paint.png")
        assert page.exceptions == []


@pytest.mark.browser
@needs_chromium
def test_phi2_chart_draws_the_style_of_fedent_plot(api: str) -> None:
    """The page's φ2 series: the labels, colours, dashes and markers of fedent/phi2_style.json (which
    tests/fedent/test_plots.py holds `fedent plot` to), in its legend, its series and its pixels."""
    series = _phi2_style_file()["series"]
    with recording_chromium() as page:
        page.navigate(api + "/")
        page.wait_for("document.querySelector('#chart-phi2').dataset.series === '2'", 10)
        drawn = page.evaluate("document.querySelector('#chart-phi2')._chart.series.map(s => "
                              "({label: s.name, color: s.color, dash: s.dash, marker: s.marker}))")
        assert drawn == [{k: s[k] for k in ("label", "color", "dash", "marker")} for s in series]
        legend = page.evaluate("[...document.querySelectorAll('#chart-phi2 .legend span')].map(e => "
                               "[e.textContent, e.querySelector('i').className])")
        assert legend == [[s["label"], "sw" + ("" if s["dash"] == "solid" else " " + s["dash"])] for s in series]
        # each colour is on the canvas (the markers' insides are drawn in exactly that colour)
        found = page.evaluate("""(() => {
            const c = document.querySelector('#chart-phi2 canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            const seen = new Set();
            for (let i = 0; i < d.length; i += 4) if (d[i + 3] === 255) {
                seen.add('#' + [d[i], d[i + 1], d[i + 2]].map(v => v.toString(16).padStart(2, '0')).join(''));
            }
            return [...seen];
        })()""")
        assert {s["color"].lower() for s in series} <= set(found)
        assert page.exceptions == [] and page.console_errors == []


@pytest.mark.browser
@needs_chromium
def test_docs_render_offline_in_headless_chromium(api: str) -> None:
    with recording_chromium() as page:
        page.navigate(api + "/docs")
        page.wait_for("document.querySelectorAll('.opblock').length >= 9", 20)
        paths = page.evaluate("[...document.querySelectorAll('.opblock-summary-path')].map(e => e.textContent)")
        for route in ("/api/status", "/api/rounds", "/api/clients", "/api/events", "/metrics", "/healthz"):
            assert route in paths, route
        page.screenshot(ARTIFACTS / "dashboard-docs.png")
        assert page.requests and all(u.startswith(api + "/") or u.startswith("data:") for u in page.requests), \
            page.requests
        assert page.exceptions == [] and page.console_errors == [] and page.log_errors == []

def _truncate_to(run: Path, full: list[dict[str, Any]], n: int, phase: str) -> None:
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full[:n]))
    est = json.loads((run / "estimator.json").read_text())
    est["trajectory"] = est["trajectory"][:n]
    runlog.atomic_write_json(run / "estimator.json", est)
    status = json.loads((run / "status.json").read_text())
    runlog.atomic_write_json(run / "status.json", {**status, "phase": phase, "round": n, "updated_at": time.time()})


@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs /usr/bin/chromium")
def test_live_page_in_headless_chromium(serve: Any, real_run: Path, tmp_path: Path) -> None:
    from browser import Chromium

    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    full = metrics_of(real_run)
    full_est = json.loads((real_run / "estimator.json").read_text())
    part = json.loads((real_run / "partition.json").read_text())
    _truncate_to(run, full, 1, "training")
    url = serve(run, token=TOKEN, poll_interval_s=0.1)

    def chart(cid: str, attr: str = "points") -> str:
        return f"document.querySelector('#{cid}').dataset.{attr}"

    with Chromium(width=1366, height=768) as page:
        page.navigate(f"{url}/?token={TOKEN}")
        page.wait_for(f"{chart('chart-accuracy')} === '1' && document.querySelector('#live').dataset.state === 'live'",
                      20)
        assert page.evaluate("document.querySelector('#round').textContent") == "1"
        assert page.evaluate("document.querySelector('#phase').textContent") == "training"
        assert TOKEN not in page.evaluate("location.href")  # dropped from the address bar
        assert page.evaluate(chart("heatmap")) == str(len(part["label_counts"]) * len(part["label_counts"][0]))
        assert page.evaluate("document.querySelector('#clients').dataset.rows") == str(NUM_CLIENTS)
        assert page.evaluate(chart("chart-eta")) == str(len(full[0]["fedent"]["clients"]))
        assert page.evaluate(chart("chart-phi2")) == "2"  # predicted and actual for round 0
        assert float(page.evaluate(chart("chart-accuracy", "last"))) == pytest.approx(full[0]["test_acc"])

        # the run moves on: rounds appear in the DOM without a reload
        marker = page.evaluate("window.__marker = 42")
        log = runlog.MetricsLog(run / "metrics.jsonl")
        log.append(full[1])
        page.wait_for(f"{chart('chart-accuracy')} === '2' && document.querySelector('#round').textContent === '2'", 15)
        log.append(full[2])
        runlog.atomic_write_json(run / "estimator.json", full_est)
        runlog.atomic_write_json(run / "status.json", json.loads((real_run / "status.json").read_text()))
        page.wait_for(f"{chart('chart-accuracy')} === '{ROUNDS}' && "
                      "document.querySelector('#phase').textContent === 'done'", 15)
        assert page.evaluate("window.__marker") == marker == 42  # same document: live, not reloaded
        assert page.evaluate(chart("chart-phi2")) == str(2 * ROUNDS)
        assert page.evaluate(chart("chart-loss")) == str(2 * ROUNDS)  # test and train loss
        assert page.evaluate("document.querySelector('#progress-fill').style.width") == "100%"
        assert page.evaluate("document.querySelector('#error').hidden") is True
        page.wait_for("[...document.querySelectorAll('#clients .health')].every(e => e.dataset.health === 'finished')",
                      5)  # the run is done: its clients are finished, not "ok"
        assert f"{NUM_CLIENTS} finished" in page.evaluate("document.querySelector('#clients-summary').textContent")
        for fig in ("chart-accuracy", "chart-eta", "heatmap"):  # axis titles are laid out, not just present
            assert page.evaluate(f"document.querySelector('#{fig} .ytitle').getBoundingClientRect().height > 20 && "
                                 f"document.querySelector('#{fig} .xtitle').getBoundingClientRect().width > 20"), fig
        assert page.evaluate("document.querySelector('#eta-note').getBoundingClientRect().height > 0")
        page.wait_for("document.querySelector('#progress-fill').getBoundingClientRect().width >= "
                      "document.querySelector('#progress').getBoundingClientRect().width - 1", 5)  # CSS transition
        shot = page.screenshot(ARTIFACTS / "dashboard.png")
        page.screenshot(ARTIFACTS / "dashboard-full.png", full_page=True)
        assert shot.stat().st_size > 10_000
        assert page.exceptions == [] and page.console_errors == []

        # without the token (fresh tab storage, no ?token=) the page says so instead of showing data
        page.evaluate("sessionStorage.clear()")
        page.navigate(url + "/")
        text = page.wait_for("!document.querySelector('#error').hidden && document.querySelector('#error').textContent")
        assert "Unauthorized" in text
        assert page.evaluate(chart("chart-accuracy")) == "0"


@pytest.mark.browser
@needs_chromium
def test_a_rejected_upload_shows_in_the_clients_table(real_run: Path, tmp_path: Path, serve: Any) -> None:
    """The engine's rejection (clients.json: state rejected, last_failure) reaches the page: the row's last
    failure cell and the summary's rejected count."""
    import shutil

    from fedent import runlog

    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    rows = runlog.read_clients(run / "clients.json")
    why = "round 2: rejected: update of client 1 is not finite (NaN/inf)"
    rows[1].update(state="rejected", last_failure=why)
    runlog.write_clients(run / "clients.json", rows)
    assert get(serve(run) + "/api/clients").json()["clients"][1]["last_failure"] == why
    with recording_chromium() as page:
        page.navigate(serve(run) + "/")
        cell = page.wait_for("document.querySelector('#clients tr[data-cid=\"1\"] td.failure')?.textContent", 15)
        assert cell == why
        assert page.evaluate("document.querySelector('#clients tr[data-cid=\"0\"] td.failure').textContent") == "–"
        assert "1 rejected" in page.evaluate("document.querySelector('#clients-summary').textContent")
        assert page.exceptions == []
