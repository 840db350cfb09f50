"""tools/check_proto.py: the committed generated code matches the .proto files, and drift is caught."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("check_proto", REPO / "tools" / "check_proto.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "proto", tmp_path / "proto")
    shutil.copytree(REPO / "fedentrpc", tmp_path / "fedentrpc", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_committed_generated_code_is_fresh() -> None:
    assert _tool().main() == 0


def test_an_edited_proto_without_regeneration_fails(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = copy / "proto" / "fedentrpc" / "v1" / "tensor.proto"
    text = p.read_text()
    assert "message Ack {\n  bool ok = 1;" in text
    p.write_text(text.replace("message Ack {\n  bool ok = 1;", "message Ack {\n  bool ok = 1;\n  int32 n = 9;"))
    assert _tool().main(copy) == 1
    err = capsys.readouterr().err
    assert "differs: fedentrpc/v1/tensor_pb2.py" in err and "make proto" in err


def test_a_deleted_generated_file_fails(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (copy / "fedentrpc" / "v1" / "estimator_pb2_grpc.py").unlink()
    assert _tool().main(copy) == 1
    assert "missing: fedentrpc/v1/estimator_pb2_grpc.py" in capsys.readouterr().err


def test_the_fresh_copy_passes(copy: Path) -> None:
    assert _tool().main(copy) == 0
