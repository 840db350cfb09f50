"""Assemble a running aggregator: run directory, data, strategy (with its estimator), gRPC server, dashboard.

Used by ``python -m server`` (a standalone aggregator, e.g. in a container) and by the local launcher
(``fedent cluster up``), which hosts the aggregator and the dashboard in its own process.
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fedent import runlog
from fedent.config import ExperimentConfig
from fedent.inputs import RunInputs, load_inputs
from fedent.rounds.rundir import CLUSTER, RunDirLock, RunFinished, lock_run_dir, plan_run_dir
from fedent.strategies.base import Strategy
from fedent.strategies.options import FedEntOptions
from fedent.strategies.registry import build_strategy
from fedent.trainer import resolve_device
from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.flags import ClientSecurity, ServerSecurity
from fedentrpc.security.tls import open_channel
from server.aggregator import create_aggregator_server
from server.engine import ClusterRun
from server.remote import OfflineRunner as _OfflineRunner
from server.settings import AggregatorSettings

log = logging.getLogger("fedent.aggregator")

OfflineRunner = _OfflineRunner  # re-exported: server.offline_runner builds one


def worker_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """What workers receive at registration (RegisterResponse.config): the resolved config, secrets redacted."""
    return dict(runlog.jsonable(runlog.redact(cfg.to_dict())))


def uses_fedent_estimator(cfg: ExperimentConfig) -> str | None:
    """'online' / 'offline' when the strategy takes φ2(t+1) from an estimator (which the service can serve)."""
    return build_strategy(cfg.algorithm).capabilities.phi2_estimator


def build_cluster_strategy(cfg: ExperimentConfig, settings: AggregatorSettings, run_id: str,
                           estimator_security: ClientSecurity | None = None) -> Strategy:
    """The same strategy as the simulator's; FedEnt online gets the estimator service adapter when configured."""
    opts = cfg.algorithm.options_as(FedEntOptions)  # the service's solver takes FedEnt's options
    if uses_fedent_estimator(cfg) == "online" and settings.estimator and opts is not None:
        from server.estimator_adapter import RemotePhi2Estimator

        channel = open_channel(settings.estimator, estimator_security or ClientSecurity(insecure=True))
        return build_strategy(cfg.algorithm, estimator=RemotePhi2Estimator(settings.estimator, opts, run_id,
                                                                           channel=channel))
    return build_strategy(cfg.algorithm)


@dataclass
class AggregatorHandle:
    run: ClusterRun
    server: grpc.Server
    port: int
    thread: threading.Thread
    dashboard: Any = None
    dashboard_url: str | None = None
    lock: RunDirLock | None = None  # this process owns the run directory until stop (rounds.rundir)

    @property
    def run_dir(self) -> Path:
        return self.run.paths.root

    def wait(self, timeout_s: float | None = None) -> bool:
        """True when the run has finished (successfully or not) within the timeout."""
        return self.run.finished.wait(timeout_s)

    @property
    def ok(self) -> bool:
        return self.run.finished.is_set() and self.run.error is None

    def request_stop(self, signame: str | None = None) -> None:
        """Ask the round loop to end now (it wakes from any wait); does not block. ``signame`` (SIGTERM,
        SIGINT): the process was signalled, so the run ends ``stopped`` with that reason, not ``failed``."""
        self.run.stop(signame)

    def stop(self, grace_s: float = 2.0, signame: str | None = None) -> None:
        self.request_stop(signame)
        self.thread.join(grace_s + 5)
        self.server.stop(grace_s).wait(grace_s + 1)
        if self.dashboard is not None:
            self.dashboard.stop()
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def start_dashboard(run_dir: Path, host: str, port: int, token: str | None = None) -> tuple[Any, str | None]:
    """The dashboard app served by uvicorn in this process; (None, None) if the dashboard is not installed.

    With ``token`` its data routes require ``Authorization: Bearer`` (the callers' command lines choose it).
    """
    try:
        from server.dashboard.app import create_app
        from server.dashboard.serve import serve_dashboard
    except ModuleNotFoundError as e:
        log.warning("dashboard unavailable (%s)", e)
        return None, None
    handle, _ = serve_dashboard(create_app(run_dir, token=token), host=host, port=port)
    return handle, handle.url


