"""``fedent`` command line: a thin dispatcher over subcommand modules.

The core's own subcommands are listed here. Subcommands that need grpc or fastapi (cluster, dashboard,
certs) belong to the services, which register them under the entry-point group ``fedent.commands``
(pyproject.toml), so the core never names a service and an installed package can add a subcommand.

Start-up is lazy: only the chosen subcommand's module builds its parser and runs; the others appear in
``fedent --help`` with their one-line ``HELP`` (a module constant, read without building their parsers),
and nothing imports torch before a command needs it. ``fedent --help`` takes a fraction of a second
(benchmarks/bench_cli.py) instead of the seconds that importing torch and grpc up front cost.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from fedent.config import ConfigError
from fedent.signals import Stopped, stop_on_signals, stop_reason

# subcommand -> module providing add_parser(subparsers) and run(args) (and, optionally, a one-line HELP)
SUBCOMMANDS: dict[str, str] = {
    "partition": "fedent.commands.partition",
    "simulate": "fedent.commands.simulate",
    "compare": "fedent.commands.compare",
    "tune": "fedent.commands.tune",
    "plot": "fedent.commands.plot",
    "reproduce": "fedent.commands.reproduce",
    "tensorboard": "fedent.commands.tensorboard",
    "plugins": "fedent.commands.plugins",
    "data": "fedent.commands.data",
    "new": "fedent.commands.new",
}
ENTRY_POINT_GROUP = "fedent.commands"
# Commands that run the round engine in this process: SIGTERM stops them as SIGINT does (fedent.signals), so the
# run's status.json ends "stopped" with the reason and the run can resume.
STOP_ON_SIGNALS = frozenset({"simulate", "compare", "reproduce", "tune"})


def subcommands() -> dict[str, str]:
    """The core's subcommands plus those that installed packages register (the services' among them)."""
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**found, **SUBCOMMANDS}


def version() -> str:
    """The installed package's version (the source tree's pyproject when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("fedent")
    except PackageNotFoundError:
        return "unknown (not installed)"


# Top-level modules of the optional extras (pyproject.toml): a subcommand that needs a missing one is not offered,
# and naming it says which extra to install instead of a traceback.
EXTRA_OF = {"grpc": "cluster", "grpc_health": "cluster", "grpc_reflection": "cluster", "google": "cluster",
            "cryptography": "cluster", "fastapi": "dashboard", "uvicorn": "dashboard", "pydantic": "dashboard",
            "starlette": "dashboard"}
MISSING: dict[str, str] = {}  # subcommand -> the extra it needs, filled by _load


def _load(modname: str, name: str = "") -> ModuleType | None:
    """The subcommand's module, or None when it (or the package providing it) is not installed, or when it needs
    an extra that is not (``MISSING`` then names the extra)."""
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name and modname.startswith(e.name):
            return None
        extra = EXTRA_OF.get((e.name or "").split(".")[0])
        if extra is not None:
            MISSING[name or modname] = extra
            return None
        raise


def _chosen(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first word that is not an option (the top-level parser
    has no options that take a value)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in names else None
    return None


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The parser with the chosen subcommand's full arguments and every other subcommand as a stub."""
    parser = argparse.ArgumentParser(prog="fedent", description="FedEnt federated learning: simulator and cluster")
    parser.add_argument("--version", action="version", version=f"fedent {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = subcommands()
    chosen = _chosen(argv, list(commands))
    loaded: dict[str, ModuleType] = {}
    core = list(SUBCOMMANDS)
    for name in sorted(commands, key=lambda n: (core.index(n) if n in core else len(core), n)):
        mod = _load(commands[name], name)
        if mod is None:
            continue  # not built yet / not installed
        summary = getattr(mod, "HELP", None)
        if name == chosen or summary is None:
            try:
                mod.add_parser(sub)  # a service's parser may import its extra's modules here
            except ModuleNotFoundError as e:
                extra = EXTRA_OF.get((e.name or "").split(".")[0])
                if extra is None:
                    raise
                MISSING[name] = extra
                continue
            loaded[name] = mod
        else:
            loaded[name] = mod
            sub.add_parser(name, help=summary, add_help=False)
    return parser, loaded


def _needs_extra(command: str, extra: str) -> int:
    print(f"fedent {command}: needs the [{extra}] extra, which is not installed: pip install 'fedent[{extra}]' "
          f"(or .venv/bin/pip install -e '.[{extra}]' in the repository)", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, mods = build_parser(argv)
    wanted = _chosen(argv, list(subcommands()))
    if wanted is not None and wanted not in mods and wanted in MISSING:
        return _needs_extra(wanted, MISSING[wanted])
    args = parser.parse_args(argv)
    try:
        if args.command in STOP_ON_SIGNALS:
            with stop_on_signals():
                return int(mods[args.command].run(args) or 0)
        return int(mods[args.command].run(args) or 0)
    except ModuleNotFoundError as e:  # a service's module imports its extra only when it runs
        extra = EXTRA_OF.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        return _needs_extra(args.command, extra)
    except ConfigError as e:
        # "--flag: ..." is a command-line mistake; everything else names a config key
        label = "" if str(e).startswith("--") else "config error: "
        print(f"fedent {args.command}: {label}{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"fedent {args.command}: {stop_reason(e)}", file=sys.stderr)
        return e.exit_code if isinstance(e, Stopped) else 130


if __name__ == "__main__":
    sys.exit(main())
