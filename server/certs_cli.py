"""``fedent certs``: make a development CA, TLS certificates and worker tokens, or revoke workers.

Prints the paths it wrote, never a token or a key.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP = "make a development CA, TLS certificates and per-worker tokens (or revoke a worker)"


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from server.certs import DEFAULT_HOSTS, DEFAULT_WORKERS  # cryptography: only when this command is chosen

    p = subparsers.add_parser(
        "certs",
        help=HELP,
        description="Writes ca.crt/key, server.crt/key, clients/<worker>.crt/key and tokens.json (0600) "
                    "under --out. With --revoke, adds workers to tokens.json's revocation list instead.",
    )
    p.add_argument("--out", required=True, type=Path, help="directory to write into")
    p.add_argument("--hosts", type=_csv, default=list(DEFAULT_HOSTS),
                   help="comma-separated DNS names / IPs for the server certificate (default: %(default)s)")
    p.add_argument("--workers", type=_csv, default=list(DEFAULT_WORKERS),
                   help="comma-separated worker ids: one client certificate and token each (default: %(default)s)")
    p.add_argument("--days", type=int, default=30, help="validity in days (default: %(default)s)")
    keep = p.add_mutually_exclusive_group()
    keep.add_argument("--force", action="store_true", help="replace an existing CA in --out")
    keep.add_argument("--if-missing", action="store_true",
                      help="keep a complete PKI already in --out untouched and exit 0 (containers run this on "
                           "every start); fails when --out holds a CA without these workers' files")
    p.add_argument("--dashboard-token", action="store_true",
                   help="also write OUT/dashboard.token (0600), for the aggregator's --dashboard-token-file; "
                        "not a worker token")
    p.add_argument("--revoke", type=_csv, default=None, metavar="W1,W2",
                   help="revoke these workers in OUT/tokens.json instead of generating anything")
    return p


def check_existing_pki(out: Path, workers: list[str]) -> None:
    """Raise CertsError unless ``out`` holds every file the servers and these workers need."""
    from server.certs import CertsError

    needed = [out / n for n in ("ca.crt", "server.crt", "server.key", "tokens.json")]
    needed += [out / "tokens" / f"{w}.token" for w in workers]
    missing = [str(p.relative_to(out)) for p in needed if not p.is_file()]
    if missing:
        raise CertsError(f"{out} holds a CA but lacks {', '.join(missing)}; pass --force to replace the whole "
                         f"PKI (old tokens stop working)")


def _dashboard_token(out: Path, replace: bool = False) -> None:
    from server.certs import _write, new_token

    path = out / "dashboard.token"
    if replace or not path.is_file():
        _write(path, (new_token() + "\n").encode(), private=True)
    print(f"  dashboard token: {path} (mode 0600)")


def run(args: argparse.Namespace) -> int:
    from server.certs import CertsError, make_dev_pki, revoke_workers

    try:
        if args.revoke is not None:
            if not args.revoke:
                raise CertsError("--revoke needs at least one worker id")
            revoked = revoke_workers(Path(args.out) / "tokens.json", args.revoke)
            print(f"revoked in {Path(args.out) / 'tokens.json'}: {', '.join(revoked)}")
            return 0
        if args.if_missing and (Path(args.out) / "ca.key").exists():
            check_existing_pki(Path(args.out), args.workers)
            print(f"kept the PKI already in {args.out}")
            if args.dashboard_token:
                _dashboard_token(Path(args.out))
            return 0
        bundle = make_dev_pki(args.out, hosts=args.hosts, workers=args.workers, days=args.days, force=args.force)
        if args.dashboard_token:
            _dashboard_token(Path(args.out), replace=True)
    except (CertsError, OSError) as e:
        print(f"fedent certs: {e}", file=sys.stderr)
        return 2
    print(f"wrote a development PKI to {bundle.out_dir} (valid {args.days} days)")
    print(f"  CA:      {bundle.ca_cert} (key {bundle.ca_key}, keep private)")
    print(f"  server:  {bundle.server_cert} for {', '.join(args.hosts)}")
    for w, (crt, _key) in bundle.client_certs.items():
        print(f"  client:  {crt} ({w})")
    if bundle.tokens_file is not None:
        print(f"  tokens:  {bundle.tokens_file} and {bundle.out_dir / 'tokens'}/<worker>.token (mode 0600)")
    return 0
