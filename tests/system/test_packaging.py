"""Packaging facts: the dependency bounds are the ones the generated protocol code checks at import, and
grpcio-tools (only needed to regenerate that code) is a dev extra, not a runtime dependency."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[2]


def _deps() -> tuple[dict[str, str], dict[str, str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def parse(items: list[str]) -> dict[str, str]:
        out = {}
        for item in items:
            m = re.match(r"([A-Za-z0-9_.-]+)\s*(?:>=|==)\s*([0-9.]+)", item)
            if m:
                out[m.group(1).lower()] = m.group(2)
        return out

    return parse(project["dependencies"]), parse(project["optional-dependencies"]["dev"])


def test_lower_bounds_are_what_the_generated_code_requires() -> None:
    runtime, _ = _deps()
    grpc_stub = (ROOT / "fedentrpc" / "v1" / "aggregator_pb2_grpc.py").read_text()
    grpc_needed = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", grpc_stub)
    assert grpc_needed is not None
    pb = (ROOT / "fedentrpc" / "v1" / "tensor_pb2.py").read_text()
    guard = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)",
                      pb)
    assert guard is not None
    assert runtime["grpcio"] == grpc_needed.group(1)
    assert runtime["protobuf"] == ".".join(guard.groups())
    for extra in ("grpcio-health-checking", "grpcio-reflection"):
        assert tuple(map(int, runtime[extra].split("."))) >= tuple(map(int, grpc_needed.group(1).split(".")))


def test_grpcio_tools_is_a_dev_extra_only() -> None:
    runtime, dev = _deps()
    assert "grpcio-tools" not in runtime and "grpcio-tools" in dev
    users = [p for pkg in ("fedent", "fedentrpc", "server", "client", "estimator") for p in (ROOT / pkg).rglob("*.py")
             if "grpc_tools" in p.read_text()]
    assert users == []
