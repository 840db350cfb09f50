"""The aggregator's dashboard token at the process edge (``python -m server``, ``fedent cluster up``).

``--dashboard-token`` / ``--dashboard-token-file`` / ``FEDENT_DASHBOARD_TOKEN`` (flags win over the
environment). A dashboard that binds a non-loopback address without any of them gets a generated token
(``secrets.token_urlsafe(32)``, like the worker tokens), which the command prints once on stdout; a
loopback dashboard needs no token unless one is given. No fastapi import: the dashboard is optional.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_TOKEN = "FEDENT_DASHBOARD_TOKEN"


class DashboardTokenError(ValueError):
    """A dashboard token option that cannot be used; the message is one line and never holds the token."""


@dataclass(frozen=True)
class DashboardToken:
    token: str | None = field(default=None, repr=False)
    generated: bool = False  # made here: the command prints it (a given token is never echoed)


def add_dashboard_token_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "dashboard access (flags override FEDENT_DASHBOARD_TOKEN; on a non-loopback address a token is "
        "generated and printed when none is given)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--dashboard-token", default=None,
                   help="require 'Authorization: Bearer TOKEN' on the dashboard's data routes "
                        "(open the page with ?token=TOKEN)")
    m.add_argument("--dashboard-token-file", type=Path, default=None,
                   help="read the dashboard token from this file (keeps it out of the process list)")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback literals; a wildcard (0.0.0.0, ::) or any other address is not."""
    h = host.strip().strip("[]")
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def dashboard_token_from_args(args: argparse.Namespace, host: str,
                              env: Mapping[str, str] | None = None) -> DashboardToken:
    """The token given by flag, file or environment; else a fresh one when ``host`` is not loopback."""
    env = os.environ if env is None else env
    token_file: Path | None = getattr(args, "dashboard_token_file", None)
    given: str | None = getattr(args, "dashboard_token", None)
    if token_file is not None:
        try:
            value = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise DashboardTokenError(f"cannot read --dashboard-token-file {token_file}: "
                                      f"{e.__class__.__name__}") from None
        if not value:
            raise DashboardTokenError(f"--dashboard-token-file {token_file} is empty")
        return DashboardToken(value)
    if given is not None:
        if not given.strip():
            raise DashboardTokenError("--dashboard-token must not be empty")
        return DashboardToken(given.strip())
    from_env = env.get(ENV_TOKEN, "").strip()
    if from_env:
        return DashboardToken(from_env)
    if is_loopback(host):
        return DashboardToken()
    return DashboardToken(secrets.token_urlsafe(32), generated=True)


def dashboard_lines(prefix: str, url: str, access: DashboardToken) -> list[str]:
    """What a command prints about its dashboard: the URL, and the generated token (only that one) once."""
    if access.token is None:
        return [f"{prefix}{url}"]
    if not access.generated:
        return [f"{prefix}{url} (bearer token required)"]
    return [f"{prefix}{url}/?token={access.token}",
            f"{prefix}that token was generated for this run and is shown only here (never logged); "
            f"API calls need 'Authorization: Bearer <token>'"]
