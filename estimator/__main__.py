"""``python -m estimator``: the estimator calculator service (FedEnt's mean-field fixed points).

Binds ``--host:--port`` (0 picks a free port) and announces the bound port with one machine-readable
line, ``LISTENING port=NNNN``, on stdout (and in ``--port-file`` when given) for the launcher.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from estimator.service import create_estimator_service
from estimator.settings import EstimatorSettings, SettingsError
from fedent import runlog
from fedentrpc.lifeline import watch_parent
from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.flags import add_server_security_args, server_security_from_args
from fedentrpc.security.redaction import install_log_redaction
from fedentrpc.stream_limit import add_stream_limit_args


def build_parser() -> argparse.ArgumentParser:
    d = EstimatorSettings()
    p = argparse.ArgumentParser(prog="python -m estimator",
                                description="fedent estimator calculator (mean-field fixed points over gRPC)")
    p.add_argument("--host", default=d.host, help="interface to bind (0.0.0.0 for other machines)")
    p.add_argument("--port", type=int, default=50052, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", default=None, help="write the bound port here (atomically)")
    p.add_argument("--run-dir", default=None, help="persist finished offline jobs here")
    p.add_argument("--token", default="", help="token the workers' oracle streams must present")
    p.add_argument("--max-workers", type=int, default=d.max_workers, help="gRPC thread pool size")
    p.add_argument("--max-streams-per-identity", type=int, default=d.max_streams_per_identity,
                   help="open streaming calls one worker identity may hold; more get RESOURCE_EXHAUSTED; only with "
                   "worker authentication; 0 = no limit")
    add_stream_limit_args(p, d.max_anonymous_streams, d.stream_idle_s, d.open_stream_max_s)
    p.add_argument("--oracle-timeout", type=float, default=d.oracle_timeout_s,
                   help="seconds one gradient request to a worker may take")
    p.add_argument("--oracle-retries", type=int, default=d.oracle_retries,
                   help="re-sends of a failed or timed-out gradient request")
    p.add_argument("--oracle-prefetch", type=int, default=d.oracle_prefetch,
                   help="clients asked at once at the same point (memory: this many gradients)")
    p.add_argument("--wait-workers", type=float, default=d.wait_workers_s,
                   help="default seconds to wait for the workers' oracle streams")
    p.add_argument("--blob-cache-mb", type=int, default=d.blob_cache_bytes // 2**20,
                   help="cap on the tensor blobs held (MiB)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_server_security_args(p)
    return p


def settings_from_args(args: argparse.Namespace) -> EstimatorSettings:
    return EstimatorSettings(host=args.host, port=args.port, token=args.token, max_workers=args.max_workers,
                             max_streams_per_identity=args.max_streams_per_identity,
                             max_anonymous_streams=args.max_anonymous_streams, stream_idle_s=args.stream_idle,
                             open_stream_max_s=args.open_stream_max,
                             oracle_timeout_s=args.oracle_timeout, oracle_retries=args.oracle_retries,
                             oracle_prefetch=args.oracle_prefetch, wait_workers_s=args.wait_workers,
                             blob_cache_bytes=args.blob_cache_mb * 2**20, run_dir=args.run_dir,
                             security=server_security_from_args(args))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s estimator %(levelname)s %(message)s")
    watch_parent()  # started by `fedent cluster up`: exit when it dies
    install_log_redaction([args.token] if args.token else [])
    try:
        settings = settings_from_args(args)
        handle = create_estimator_service(settings)
    except (SettingsError, SecurityConfigError, OSError, RuntimeError) as e:
        print(f"estimator: {e}", file=sys.stderr)
        return 2
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.port_file:
        runlog.atomic_write_text(args.port_file, f"{handle.port}\n")
    print(f"LISTENING port={handle.port}", flush=True)
    logging.getLogger("fedent.estimator").info("estimator service on %s:%d", settings.host, handle.port)
    while not done.wait(1.0):
        pass
    handle.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
