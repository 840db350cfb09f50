"""``fedent`` command line: a thin dispatcher over subcommand modules.

Subcommands that need grpc or fastapi (cluster, dashboard, certs) live outside the pure core and are
imported lazily, only when chosen, so ``import fedent.cli`` stays free of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fedent.config import ConfigError

# subcommand -> module providing add_parser(subparsers) and run(args)
SUBCOMMANDS: dict[str, str] = {
    "partition": "fedent.commands.partition",
    "simulate": "fedent.commands.simulate",
    "compare": "fedent.commands.compare",
    "plot": "fedent.commands.plot",
    "reproduce": "fedent.commands.reproduce",
    "cluster": "server.launcher_cli",
    "dashboard": "server.dashboard_cli",
    "certs": "server.certs_cli",
}


def _available() -> dict[str, object]:
    mods: dict[str, object] = {}
    for name, modname in SUBCOMMANDS.items():
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
