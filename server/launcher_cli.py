"""``fedent cluster up --config FILE --workers N``: run the local cluster (see server.launcher)."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from fedent import runlog
from fedent.config import load_config
from fedent.signals import Stopped, stop_reason

HELP = "run the aggregator, estimator, workers and dashboard locally"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("cluster", help=HELP)
    sub = p.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser("up", help="start a local cluster for one config")
    up.add_argument("--config", required=True, help="experiment YAML")
    up.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    up.add_argument("--workers", type=int, default=2, help="worker processes (clients are split between them)")
    up.add_argument("--out", default=None, help="run directory (default: <out_dir>/<run id>); an unfinished "
                    "cluster run there is resumed from its newest intact checkpoint, a finished one is reported "
                    "and left as it is, another kind of run or config is refused")
    up.add_argument("--fresh", action="store_true", help="start over: move a run already in --out to "
                    "<out>.old-<UTC time> first (needed when none of its checkpoints is intact)")
    up.add_argument("--exit-when-done", action="store_true", help="exit when the run finishes (0 = success)")
    up.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N (workers and evaluation)")
    up.add_argument("--no-dashboard", action="store_true", help="do not serve the dashboard")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext gRPC without worker authentication (default: TLS + mutual TLS + tokens, "
                         "with a development CA made under <run dir>/pki)")
    up.add_argument("--worker-data", default=None, metavar="SPEC",
                    help="data.placement: workers: every worker gets --data SPEC (a folder per client, or split:PATH) "
                         "and reads its own clients' data from it")
    up.add_argument("--no-estimator-service", action="store_true",
                    help="FedEnt: solve φ2 in the aggregator process instead of the estimator service")
    from server.__main__ import add_settings_args
    from server.dashboard_access import add_dashboard_token_args

    add_settings_args(up)
    add_dashboard_token_args(up)


def absolute_data_spec(spec: str | None) -> str | None:
    """--worker-data with its path made absolute: the workers start in the repository, not in this directory."""
    if spec is None:
        return None
    mode, sep, path = spec.partition(":")
    if sep and mode in ("per-client", "split"):
        return f"{mode}:{Path(path).expanduser().resolve()}"
    return str(Path(spec).expanduser().resolve())


def run(args: argparse.Namespace) -> int:
    from fedent.data import DatasetError
    from fedent.rounds.rundir import RunDirError, RunFinished
    from fedentrpc.security.redaction import install_log_redaction
    from server.__main__ import settings_from_args
    from server.dashboard_access import DashboardTokenError, dashboard_lines, dashboard_token_from_args
    from server.launcher import Cluster, LaunchError, LaunchSettings, default_run_dir
    from server.settings import SettingsError

    cfg = load_config(args.config, args.set)
    if args.device:
        cfg = replace(cfg, train=replace(cfg.train, device=args.device))
    try:
        agg = settings_from_args(args, port=0)
        launch = LaunchSettings(workers=args.workers, device=args.device, dashboard=not args.no_dashboard,
                                use_estimator_service=not args.no_estimator_service, secure=not args.insecure,
                                fresh=args.fresh, worker_data=absolute_data_spec(args.worker_data))
        # the dashboard binds launch.dashboard_host (loopback): a token only when one is given
        dash_access = dashboard_token_from_args(args, launch.dashboard_host)
        if dash_access.token:
            install_log_redaction([dash_access.token])
            launch = replace(launch, dashboard_token=dash_access.token)
    except (SettingsError, DashboardTokenError, ValueError) as e:
        print(f"fedent cluster: {e}", file=sys.stderr)
        return 2
    cluster = Cluster(cfg, default_run_dir(cfg, args.out), launch)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also when started in the background, where SIGINT is inherited ignored
    try:
        try:
            cluster.start(agg)
        except RunFinished as e:  # nothing to do, nothing touched
            print(f"fedent cluster: {e}", flush=True)
            return 0
        except (DatasetError, RunDirError) as e:  # the same one line and exit code as simulate
            print(f"fedent cluster: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        except (LaunchError, OSError, ValueError) as e:
            print(f"fedent cluster: {e}", file=sys.stderr)
            return 1
        handle = cluster.aggregator
        assert handle is not None
        if cluster.moved_to is not None:
            print(f"fedent cluster: moved the previous run to {cluster.moved_to} (--fresh)", flush=True)
        print(f"fedent cluster: run dir {handle.run_dir}", flush=True)
        print(f"fedent cluster: aggregator on 127.0.0.1:{handle.port}, {len(cluster.workers)} workers"
              + (f", estimator on {cluster.estimator_address}" if cluster.estimator_address else ""), flush=True)
        if cluster.pki is not None:
            print(f"fedent cluster: TLS + mutual TLS + worker tokens (certificates in {cluster.pki.out_dir})",
                  flush=True)
        else:
            print("fedent cluster: INSECURE: plaintext gRPC, no worker authentication (--insecure)", flush=True)
        if handle.dashboard_url:
            for line in dashboard_lines("fedent cluster: dashboard ", handle.dashboard_url, dash_access):
                print(line, flush=True)
        try:
            rounds = handle.run.engine.rounds
            ok = cluster.wait(on_round=lambda rec: print(round_line(rec, rounds), flush=True))
        except LaunchError as e:
            print(f"fedent cluster: {e}", file=sys.stderr)
            return 1
        if ok:
            print(f"fedent cluster: {finished_line(handle.run.engine.records, handle.run.paths.model)}", flush=True)
        else:
            print(f"fedent cluster: run failed: {handle.run.error}", file=sys.stderr)
        if not args.exit_when_done and handle.dashboard_url:
            print("fedent cluster: dashboard stays up; Ctrl-C to stop", flush=True)
            signal.pause()
        elif handle.dashboard_url:  # its URL dies with this process: say how to open the finished run
            print(f"fedent cluster: the dashboard stopped with the cluster; to browse this run: "
                  f"fedent dashboard {handle.run_dir}", flush=True)
        return 0 if ok else 1
    except KeyboardInterrupt as e:  # the run's status.json ends "stopped" with the reason, as simulate's does
        signame = e.signame if isinstance(e, Stopped) else "SIGINT"
        print(f"fedent cluster: stopping ({stop_reason(e)})", file=sys.stderr)
        cluster.stop(signame)
        return 130
    finally:
        cluster.stop()


def round_line(rec: dict[str, Any], rounds: int | None) -> str:
    """One progress line per completed round: accuracy, loss and round time."""
    total = f"/{rounds}" if rounds else ""
    acc = rec.get("test_acc")
    acc_s = f"test acc {acc:.4f}" if isinstance(acc, (int, float)) else "test acc -"
    loss = rec.get("train_loss")
    loss_s = f"train loss {loss:.4f}" if isinstance(loss, (int, float)) else "train loss -"
    wall = rec.get("wall_s")
    wall_s = f"{wall:.1f}s" if isinstance(wall, (int, float)) else "-"
    clients = rec.get("num_clients", "?")
    head = f"fedent cluster: round {runlog.round_of(rec) if 'round' in rec else 0}{total}"
    return f"{head}: {acc_s}, {loss_s}, {clients} clients, {wall_s}"


def finished_line(records: list[dict[str, Any]], model: Any) -> str:
    """The run's result from the records this run holds (after a resume: the resumed run's, not the file's
    earlier lines)."""
    from fedent.runlog import final_accuracy

    acc = final_accuracy(records)
    acc_s = f"{acc:.4f}" if acc is not None else "n/a"
    return f"run finished; final test accuracy {acc_s}; final model {model}"
