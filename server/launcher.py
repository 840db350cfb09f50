"""``fedent cluster up``: the whole cluster as local processes, without Docker.

The aggregator (and the dashboard, served by uvicorn in the same process) runs here; the estimator
service and N workers are child processes. Every service binds port 0 and reports the port it got, which
is passed on to the processes that dial it, so nothing collides with a fixed port. SIGINT/SIGTERM
terminate the children (then kill them after a grace period). When the launcher dies without stopping
them (SIGKILL, a crash), each child sees its lifeline pipe close and stops itself (fedentrpc.lifeline).
The children's output comes through a pipe, a whole line at a time with the child's name in front
(``[worker-0] ...``), on this process's stderr: it no longer splits or interleaves with ``fedent cluster``'s
own lines on stdout.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedent import runlog
from fedent.config import ExperimentConfig
from fedent.rounds.rundir import CLUSTER, RunDirLock, RunFinished, lock_run_dir, plan_run_dir
from fedentrpc import lifeline
from fedentrpc.security.flags import ClientSecurity, ServerSecurity
from fedentrpc.security.tokens import read_worker_token
from server.app import AggregatorHandle, start_aggregator, uses_fedent_estimator
from server.certs import CertBundle, add_dev_workers, make_dev_pki
from server.settings import AggregatorSettings

REPO_ROOT = Path(__file__).resolve().parent.parent


class LaunchError(RuntimeError):
    """The cluster could not start or a required process died; the message is one line."""


@dataclass(frozen=True)
class LaunchSettings:
    workers: int = 2
    device: str | None = None  # passed to the workers (and the aggregator's evaluation)
    dashboard: bool = True
    use_estimator_service: bool = True  # FedEnt: start `python -m estimator` (fallback: in-process)
    start_timeout_s: float = 60.0
    grace_s: float = 5.0
    quiet_children: bool = False
    secure: bool = True  # TLS + mutual TLS + per-worker tokens on every link (PKI under <run dir>/pki)
    dashboard_host: str = "127.0.0.1"
    dashboard_token: str | None = field(default=None, repr=False)  # bearer token for the dashboard's data routes
    fresh: bool = False  # move a run already in the run directory aside and start over (rounds.rundir)
    worker_data: str | None = None  # --data SPEC for every worker (data.placement: workers)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")


def split_clients(num_clients: int, workers: int) -> list[tuple[int, ...]]:
    """Contiguous, near-equal blocks of client ids, one per worker (never an empty block)."""
    n = min(workers, num_clients)
    base, extra = divmod(num_clients, n)
    out, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append(tuple(range(start, start + size)))
        start += size
    return out


def _span(ids: tuple[int, ...]) -> str:
    return f"{ids[0]}-{ids[-1]}"


def _existing_pki(out: Path, identities: list[str]) -> CertBundle | None:
    """A PKI that ``make_dev_pki`` wrote earlier in ``out`` and that covers ``identities``, else None."""
    clients = {w: (out / "clients" / f"{w}.crt", out / "clients" / f"{w}.key") for w in identities}
    tokens = {w: out / "tokens" / f"{w}.token" for w in identities}
    needed = [out / n for n in ("ca.crt", "ca.key", "server.crt", "server.key", "tokens.json")]
    needed += [p for pair in clients.values() for p in pair] + list(tokens.values())
    if not all(p.is_file() for p in needed):
        return None
    return CertBundle(out, out / "ca.crt", out / "ca.key", out / "server.crt", out / "server.key", clients,
                      out / "tokens.json", tokens)


def _child_env(threads: int | None = None) -> dict[str, str]:
    """The children's environment: the repo importable, unbuffered output, and, for CPU workers, an even
    share of the cores (N processes each spinning up all cores' worth of OpenMP threads oversubscribe)."""
    env = dict(os.environ)
    if threads is not None and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


_OUTPUT_LOCK = threading.Lock()  # one line at a time on stderr, whichever child it came from


def prefix_lines(stream: Any, name: str, out: Any = None) -> None:
    """Copy a child's output (a binary pipe) to ``out`` (default: this process's stderr) a whole line at a time,
    each as ``[name] line``; a last line without a newline is finished. Returns at end of stream."""
    for raw in iter(stream.readline, b""):
        text = raw.decode("utf-8", errors="replace").rstrip("\n")
        with _OUTPUT_LOCK:
            dest = out if out is not None else sys.stderr
            dest.write(f"[{name}] {text}\n")
            dest.flush()
    stream.close()


def wait_port_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> int:
    """Block until ``proc`` writes its bound port to ``path`` (the child binds port 0 itself)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text().strip()
            if text.isdigit():
                return int(text)
        if proc.poll() is not None:
            raise LaunchError(f"{what} exited with code {proc.returncode} before it was listening")
        time.sleep(0.05)
    raise LaunchError(f"{what} did not report a port within {timeout_s:.0f}s")


@dataclass
class Cluster:
    cfg: ExperimentConfig
    run_dir: Path
    settings: LaunchSettings
    aggregator: AggregatorHandle | None = None
    estimator: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    estimator_address: str = ""
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    pki: CertBundle | None = None
    _lifeline: tuple[int, int] | None = None  # (read end passed to every child, write end held until stop)
    _lock: RunDirLock | None = None  # this launcher owns the run directory (rounds.rundir) until stop
    moved_to: Path | None = None  # where --fresh moved the previous run

    def __post_init__(self) -> None:
        # the children start in the package's directory (REPO_ROOT), not the caller's: every path they are
        # given (run dir, PKI, state dirs, data root) must be absolute, resolved here against the caller's
        self.run_dir = Path(self.run_dir).absolute()

    # ---- security ----------------------------------------------------------------------------
    def ensure_pki(self, identities: list[str]) -> CertBundle:
        """The run's development CA, certificates and tokens under <run dir>/pki (reused when resuming)."""
        out = self.run_dir / "pki"
        bundle = _existing_pki(out, identities)
        if bundle is None and (out / "ca.key").is_file():  # more --workers than before: same CA, new identities
            add_dev_workers(out, identities)
            bundle = _existing_pki(out, identities)
        if bundle is None:
            bundle = make_dev_pki(out, hosts=["localhost", "127.0.0.1"], workers=identities, force=True)
        return bundle

    def server_security(self) -> ServerSecurity:
        """TLS + mutual TLS + tokens with the run's PKI; plaintext when the launch is --insecure."""
        if self.pki is None:
            return ServerSecurity(insecure=True)
        return ServerSecurity(cert=self.pki.server_cert, key=self.pki.server_key, ca=self.pki.ca_cert,
                              require_client_auth=True, token_file=self.pki.tokens_file).validate()

    def server_security_args(self) -> list[str]:
        sec = self.server_security()
        if sec.insecure:
            return ["--insecure"]
        return ["--tls-cert", str(sec.cert), "--tls-key", str(sec.key), "--tls-ca", str(sec.ca),
                "--require-client-auth", "--token-file", str(sec.token_file)]

    def client_security(self, identity: str) -> ClientSecurity:
        if self.pki is None:
            return ClientSecurity(insecure=True)
        crt, key = self.pki.client_certs[identity]
        return ClientSecurity(ca=self.pki.ca_cert, cert=crt, key=key,
                              token=read_worker_token(self.pki.token_files[identity])).validate()

    def client_security_args(self, identity: str) -> list[str]:
        if self.pki is None:
            return ["--insecure"]
        crt, key = self.pki.client_certs[identity]
        return ["--tls-ca", str(self.pki.ca_cert), "--tls-cert", str(crt), "--tls-key", str(key),
                "--token-file", str(self.pki.token_files[identity])]

    # ---- start -------------------------------------------------------------------------------
    def _spawn(self, args: list[str], threads: int | None = None, name: str = "child") -> subprocess.Popen[bytes]:
        """A child with the lifeline's read end: it stops itself once this process is gone (the kernel closes
        the write end however this process dies). os.pipe() descriptors are not inheritable, so no other
        child (nor one of these) holds the write end. Its stdout and stderr are one pipe, copied line by line
        as ``[name] line`` (``prefix_lines``)."""
        out: int = subprocess.DEVNULL if self.settings.quiet_children else subprocess.PIPE
        env = _child_env(threads)
        pass_fds: tuple[int, ...] = ()
        if os.name == "posix":
            if self._lifeline is None:
                self._lifeline = os.pipe()
            env[lifeline.ENV] = str(self._lifeline[0])
            pass_fds = (self._lifeline[0],)
        proc = subprocess.Popen([sys.executable, *args], env=env, cwd=str(REPO_ROOT), stdout=out,
                                stderr=subprocess.STDOUT if out == subprocess.PIPE else out, pass_fds=pass_fds)
        if proc.stdout is not None:
            threading.Thread(target=prefix_lines, args=(proc.stdout, name), daemon=True,
                             name=f"output-{name}").start()
        return proc

    def start_estimator(self) -> str:
        """`python -m estimator` on a free port; '' (in-process fallback) when the service is not installed."""
        if importlib.util.find_spec("estimator.__main__") is None:
            return ""
        assert self._tmp is not None
        port_file = Path(self._tmp.name) / "estimator.port"
        self.estimator = self._spawn(["-m", "estimator", "--host", "127.0.0.1", "--port", "0",
                                      "--port-file", str(port_file), *self.server_security_args()],
                                     name="estimator")
        port = wait_port_file(port_file, self.estimator, self.settings.start_timeout_s, "the estimator service")
        return f"127.0.0.1:{port}"

    def start(self, agg_settings: AggregatorSettings | None = None) -> None:
        """Check the run directory (before the PKI or anything else is written to it), then start every
        process. A finished run raises :class:`RunFinished`; a refused directory ``RunDirError``."""
        self._lock = lock_run_dir(self.run_dir)  # a second launcher or aggregator here is refused in one line
        try:
            plan = plan_run_dir(self.run_dir, self.cfg, CLUSTER, self.settings.fresh)
        except BaseException:
            self._release_lock()
            raise
        if plan.action == "finished":
            self._release_lock()
            raise RunFinished(plan.detail)
        self.moved_to = plan.moved_to
        self._tmp = tempfile.TemporaryDirectory(prefix="fedent-cluster-")
        agg_settings = agg_settings or AggregatorSettings()
        try:
            groups = split_clients(self.cfg.data.num_clients, self.settings.workers)
            if self.settings.secure:
                self.pki = self.ensure_pki(["aggregator", *(f"worker-{i}" for i in range(len(groups)))])
            if uses_fedent_estimator(self.cfg) and self.settings.use_estimator_service and not agg_settings.estimator:
                self.estimator_address = self.start_estimator()
                if self.estimator_address:
                    from dataclasses import replace

                    agg_settings = replace(agg_settings, estimator=self.estimator_address)
            self.aggregator = start_aggregator(self.cfg, agg_settings, self.run_dir, dashboard=self.settings.dashboard,
                                               dashboard_host=self.settings.dashboard_host,
                                               dashboard_token=self.settings.dashboard_token,
                                               security=self.server_security(),
                                               estimator_security=self.client_security("aggregator"))
            address = f"127.0.0.1:{self.aggregator.port}"
            for i, ids in enumerate(groups):
                args = ["-m", "client", "--aggregator", address, "--clients", _span(ids),
                        "--name", f"worker-{_span(ids)}"]
                if self.settings.device:
                    args += ["--device", self.settings.device]
                args += ["--executor", self.cfg.train.executor]  # the local cluster trains as the simulator would
                if self.cfg.train.max_parallel_clients is not None:
                    args += ["--max-parallel-clients", str(self.cfg.train.max_parallel_clients)]
                if self.cfg.data.root:
                    args += ["--data-root", str(Path(self.cfg.data.root).absolute())]
                if self.settings.worker_data:
                    args += ["--data", self.settings.worker_data]
                if self.estimator_address:
                    args += ["--estimator", self.estimator_address]
                if agg_settings.token:
                    args += ["--token", agg_settings.token]
                args += self.client_security_args(f"worker-{i}")
                args += ["--state-dir", str(self.run_dir / "worker-state" / f"worker-{i}")]  # resume
                self.workers.append(self._spawn(args, threads=max(1, (os.cpu_count() or 1) // len(groups)),
                                                name=f"worker-{i}"))
        except BaseException:
            self.stop()
            raise

    # ---- run ---------------------------------------------------------------------------------
    def wait(self, poll_s: float = 0.5, on_round: Callable[[dict[str, Any]], None] | None = None) -> bool:
        """Until the run finishes; fails fast when every worker (or the estimator) died first.

        ``on_round`` is called once per completed round with its metrics.jsonl record (progress output).
        """
        agg = self.aggregator
        assert agg is not None
        seen = 0

        def report() -> None:
            # the engine's own records (in this process), not metrics.jsonl's lines: a resume cuts the file
            # back and logs the cut rounds again, and counting lines skipped their new results
            nonlocal seen
            if on_round is None:
                return
            records = list(agg.run.engine.records)
            for rec in records[seen:]:
                on_round(rec)
            seen = len(records)

        while not agg.wait(poll_s):
            report()
            if self.workers and all(p.poll() is not None for p in self.workers) and not agg.wait(2.0):
                codes = sorted({p.returncode for p in self.workers})
                raise LaunchError(f"all workers exited (codes {codes}) before the run finished")
            if self.estimator is not None and self.estimator.poll() is not None:
                raise LaunchError(f"the estimator service exited with code {self.estimator.returncode}")
        report()
        return agg.ok

    def stop(self, signame: str | None = None) -> None:
        """Terminate children, wait up to the grace period, then kill; stop the aggregator and dashboard.
        ``signame``: this process got that signal, so a run still going ends ``stopped`` (not ``failed``)."""
        procs = [*self.workers, *([self.estimator] if self.estimator is not None else [])]
        if self.aggregator is not None and self.aggregator.run.finished.is_set():
            # the run is over and the workers got Shutdown: let them exit by themselves first
            settle = time.monotonic() + min(2.0, self.settings.grace_s)
            for p in self.workers:
                try:
                    p.wait(timeout=max(0.0, settle - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        if self.aggregator is not None:
            self.aggregator.request_stop(signame)  # before its peers go away, so no round waits on a dead service
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + self.settings.grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.aggregator is not None:
            self.aggregator.stop(signame=signame)
            self.aggregator = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if self._lifeline is not None:  # every child has exited or been killed by now
            for fd in self._lifeline:
                os.close(fd)
            self._lifeline = None
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def default_run_dir(cfg: ExperimentConfig, out: str | None) -> Path:
    """The run directory, absolute (relative to the current directory), whatever directory that is."""
    if out:
        return Path(out).absolute()
    return (Path(cfg.out_dir) / runlog.new_run_id(cfg.name, cfg.algorithm.name, cfg.train.seed)).absolute()
