"""``fedent new DIR``: a starter project a newcomer can run at once and then change.

It writes, from the package's own data (``fedent/starter/``, so a pip-installed fedent has it without the
repository): ``config.yaml`` (a small Fashion-MNIST run naming the two plug-ins by import path),
``my_model.py`` (a model plug-in), ``my_strategy.py`` (a strategy plug-in with typed options) and a
``README.md``. ``fedent simulate --config config.yaml`` run in DIR trains it: import paths are looked up in
the current directory as ``python -m`` would (fedent.plugins). An existing non-empty DIR is refused, so
nothing of the user's is overwritten.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from fedent.config import ConfigError

HELP = "make a starter project (config, model and strategy plug-ins, README) that fedent simulate runs"
FILES = ("config.yaml", "my_model.py", "my_strategy.py", "README.md")


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("new", help=HELP, description=HELP + ". Then: cd DIR && fedent simulate --config "
                              "config.yaml")
    p.add_argument("dir", metavar="DIR", help="the project directory to make (must not exist or be empty)")


def write_project(target: Path) -> list[Path]:
    """The starter files written into ``target`` (made if missing); refuses a non-empty directory."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"DIR: {target} exists and is not an empty directory; choose a new one")
    target.mkdir(parents=True, exist_ok=True)
    src = resources.files("fedent").joinpath("starter")
    written = []
    for name in FILES:
        out = target / name
        out.write_text(src.joinpath(name).read_text(encoding="utf-8"), encoding="utf-8")
        written.append(out)
    return written


def run(args: argparse.Namespace) -> int:
    target = Path(args.dir)
    written = write_project(target)
    print(f"fedent new: made {target} ({', '.join(p.name for p in written)})")
    print(f"next: cd {target} && fedent simulate --config config.yaml")
    return 0
