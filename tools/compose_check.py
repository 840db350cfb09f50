#!/usr/bin/env python3
"""``make compose-check``: the docker-compose cluster for real, end to end; exit 1 when any step fails.

0. the real compose reads docker-compose.yml, and with docker-compose.gpu.yml merged over it;
1. the local base image (tools/docker_base.sh) when FEDENT_BASE names the local one and it is missing;
2. the images (``compose build``; the host's package index and CA bundle are passed to the build);
3. ``compose up -d`` under its own project name, on free loopback ports, a fresh run of FEDENT_CHECK_ROUNDS
   (2) rounds; waits for the estimator's and the aggregator's healthchecks;
4. waits for the run to be ``done`` on the published dashboard (/healthz, /api/status with the PKI's
   dashboard token), failing at once when a worker exits non-zero or restarts, or the run fails;
5. checks metrics.jsonl (one record per round) and model_final.pt (a state dict torch loads);
6. restarts the aggregator: it must come back healthy, serve the finished run read-only (status.json
   byte for byte unchanged, /api/status still done) and the workers must have exited 0;
7. always: collects every service's log and ``docker inspect`` into FEDENT_CHECK_OUT, then ``down -v``.

Standard library only (runs with the system python3). Compose v2 (``docker compose``) is used when present,
else v1 (``docker-compose``). Variables: FEDENT_CHECK_ROUNDS, FEDENT_CHECK_TIMEOUT (s for the run, 900),
FEDENT_CHECK_OUT (test-artifacts/compose-check), FEDENT_CHECK_PROJECT (fedentcheck), FEDENT_CHECK_KEEP=1
(leave the cluster up), FEDENT_BASE (fedent-base:bookworm), and any docker-compose.yml variable
(e.g. FEDENT_WORKER1_CLIENTS=10-99 makes a worker that cannot start, and the check fail).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCAL_BASE = "fedent-base:bookworm"
SERVERS = ("estimator", "aggregator")
WORKERS = ("worker-0", "worker-1")


class CheckFailed(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[compose-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def compose_command() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise CheckFailed("neither `docker compose` nor `docker-compose` is installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def host_pip_setting(env_var: str, key: str) -> str:
    """The host's pip setting (environment first, then pip config), '' when unset or unusable in a build."""
    value = os.environ.get(env_var, "")
    if not value:
        try:
            out = subprocess.run([sys.executable, "-m", "pip", "config", "get", key], capture_output=True,
                                 text=True, timeout=60)
            value = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            value = ""
    return value


def build_env() -> dict[str, str]:
    """What the builds take from the host: its index (http(s) only: a file:// index is not in the build
    context), its CA bundle (docker/build/ca.crt) and host networking."""
    env: dict[str, str] = {}
    for var, key in (("FEDENT_PIP_INDEX_URL", "global.index-url"),):
        value = os.environ.get(var) or host_pip_setting("PIP_INDEX_URL", key)
        if value.startswith(("http://", "https://")):
            env[var] = value
    cert = os.environ.get("FEDENT_PIP_CERT") or host_pip_setting("PIP_CERT", "global.cert")
    target = ROOT / "docker" / "build" / "ca.crt"
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, target)
        log(f"build CA bundle: {cert} -> {target.relative_to(ROOT)}")
    env.setdefault("FEDENT_BUILD_NETWORK", os.environ.get("FEDENT_BUILD_NETWORK", "host"))
    return env


