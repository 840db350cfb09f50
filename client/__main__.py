"""``python -m client``: run a worker hosting some simulated clients of an aggregator's run."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from client.settings import WorkerSettings
from client.worker import LocalDataRefused, Worker, WorkerError, parse_client_ids
from fedent.config import EXECUTORS
from fedent.data.datasets import DatasetError
from fedentrpc.lifeline import watch_parent
from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.flags import add_client_security_args, client_security_from_args
from fedentrpc.security.redaction import install_log_redaction


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m client", description="fedent worker (dials out to the aggregator)")
    p.add_argument("--aggregator", required=True, help="HOST:PORT of the aggregator")
    p.add_argument("--estimator", default="", help="HOST:PORT of the estimator service (FedEnt offline mode)")
    ids = p.add_mutually_exclusive_group(required=True)
    ids.add_argument("--clients", help="a range or list of client ids, e.g. 0-9 or 0-4,10-14")
    ids.add_argument("--client-ids", nargs="+", type=int, help="client ids, e.g. --client-ids 3 5 7")
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | cuda:N")
    p.add_argument("--data-root", default=None, help="where this machine keeps the dataset files")
    p.add_argument("--data", default=None, metavar="SPEC",
                   help="the hosted clients' data on this machine (runs with data.placement: workers): DIR with a "
                        "folder per client (client-<cid>/ holding train.npz|train.pt with x and y, an ImageFolder "
                        "train/<label>/, IDX or CIFAR files; test.* / test/ for federated evaluation), or "
                        "split:PATH, one local dataset split among the hosted clients")
    p.add_argument("--no-label-histogram", action="store_true",
                   help="do not report the clients' label histograms at registration (only their sample counts)")
    p.add_argument("--name", default="", help="worker name shown on the dashboard")
    p.add_argument("--token", default="", help="registration token, when the aggregator requires one")
    p.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for the aggregator")
    p.add_argument("--stall-timeout", type=float, default=30.0,
                   help="seconds without a chunk moving before a model transfer is cut and resumed where it stopped")
    p.add_argument("--state-dir", default=None,
                   help="persist each client's state here (FedDyn/SCAFFOLD/FedEnt) so a restarted worker resumes")
    p.add_argument("--reconnect-attempts", type=int, default=10,
                   help="re-registrations tried after losing the aggregator (0: exit at once)")
    p.add_argument("--reconnect-window", type=float, default=300.0, help="seconds to keep trying to reconnect")
    p.add_argument("--backoff-base", type=float, default=0.5, help="first reconnect backoff bound (seconds)")
    p.add_argument("--backoff-cap", type=float, default=15.0, help="largest reconnect backoff bound (seconds)")
    p.add_argument("--executor", choices=EXECUTORS, default="auto",
                   help="how this worker's clients train: sequential (one after another) or vectorised (a round's "
                        "clients in one vmapped step); auto = vectorised on CUDA, sequential on the CPU")
    p.add_argument("--max-parallel-clients", type=int, default=None, metavar="N",
                   help="vectorised executor: at most N clients per step (default: from free device memory)")
    p.add_argument("--log-level", default="INFO")
    add_client_security_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s worker %(levelname)s %(message)s")
    watch_parent()  # started by `fedent cluster up`: exit when it dies
    try:
        security = client_security_from_args(args, worker=args.name or None)
        cids = parse_client_ids(args.clients) if args.clients else tuple(sorted(set(args.client_ids)))
        settings = WorkerSettings(aggregator=args.aggregator, client_ids=cids, estimator=args.estimator,
                                  device=args.device, data_root=args.data_root, name=args.name, token=args.token,
                                  connect_timeout_s=args.connect_timeout,
                                  stall_timeout_s=args.stall_timeout, state_dir=args.state_dir,
                                  security=security, reconnect_attempts=args.reconnect_attempts,
                                  reconnect_window_s=args.reconnect_window, backoff_base_s=args.backoff_base,
                                  backoff_cap_s=args.backoff_cap, data=args.data,
                                  label_histogram=not args.no_label_histogram, executor=args.executor,
                                  max_parallel_clients=args.max_parallel_clients)
        worker = Worker(settings)
        if security.token:
            install_log_redaction([security.token])
    except (ValueError, SecurityConfigError, DatasetError) as e:  # bad local data: one line, nothing sent
        print(f"worker: {e}", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        return 0 if worker.run() else 1
    except LocalDataRefused as e:
        print(f"worker: local data refused: {e}", file=sys.stderr)
        return 2
    except WorkerError as e:
        print(f"worker: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        # past this point a SIGTERM (the launcher stopping a worker that is already exiting) must end the
        # process quietly, not raise KeyboardInterrupt inside interpreter-shutdown finalizers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def exit_fast(code: int) -> None:
    """Flush and leave without the interpreter's slow teardown (~2 s of gRPC/torch finalizers): a stopped
    worker has nothing left to save (its files are written atomically as it goes)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_fast(main())