def check_port_free(host: str, port: int, flag: str) -> None:
    """Raise OSError naming the port and the flag that chose it when something already listens there (gRPC
    itself would say only "[Errno 98]" or a C-core line). Port 0 (any free port) always passes."""
    if port == 0:
        return
    try:
        family, _, _, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {host}:{port} ({flag}): {e.strerror}") from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise OSError(f"port {port} on {host} is in use ({e.strerror}): stop what holds it, or choose another "
                          f"port with {flag}") from None


def start_aggregator(
    cfg: ExperimentConfig,
    settings: AggregatorSettings,
    run_dir: str | Path,
    *,
    inputs: RunInputs | None = None,
    dashboard: bool = False,
    dashboard_host: str = "127.0.0.1",
    dashboard_port: int = 0,
    dashboard_token: str | None = None,
    offline: OfflineRunner | None = None,
    security: ServerSecurity | None = None,
    estimator_security: ClientSecurity | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    fresh: bool = False,
) -> AggregatorHandle:
    """Start serving and run the rounds in a background thread; returns at once with the bound port.

    ``security`` protects the aggregator's port; ``estimator_security`` is how it dials the estimator
    service (both default to plaintext without authentication, for in-process tests). ``on_round`` is
    called with each completed round's metrics.jsonl record (``python -m server`` logs a line per round).
    ``dashboard_token`` guards the dashboard's data routes (None: open, as for a loopback dashboard).

    Before anything is written, ``run_dir`` is checked (``fedent.rounds.rundir``): a finished run raises
    :class:`RunFinished` (report it, exit 0), another kind of run, another config or checkpoints none of
    which is intact raise ``RunDirError``; ``fresh`` moves an existing run aside first.
    """
    if settings.clients_file and not (security is not None and security.authenticates):
        raise SecurityConfigError("--clients-file: binding clients to worker identities needs worker "
                                  "authentication (--token-file or mutual TLS)")
    check_port_free(settings.host, settings.port, "--port")  # before the run directory is made: a used port
    if dashboard:  # leaves nothing behind, and the message names the port and its flag
        check_port_free(dashboard_host, dashboard_port, "--dashboard-port")
    lock = lock_run_dir(run_dir)  # before any decision: a second owner (or --fresh on a live run) is refused
    try:
        plan = plan_run_dir(run_dir, cfg, CLUSTER, fresh)
    except BaseException:
        lock.release()
        raise
    if plan.action == "finished":
        lock.release()
        raise RunFinished(plan.detail)
    if plan.moved_to is not None:
        log.warning("moved the previous run to %s (--fresh)", plan.moved_to)
    created = not Path(run_dir).exists()
    paths = runlog.create_run_dir(run_dir, exist_ok=True)
    started: list[grpc.Server] = []
    try:
        key = runlog.run_key(paths, runlog.run_instance(paths, create=plan.action == "new"))
        device = resolve_device(cfg.train.device)
        inputs = inputs or load_inputs(cfg)
        if inputs.num_clients != cfg.data.num_clients:
            raise ValueError(f"the partition has {inputs.num_clients} clients but data.num_clients is "
                             f"{cfg.data.num_clients}")
        strategy = build_cluster_strategy(cfg, settings, key, estimator_security)
        if uses_fedent_estimator(cfg) == "offline" and offline is None and settings.estimator:
            from server.offline_runner import service_offline_runner

            offline = service_offline_runner(settings.estimator, cfg, key, security=estimator_security)

        def rebuild(estimator: Any) -> Strategy:
            return build_strategy(cfg.algorithm, estimator=estimator)

        run = ClusterRun(cfg, settings, paths, inputs, strategy, device, worker_config(cfg),
                         offline=offline, rebuild_strategy=rebuild, on_round=on_round, run_key=key)
        server, port = create_aggregator_server(settings, run, security)
        started.append(server)
        dash, url = (start_dashboard(paths.root, dashboard_host, dashboard_port, dashboard_token) if dashboard
                     else (None, None))
        thread = threading.Thread(target=run.run, name="rounds", daemon=True)
        thread.start()
        return AggregatorHandle(run, server, port, thread, dash, url, lock)
    except BaseException:
        for s in started:
            s.stop(0)
        if created:  # a run that never started leaves no stub directory
            shutil.rmtree(paths.root, ignore_errors=True)
        lock.release()
        raise


def save_port(path: str | Path, port: int) -> None:
    """Announce the bound port to a parent process (written atomically, so a reader never sees half)."""
    runlog.atomic_write_text(path, f"{port}\n")

