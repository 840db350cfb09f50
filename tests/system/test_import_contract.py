"""The import contract between the packages (docs/architecture.md), checked statically on every source file.

Allowed arrows: services (server, client, estimator) -> transport (fedentrpc) -> core (fedent), and
services -> core. Never one service -> another, the transport -> a service, or the core -> anything of
the cluster. Every ``import`` / ``from ... import`` counts, at module level or inside a function, relative
imports resolved. (Subprocesses started by module name, e.g. ``python -m client``, are not imports.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The simulator, the experiments and the CLI commands are the core's own programs: no service runs them.
EXPERIMENTS = ("fedent.sim", "fedent.experiments", "fedent.commands", "fedent.cli")
# package -> what it must never import (a name forbids itself and everything below it)
FORBIDDEN: Mapping[str, tuple[str, ...]] = {
    "fedent": ("fedentrpc", "server", "client", "estimator", "grpc", "google.protobuf", "fastapi"),
    "fedentrpc": ("server", "client", "estimator", *EXPERIMENTS),
    "server": ("client", "estimator", *EXPERIMENTS),
    "client": ("server", "estimator", *EXPERIMENTS),
    "estimator": ("server", "client", *EXPERIMENTS),
}


class Violation(NamedTuple):
    path: str  # relative to the tree's root, with forward slashes
    line: int
    imported: str  # the module the statement imports
    forbidden: str  # the rule it breaks


def _imported_names(node: ast.Import | ast.ImportFrom, package: tuple[str, ...]) -> Iterator[str]:
    """Every module a statement may bring in: ``from a import b`` yields ``a`` and ``a.b`` (b may be a module)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = list(package[: len(package) - node.level + 1]) if node.level else []
    module = ".".join([*base, *(node.module.split(".") if node.module else [])])
    if module:
        yield module
    for alias in node.names:
        if alias.name != "*":
            yield f"{module}.{alias.name}" if module else alias.name


def _matches(name: str, rule: str) -> bool:
    return name == rule or name.startswith(rule + ".")


def check_imports(root: Path, forbidden: Mapping[str, tuple[str, ...]] = FORBIDDEN) -> list[Violation]:
    """All violations of ``forbidden`` under ``root``; a missing or empty package directory is an error."""
    found: list[Violation] = []
    for pkg, rules in forbidden.items():
        pkg_dir = root / pkg
        if not pkg_dir.is_dir():
            raise FileNotFoundError(f"package directory {pkg_dir} is missing: the contract cannot be checked")
        files = sorted(pkg_dir.rglob("*.py"))
        if not files:
            raise FileNotFoundError(f"package directory {pkg_dir} has no .py files")
        for path in files:
            rel = path.relative_to(root)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):  # walks into functions, classes and conditionals too
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                for name in dict.fromkeys(_imported_names(node, rel.parent.parts)):
                    for rule in rules:
                        if _matches(name, rule):
                            found.append(Violation(rel.as_posix(), node.lineno, name, rule))
                            break
                    else:
                        continue
                    break  # one report per statement: "from server import security" is one violation
    return found


def test_packages_respect_the_import_contract() -> None:
    violations = check_imports(ROOT)
    assert not violations, "forbidden imports:\n" + "\n".join(
        f"  {v.path}:{v.line}: imports {v.imported} (rule: {v.path.split('/')[0]} must not import {v.forbidden})"
        for v in violations)


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for pkg in FORBIDDEN:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_checker_reports_a_service_importing_another(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"client/x.py": "from server.security import y\n"})
    assert check_imports(root) == [Violation("client/x.py", 1, "server.security", "server")]


def test_checker_sees_function_level_relative_and_submodule_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "estimator/a.py": "import os\n\n\ndef f():\n    import client.worker\n",
        "fedentrpc/sub/b.py": "from .. import server\nfrom . import c\nfrom fedent import config\nimport server\n",
        "fedent/c.py": "from google import protobuf\nimport grpc_health\nfrom fedent.x import grpc\n",
        "server/d.py": "from fedentrpc.security import tls\nfrom estimator.service import *\n",
    })
    assert sorted(check_imports(root)) == sorted([
        Violation("estimator/a.py", 5, "client.worker", "client"),
        Violation("fedent/c.py", 1, "google.protobuf", "google.protobuf"),
        Violation("fedentrpc/sub/b.py", 4, "server", "server"),  # line 1 is fedentrpc.server: allowed
        Violation("server/d.py", 2, "estimator.service", "estimator"),
    ])


def test_checker_fails_when_a_package_is_missing(tmp_path: Path) -> None:
    root = _tree(tmp_path, {})
    (root / "estimator" / "__init__.py").unlink()
    (root / "estimator").rmdir()
    with pytest.raises(FileNotFoundError, match="estimator"):
        check_imports(root)
