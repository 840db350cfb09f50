"""``fedent dashboard RUN_DIR``: serve the status dashboard of one run directory (live or finished)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP = "serve the live status dashboard of a run directory"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dashboard", help=HELP,
        description="Serve a read-only REST API, Prometheus /metrics and a live web page for one run directory.",
    )
    p.add_argument("run_dir", type=Path, help="run directory (runs/<run-id>) written by the simulator or cluster")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0 picks a free one)")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument("--token", default=None,
                      help="require 'Authorization: Bearer TOKEN' on data routes (open the page with ?token=TOKEN)")
    auth.add_argument("--token-file", type=Path, default=None,
                      help="read the token from this file (keeps it out of the process list)")


def _fail(msg: str) -> int:
    print(f"fedent dashboard: {msg}", file=sys.stderr)
    return 2


def _token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(token, error): the token from --token or --token-file, never echoed."""
    if args.token_file is not None:
        try:
            value = args.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            return None, f"cannot read --token-file {args.token_file}: {e.__class__.__name__}"
        return (value, None) if value else (None, f"--token-file {args.token_file} is empty")
    if args.token is not None and not args.token.strip():
        return None, "--token must not be empty"
    return args.token, None


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from server.dashboard.app import create_app
    from server.dashboard.serve import bind_socket, uvicorn_config

    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        return _fail(f"run directory not found: {run_dir}")
    if not 0 <= args.port <= 65535:
        return _fail(f"--port must be in 0..65535, got {args.port}")
    token, err = _token(args)
    if err:
        return _fail(err)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as e:
        return _fail(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    auth_note = " (bearer token required; open the page with ?token=...)" if token else ""
    print(f"fedent dashboard: serving {run_dir} at http://{host}:{port}/{auth_note}", flush=True)
    server = uvicorn.Server(uvicorn_config(create_app(run_dir, token=token)))
    server.run(sockets=[sock])  # in the main thread, so Ctrl-C / SIGTERM stop it cleanly
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m server.dashboard_cli RUN_DIR ...``: the same command without importing the simulator stack."""
    parser = argparse.ArgumentParser(prog="fedent")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["dashboard", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
