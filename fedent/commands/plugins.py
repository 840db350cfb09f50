"""``fedent plugins``: the models, datasets and strategies a config may name, built-in and installed.

Installed packages add names through the entry-point groups ``fedent.models``, ``fedent.datasets`` and
``fedent.strategies`` (docs/extending.md); ``--check NAME`` resolves one name (or import path) the way a
config would and prints the one-line error when it cannot be used.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fedent.config import ConfigError

if TYPE_CHECKING:
    from fedent.plugins import Kind

HELP = "list the models, datasets and strategies available (built-in and plug-ins)"
KINDS: tuple[Kind, ...] = ("models", "datasets", "strategies")


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("plugins", help=HELP, description=HELP + ". Plug-ins come from the entry-point "
                              "groups fedent.models, fedent.datasets and fedent.strategies, or are named in a "
                              "config by import path (package.module:attribute).")
    p.add_argument("--kind", choices=KINDS, default=None, help="only this kind")
    p.add_argument("--check", default=None, metavar="NAME",
                   help="resolve NAME (an entry-point name or package.module:attribute) as --kind and report")


def run(args: argparse.Namespace) -> int:
    from fedent import plugins

    if args.check is not None:
        if args.kind is None:
            raise ConfigError("--check: give --kind models|datasets|strategies too")
        if plugins.is_builtin(args.kind, args.check):
            print(f"{args.kind} {args.check}: built-in")
            return 0
        obj = plugins.resolve(args.kind, args.check)  # PluginError: one line, exit 2 (fedent.cli)
        print(f"{args.kind} {args.check}: ok ({getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')})")
        return 0
    kinds: tuple[Kind, ...] = (args.kind,) if args.kind else KINDS
    for kind in kinds:
        print(f"{kind} ({plugins.GROUPS[kind]}):")
        for a in plugins.available(kind):
            where = "built-in" if a.target == "built-in" else f"{a.target}  [{a.origin}]"
            print(f"  {a.name:<24} {where}")
    return 0
