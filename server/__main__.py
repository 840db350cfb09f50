"""``python -m server``: a standalone aggregator (the launcher hosts one in-process instead)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from fedent import runlog
from fedent.config import ConfigError, load_config
from fedent.data import DatasetError
from fedent.rounds.rundir import RunFinished
from fedent.signals import Stopped, stop_reason
from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.flags import (
    ClientSecurity,
    ServerSecurity,
    add_server_security_args,
    server_security_from_args,
)
from fedentrpc.security.redaction import install_log_redaction
from fedentrpc.security.tokens import read_worker_token
from fedentrpc.stream_limit import StreamLimits, add_stream_limit_args
from server.app import save_port, start_aggregator
from server.dashboard_access import (
    DashboardToken,
    add_dashboard_token_args,
    dashboard_lines,
    dashboard_token_from_args,
)
from server.finished import finished_run, serve_finished
from server.settings import AggregatorSettings, SettingsError

log = logging.getLogger("fedent.aggregator")


def add_settings_args(p: argparse.ArgumentParser) -> None:
    """The aggregator's process-edge settings as flags (shared with ``fedent cluster up``)."""
    d = AggregatorSettings()
    p.add_argument("--host", default=d.host, help="interface to bind (0.0.0.0 for workers on other machines)")
    p.add_argument("--round-deadline", type=float, default=d.round_deadline_s, help="seconds per round phase")
    p.add_argument("--quorum", type=float, default=d.quorum, help="fraction of participants needed per round")
    p.add_argument("--register-timeout", type=float, default=d.register_timeout_s,
                   help="seconds to wait for workers to cover every client")
    p.add_argument("--heartbeat", type=float, default=d.heartbeat_s, help="seconds between worker heartbeats")
    p.add_argument("--heartbeat-misses", type=int, default=d.heartbeat_misses,
                   help="a worker silent this many heartbeat periods is dead (0 = never)")
    p.add_argument("--round-retries", type=int, default=d.round_retries,
                   help="a round missing its quorum: -1 skips it, N retries it with fresh clients N times then fails")
    p.add_argument("--wire-dtype", default=d.wire_dtype, choices=["native", "float16", "bfloat16"])
    p.add_argument("--compression", default=d.compression, choices=["none", "zlib"])
    p.add_argument("--download-encoding", default=d.download_encoding, choices=["full", "delta"],
                   help="delta: a worker holding a recent model downloads the new one as an exact, zlib-compressed "
                   "XOR delta from it (whole otherwise)")
    p.add_argument("--delta-history", type=int, default=d.delta_history,
                   help="--download-encoding delta: how many past rounds' models serve as bases")
    p.add_argument("--chunk-bytes", type=int, default=d.chunk_bytes,
                   help="tensor chunk size in bytes (≤ 4 MiB); a cut transfer resumes at a chunk boundary")
    p.add_argument("--token", default="", help="registration token workers must present")
    p.add_argument("--estimator", default="", help="HOST:PORT of the estimator service (FedEnt)")
    p.add_argument("--clients-file", default="", help="client map {worker identity: client ids} (YAML/JSON): only "
                   "the mapped identity may host a client, here and at the estimator (needs --token-file or "
                   "mutual TLS); default: the first identity to register a client hosts it while it is live")
    p.add_argument("--max-streams-per-identity", type=int, default=d.max_streams_per_identity,
                   help="open streaming calls one worker identity may hold; more get RESOURCE_EXHAUSTED; only with "
                   "worker authentication; 0 = no limit")
    add_stream_limit_args(p, d.max_anonymous_streams, d.stream_idle_s, d.open_stream_max_s)


def settings_from_args(args: argparse.Namespace, port: int = 0) -> AggregatorSettings:
    return AggregatorSettings(host=args.host, port=port, token=args.token, round_deadline_s=args.round_deadline,
                              quorum=args.quorum, register_timeout_s=args.register_timeout,
                              wire_dtype=args.wire_dtype, compression=args.compression, chunk_bytes=args.chunk_bytes,
                              download_encoding=args.download_encoding, delta_history=args.delta_history,
                              estimator=args.estimator,
                              heartbeat_s=args.heartbeat, heartbeat_misses=args.heartbeat_misses,
                              round_retries=args.round_retries, clients_file=args.clients_file,
                              max_streams_per_identity=args.max_streams_per_identity,
                              max_anonymous_streams=args.max_anonymous_streams, stream_idle_s=args.stream_idle,
                              open_stream_max_s=args.open_stream_max)


def estimator_client_security(sec: ServerSecurity, token_file: str | None, estimator: str,
                              cert: str | None = None, key: str | None = None) -> ClientSecurity | None:
    """How the aggregator dials the estimator: the same trust anchor (--tls-ca), its 'aggregator' token and,
    for an estimator that requires mutual TLS, the aggregator's client certificate."""
    if sec.insecure or not estimator:
        return ClientSecurity(insecure=True) if estimator else None
    if sec.ca is None:
        raise SecurityConfigError("dialling the estimator over TLS needs --tls-ca (the CA that signed its certificate)")
    token = None
    if token_file:
        token = read_worker_token(token_file, "aggregator")
    elif sec.token_file is not None:
        try:
            token = read_worker_token(sec.token_file, "aggregator")
        except SecurityConfigError:
            token = None  # no 'aggregator' entry: the estimator must then not require tokens
    return ClientSecurity(ca=sec.ca, token=token, cert=Path(cert) if cert else None,
                          key=Path(key) if key else None).validate()