class Check:
    def __init__(self) -> None:
        self.compose = compose_command()
        self.project = os.environ.get("FEDENT_CHECK_PROJECT", "fedentcheck")
        self.rounds = int(os.environ.get("FEDENT_CHECK_ROUNDS", "2"))
        self.timeout_s = float(os.environ.get("FEDENT_CHECK_TIMEOUT", "900"))
        self.out = Path(os.environ.get("FEDENT_CHECK_OUT", ROOT / "test-artifacts" / "compose-check"))
        self.run_name = "check"
        self.ports = {"FEDENT_DASHBOARD_PORT": free_port(), "FEDENT_AGGREGATOR_PORT": free_port(),
                      "FEDENT_ESTIMATOR_PORT": free_port()}
        self.env = dict(os.environ)
        self.env.setdefault("FEDENT_BASE", LOCAL_BASE)
        self.env.update({k: str(v) for k, v in self.ports.items()})
        self.env.update({"FEDENT_ROUNDS": str(self.rounds), "FEDENT_RUN": self.run_name, "FEDENT_BIND": "127.0.0.1"})
        self.timings: dict[str, float] = {}
        self.token = ""
        self._ids: dict[str, str] = {}

    # ---- plumbing ----------------------------------------------------------------------------------
    def dc(self, *args: str, check: bool = True, capture: bool = False, timeout: float | None = None
           ) -> subprocess.CompletedProcess[str]:
        cmd = [*self.compose, "-p", self.project, "-f", str(ROOT / "docker-compose.yml"), *args]
        r = subprocess.run(cmd, cwd=ROOT, env=self.env, text=True, timeout=timeout,
                           stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)
        if check and r.returncode != 0:
            detail = f": {(r.stderr or '').strip()[-2000:]}" if capture else ""
            raise CheckFailed(f"`{' '.join(cmd[len(self.compose):])}` exited {r.returncode}{detail}")
        return r

    def step(self, name: str) -> _Step:
        return _Step(self, name)

    def container(self, service: str) -> str:
        """The service's container id (asked once: `compose ps` is slow with v1; a restart keeps the id)."""
        if service not in self._ids:
            cid = self.dc("ps", "-q", service, capture=True).stdout.strip()
            if not cid:
                raise CheckFailed(f"no container for {service}")
            self._ids[service] = cid.splitlines()[0]
        return self._ids[service]

    def inspect(self, service: str) -> dict[str, Any]:
        out = subprocess.run(["docker", "inspect", self.container(service)], capture_output=True, text=True,
                             check=True).stdout
        return dict(json.loads(out)[0])

    def http(self, path: str, token: bool = True) -> tuple[int, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.ports['FEDENT_DASHBOARD_PORT']}{path}")
        if token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                body = resp.read().decode()
                return resp.status, json.loads(body) if body.startswith(("{", "[")) else body
        except urllib.error.HTTPError as e:
            return e.code, None

    def read_file(self, path: str) -> bytes:
        r = subprocess.run(["docker", "exec", self.container("aggregator"), "cat", path], capture_output=True)
        if r.returncode != 0:
            raise CheckFailed(f"cannot read {path} in the aggregator: {r.stderr.decode().strip()}")
        return r.stdout

    # ---- checks --------------------------------------------------------------------------------------
    def workers_ok(self) -> list[str]:
        """Worker states; raises as soon as one exited non-zero or was restarted."""
        states = []
        for w in WORKERS:
            info = self.inspect(w)
            st = info["State"]
            if st.get("Status") in ("exited", "dead") and st.get("ExitCode") != 0 or info.get("RestartCount", 0):
                raise CheckFailed(f"{w} failed: status {st.get('Status')}, exit code {st.get('ExitCode')}, "
                                  f"restarts {info.get('RestartCount', 0)} (see {w}.log)")
            states.append(f"{w}={st.get('Status')}")
        return states

    def wait_healthy(self, services: tuple[str, ...], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            health = {s: self.inspect(s)["State"].get("Health", {}).get("Status") for s in services}
            if all(h == "healthy" for h in health.values()):
                return
            if time.monotonic() > deadline:
                raise CheckFailed(f"not healthy within {timeout_s:.0f}s: {health}")
            time.sleep(2)

    def wait_done(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        last = ""
        while True:
            self.workers_ok()
            code, status = self.http("/api/status")
            if code == 200 and isinstance(status, dict):
                phase = status.get("phase")
                line = f"phase {phase}, round {status.get('round')}/{status.get('rounds')}"
                if line != last:
                    log(line)
                    last = line
                if phase == "done":
                    return status
                if phase == "failed":
                    raise CheckFailed(f"the run failed: {status.get('state')}")
            elif code not in (200, 404, 503):
                raise CheckFailed(f"/api/status answered {code}")
            if time.monotonic() > deadline:
                raise CheckFailed(f"the run was not done within {self.timeout_s:.0f}s ({last or 'no status'})")
            time.sleep(2)

    def check_outputs(self) -> None:
        run = f"/runs/{self.run_name}"
        metrics = [json.loads(x) for x in self.read_file(f"{run}/metrics.jsonl").decode().splitlines() if x.strip()]
        (self.out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
        rounds = [m.get("round") for m in metrics]
        if rounds != list(range(1, self.rounds + 1)):
            raise CheckFailed(f"metrics.jsonl has rounds {rounds}, expected 1..{self.rounds}")
        if metrics[-1].get("test_acc") is None:
            raise CheckFailed("the last round has no test accuracy")
        log(f"metrics.jsonl: {len(metrics)} rounds, final test acc {metrics[-1]['test_acc']:.4f}")
        probe = ("import sys, torch; sd = torch.load(sys.argv[1], map_location='cpu', weights_only=False); "
                 "sd = sd.get('state_dict', sd) if isinstance(sd, dict) else sd; "
                 "n = sum(v.numel() for v in (sd.values() if isinstance(sd, dict) else sd) if hasattr(v, 'numel')); "
                 "assert n > 0, 'no tensors'; print(n)")
        r = subprocess.run(["docker", "exec", self.container("aggregator"), "python", "-c", probe,
                            f"{run}/model_final.pt"], capture_output=True, text=True)
        if r.returncode != 0:
            raise CheckFailed(f"model_final.pt does not load: {r.stderr.strip()[-500:]}")
        log(f"model_final.pt: {r.stdout.strip()} parameters")

    def check_restart(self) -> None:
        before = self.read_file(f"/runs/{self.run_name}/status.json")
        self.dc("restart", "aggregator")
        self.wait_healthy(("aggregator",), 120)
        code, status = self.http("/api/status")
        after = self.read_file(f"/runs/{self.run_name}/status.json")
        if code != 200 or not isinstance(status, dict) or status.get("phase") != "done":
            raise CheckFailed(f"after a restart /api/status answered {code} {status}")
        if before != after:
            raise CheckFailed("a restarted aggregator rewrote the finished run's status.json")
        info = self.inspect("aggregator")
        logs = subprocess.run(["docker", "logs", self.container("aggregator")], capture_output=True, text=True).stdout
        if "serving it read-only" not in logs:
            raise CheckFailed("the restarted aggregator did not say it serves the finished run read-only")
        log(f"restarted aggregator: healthy, read-only, status.json unchanged (restarts {info.get('RestartCount')})")

    def check_workers_exited(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            states = {w: self.inspect(w)["State"] for w in WORKERS}
            if all(s["Status"] == "exited" for s in states.values()):
                codes = {w: s["ExitCode"] for w, s in states.items()}
                if any(codes.values()):
                    raise CheckFailed(f"workers exited with {codes}")
                log(f"workers exited 0: {', '.join(WORKERS)}")
                return
            self.workers_ok()
            if time.monotonic() > deadline:
                raise CheckFailed(f"workers still running 60 s after done: {[s['Status'] for s in states.values()]}")
            time.sleep(2)

    def collect(self) -> None:
        for s in (*SERVERS, *WORKERS):
            try:
                cid = self.container(s)
            except CheckFailed:
                continue
            r = subprocess.run(["docker", "logs", "--timestamps", cid], capture_output=True, text=True)
            (self.out / f"{s}.log").write_text((r.stdout or "") + (r.stderr or ""))
            try:
                (self.out / f"{s}.inspect.json").write_text(json.dumps(self.inspect(s)["State"], indent=1))
            except (subprocess.CalledProcessError, KeyError):
                pass
        log(f"logs in {self.out}")

    # ---- the whole check -----------------------------------------------------------------------------
    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        log(f"compose: {' '.join(self.compose)}; project {self.project}; ports {self.ports}; {self.rounds} rounds")
        t_all = time.monotonic()
        up = False
        try:
            with self.step("config"):  # the real compose reads both files (v1 and v2 differ in what they accept)
                self.dc("config", "-q", capture=True)
                gpu = [*self.compose, "-p", self.project, "-f", str(ROOT / "docker-compose.yml"), "-f",
                       str(ROOT / "docker-compose.gpu.yml"), "config", "-q"]
                r = subprocess.run(gpu, cwd=ROOT, env=self.env, capture_output=True, text=True)
                if r.returncode != 0:
                    raise CheckFailed(f"docker-compose.gpu.yml does not merge: {r.stderr.strip()[-1000:]}")
            with self.step("base image"):
                if self.env["FEDENT_BASE"] == LOCAL_BASE:
                    subprocess.run([str(ROOT / "tools" / "docker_base.sh"), LOCAL_BASE], check=True, env=self.env)
            with self.step("build"):
                self.env.update(build_env())
                self.dc("build")
            for image in (f"{self.env.get('FEDENT_IMAGE', 'fedent')}-cpu", self.env.get("FEDENT_IMAGE", "fedent")):
                ref = f"{image}:{self.env.get('FEDENT_TAG', 'local')}"
                size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", ref], capture_output=True,
                                      text=True).stdout.strip()
                log(f"image {ref}: {int(size or 0) / 1e9:.2f} GB")
            self.dc("down", "-v", "--remove-orphans", check=False, capture=True)
            with self.step("up + healthchecks"):
                up = True
                self.dc("up", "-d")
                self.wait_healthy(SERVERS, 300)
            self.token = self.read_file("/pki/dashboard.token").decode().strip()
            code, body = self.http("/healthz", token=False)
            if code != 200:
                raise CheckFailed(f"/healthz answered {code} {body}")
            code, _ = self.http("/api/status", token=False)
            if code != 401:
                raise CheckFailed(f"/api/status without the dashboard token answered {code}, expected 401")
            log("/healthz 200; /api/status needs the dashboard token (401 without)")
            with self.step(f"{self.rounds} rounds"):
                self.wait_done()
            self.check_outputs()
            with self.step("workers exit"):
                self.check_workers_exited()
            with self.step("aggregator restart"):
                self.check_restart()
        except (CheckFailed, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            log(f"FAILED: {e}")
            return self.finish(up, t_all, ok=False)
        return self.finish(up, t_all, ok=True)

    def finish(self, up: bool, t_all: float, ok: bool) -> int:
        if up:
            self.collect()
            if os.environ.get("FEDENT_CHECK_KEEP") != "1":
                self.dc("down", "-v", "--remove-orphans", check=False, capture=True)
        self.timings["total"] = time.monotonic() - t_all
        (self.out / "timings.json").write_text(json.dumps(self.timings, indent=1))
        log("timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in self.timings.items()))
        log("PASSED" if ok else "FAILED (logs above and in the artifacts folder)")
        return 0 if ok else 1


class _Step:
    def __init__(self, check: Check, name: str) -> None:
        self.check, self.name = check, name

    def __enter__(self) -> None:
        log(f"{self.name} ...")
        self.t0 = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        dt = time.monotonic() - self.t0
        self.check.timings[self.name] = dt
        log(f"{self.name}: {dt:.0f}s{' (failed)' if exc[0] else ''}")


def main() -> int:
    try:
        return Check().run()
    except CheckFailed as e:
        log(f"FAILED: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
