"""The core package must import without grpc, protobuf or fastapi (the simulator needs none of them)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import fedent

FORBIDDEN = ("grpc", "google.protobuf", "fastapi", "uvicorn", "starlette", "fedentrpc", "server", "client", "estimator")


def _core_modules() -> list[str]:
    root = Path(fedent.__file__).parent
    return sorted(m.name for m in pkgutil.walk_packages([str(root)], prefix="fedent."))


def test_core_has_modules() -> None:
    mods = _core_modules()
    assert "fedent.strategies.base" in mods and "fedent.config" in mods


def test_core_imports_without_service_packages() -> None:
    """Import every fedent module in a fresh interpreter and check no forbidden package got loaded."""
    code = (
        "import importlib, json, sys\n"
        f"mods, forbidden = json.loads({json.dumps([_core_modules(), list(FORBIDDEN)])!r})\n"
        "for m in mods:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(k for k in sys.modules if any(k == f or k.startswith(f + '.') for f in forbidden))\n"
        "print('BAD', bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_purity_check_can_fail() -> None:
    """The same probe flags a module that does import grpc (so the test above is not vacuous)."""
    code = "import sys, grpc\nsys.exit(1 if 'grpc' in sys.modules else 0)\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