def round_log_line(rec: dict[str, Any], rounds: int) -> str:
    """What the aggregator logs when a round completes (its log is where a batch job's progress shows)."""
    acc, loss, wall = rec.get("test_acc"), rec.get("train_loss"), rec.get("wall_s")
    acc_s = f"{acc:.4f}" if isinstance(acc, (int, float)) else "-"
    loss_s = f"{loss:.4f}" if isinstance(loss, (int, float)) else "-"
    wall_s = f"{wall:.1f}s" if isinstance(wall, (int, float)) else "-"
    rnd = runlog.round_of(rec) if "round" in rec else 0
    return (f"round {rnd}/{rounds} done: test acc {acc_s}, train loss {loss_s}, "
            f"{rec.get('num_clients', '?')} clients, {wall_s}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m server", description="fedent aggregator")
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--port", type=int, default=50051, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", default=None, help="write the bound port here")
    p.add_argument("--out", default=None, help="run directory (default: <out_dir>/<run id>); an unfinished "
                   "run there is resumed from its newest intact checkpoint, a finished one is left as it is")
    p.add_argument("--fresh", action="store_true", help="start over: move a run already in --out to "
                   "<out>.old-<UTC time> first (needed when none of its checkpoints is intact)")
    p.add_argument("--dashboard-port", type=int, default=None, help="serve the dashboard on this port")
    p.add_argument("--device", default=None)
    add_settings_args(p)
    add_dashboard_token_args(p)
    add_server_security_args(p)
    p.add_argument("--estimator-token-file", default=None,
                   help="the aggregator's token for the estimator service (a token file, or tokens.json with an "
                        "'aggregator' entry; default: --token-file's 'aggregator' entry when it has one)")
    p.add_argument("--estimator-tls-cert", default=None, help="client certificate for an mTLS estimator (PEM)")
    p.add_argument("--estimator-tls-key", default=None, help="its private key (PEM)")
    p.add_argument("--keep-serving", action="store_true",
                   help="after a successful run keep serving the dashboard and the gRPC health until stopped "
                        "(containers); an --out run that already finished is then served read-only")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s aggregator %(levelname)s %(message)s")
    redaction = install_log_redaction()
    try:
        dash_access = dashboard_token_from_args(args, args.host)
        if dash_access.token:
            redaction.add_secret(dash_access.token)
        security = server_security_from_args(args)
        estimator_security = estimator_client_security(security, args.estimator_token_file, args.estimator,
                                                       args.estimator_tls_cert, args.estimator_tls_key)
        cfg = load_config(args.config, args.set)
        if args.device:
            from fedent.config import with_device

            cfg = with_device(cfg, args.device)
        settings = settings_from_args(args, args.port)
        if args.keep_serving and not args.fresh and args.out and finished_run(args.out) is not None:
            return serve_finished_until_stopped(args, security, dash_access, settings.stream_limits())
        run_dir = Path(args.out) if args.out else Path(cfg.out_dir) / runlog.new_run_id(
            cfg.name, cfg.algorithm.name, cfg.train.seed)
        rounds = cfg.train.rounds
        handle = start_aggregator(cfg, settings, run_dir, dashboard=args.dashboard_port is not None,
                                  dashboard_host=args.host, dashboard_port=args.dashboard_port or 0,
                                  dashboard_token=dash_access.token,
                                  security=security, estimator_security=estimator_security,
                                  on_round=lambda rec: log.info(round_log_line(rec, rounds)), fresh=args.fresh)
    except RunFinished as e:
        print(f"aggregator: {e}", flush=True)
        return 0
    except (ConfigError, SettingsError, SecurityConfigError, ValueError, OSError, DatasetError) as e:
        print(f"aggregator: {e}", file=sys.stderr)
        return 2
    if args.port_file:
        save_port(args.port_file, handle.port)
    print(f"aggregator listening on {settings.host}:{handle.port}, run dir {handle.run_dir}", flush=True)
    if handle.dashboard_url:
        for line in dashboard_lines("dashboard: ", handle.dashboard_url, dash_access):
            print(line, flush=True)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise Stopped("SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    try:
        handle.wait()
    except KeyboardInterrupt as e:  # status.json ends "stopped" with the reason (a checkpointed run resumes)
        signame = e.signame if isinstance(e, Stopped) else "SIGINT"
        print(f"aggregator: interrupted ({stop_reason(e)})", file=sys.stderr)
        handle.stop(signame=signame)
        return 130
    if handle.run.error:
        handle.stop()
        print(f"aggregator: run failed: {handle.run.error}", file=sys.stderr)
        return 1
    if args.keep_serving:
        print(f"aggregator: run done; serving {handle.run_dir} until stopped (--keep-serving)", flush=True)
        wait_for_stop()
    handle.stop()
    return 0


def wait_for_stop() -> None:
    """Until SIGTERM / SIGINT (main() turns SIGTERM into KeyboardInterrupt)."""
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def serve_finished_until_stopped(args: argparse.Namespace, security: ServerSecurity,
                                 dash_access: DashboardToken, limits: StreamLimits | None = None) -> int:
    """--keep-serving on a run directory whose run already finished: read-only, nothing rewritten."""
    try:
        handle = serve_finished(args.out, args.host, args.port, security,
                                dashboard=args.dashboard_port is not None, dashboard_port=args.dashboard_port or 0,
                                dashboard_token=dash_access.token,
                                limits=limits)
    except OSError as e:
        print(f"aggregator: {e}", file=sys.stderr)
        return 2
    if args.port_file:
        save_port(args.port_file, handle.port)
    print(f"aggregator: the run in {args.out} already finished; serving it read-only on {args.host}:{handle.port}",
          flush=True)
    if handle.dashboard_url:
        for line in dashboard_lines("dashboard: ", handle.dashboard_url, dash_access):
            print(line, flush=True)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    wait_for_stop()
    handle.stop()
    return 0


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
