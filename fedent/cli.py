"""``fedent`` command line: a thin dispatcher over subcommand modules.

The core's own subcommands are listed here. Subcommands that need grpc or fastapi (cluster, dashboard,
certs) belong to the services, which register them under the entry-point group ``fedent.commands``
(pyproject.toml), so the core never names a service and an installed package can add a subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

from fedent.config import ConfigError

# subcommand -> module providing add_parser(subparsers) and run(args)
SUBCOMMANDS: dict[str, str] = {
    "partition": "fedent.commands.partition",
    "simulate": "fedent.commands.simulate",
    "compare": "fedent.commands.compare",
    "plot": "fedent.commands.plot",
    "reproduce": "fedent.commands.reproduce",
}
ENTRY_POINT_GROUP = "fedent.commands"


def subcommands() -> dict[str, str]:
    """The core's subcommands plus those that installed packages register (the services' among them)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **SUBCOMMANDS}


def _available() -> dict[str, object]:
    mods: dict[str, object] = {}
    for name, modname in subcommands().items():
        try:
            mods[name] = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name and modname.startswith(e.name):
                continue  # not built yet / not installed
            raise
    return mods


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedent", description="FedEnt federated learning: simulator and cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    mods = _available()
    for mod in mods.values():
        mod.add_parser(sub)  # type: ignore[attr-defined]
    args = parser.parse_args(argv)
    try:
        return int(mods[args.command].run(args) or 0)  # type: ignore[attr-defined]
    except ConfigError as e:
        print(f"fedent {args.command}: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fedent {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
