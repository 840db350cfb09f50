"""The real argparse parser behind a container command line (``python -m MODULE ...`` or ``fedent SUB ...``),
for the static checks of docker-compose.yml and the Kubernetes manifests (tests/system/test_compose.py,
tests/system/test_k8s_manifests.py): a flag the code does not accept fails them."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(main: Callable[[list[str]], Any]) -> argparse.ArgumentParser:
    """The parser a ``main(argv)`` builds, caught at its first ``parse_args`` (for mains without a builder)."""
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        main([])
    except _Captured as c:
        return c.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError("main() never parsed its arguments")


def module_parser(module: str) -> argparse.ArgumentParser:
    mod = importlib.import_module(module)
    if hasattr(mod, "build_parser"):
        return mod.build_parser()
    return parser_of(mod.main)


def fedent_parser(subcommand: str) -> argparse.ArgumentParser:
    """``fedent``'s parser with the one subcommand used (registered by the module fedent.cli dispatches to)."""
    from fedent.cli import subcommands

    commands = subcommands()
    assert subcommand in commands, f"fedent has no subcommand {subcommand!r}"
    p = argparse.ArgumentParser(prog="fedent")
    sub = p.add_subparsers(dest="command", required=True)
    importlib.import_module(commands[subcommand]).add_parser(sub)
    return p


class ParseError(Exception):
    pass


def parse(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """(module or 'fedent', parsed namespace) for a container command, with the real parser."""
    if argv[:2] == ["python", "-m"]:
        module, rest = argv[2], argv[3:]
        parser = module_parser(module + ".__main__" if module in ("server", "client", "estimator") else module)
    elif argv[0] == "fedent":
        module, rest, parser = "fedent", argv[1:], fedent_parser(argv[1])
    else:
        raise AssertionError(f"unexpected command {argv}")

    def fail(message: str) -> None:
        raise ParseError(f"{module}: {message}")

    parser.error = fail  # type: ignore[method-assign]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for sp in getattr(action, "choices", {}).values():
            sp.error = fail
    return module, parser.parse_args(rest)
