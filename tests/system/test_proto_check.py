"""tools/check_proto.py: the committed generated code matches the .proto files, and drift is caught."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
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
    old = "message ScalarMap {\n  map<string, double> values = 1;"
    assert old in text
    p.write_text(text.replace(old, old + "\n  int32 n = 9;"))
    assert _tool().main(copy) == 1
    err = capsys.readouterr().err
    assert "differs: fedentrpc/v1/tensor_pb2.py" in err and "make proto" in err


def test_a_deleted_generated_file_fails(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (copy / "fedentrpc" / "v1" / "estimator_pb2_grpc.py").unlink()
    assert _tool().main(copy) == 1
    assert "missing: fedentrpc/v1/estimator_pb2_grpc.py" in capsys.readouterr().err


def test_the_fresh_copy_passes(copy: Path) -> None:
    assert _tool().main(copy) == 0


# ---- proto lint: buf's STANDARD rules (buf.yaml), as `make lint` runs them ------------------------------

BAD_PROTO = """syntax = "proto3";
package bad.v1;
service Things { rpc Get(Thing) returns (Ack); rpc Put(Thing) returns (Ack); }
enum State { RUNNING = 0; DONE = 1; }
message Thing { string state = 1; }
message Ack { bool ok = 1; }
"""


def _proto_lint(input_dir: Path) -> subprocess.CompletedProcess[str]:
    """``make proto-lint`` on ``input_dir`` (installs the pinned buf from npm into .tools/ the first time)."""
    if shutil.which("npm") is None or shutil.which("make") is None:
        pytest.skip("npm (or make) is not installed; CI has both")
    return subprocess.run(["make", "-s", "proto-lint", f"BUF_INPUT={input_dir}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_the_protos_pass_bufs_standard_lint() -> None:
    r = _proto_lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_proto_lint_fails_on_a_violation(tmp_path: Path) -> None:
    """The same lint with the repo's buf.yaml on a deliberately bad proto: make proto-lint fails, naming the
    rules (so `make lint` cannot pass a shared Ack, a non-Request name or an enum without _UNSPECIFIED)."""
    shutil.copy(REPO / "buf.yaml", tmp_path / "buf.yaml")
    (tmp_path / "proto" / "bad" / "v1").mkdir(parents=True)
    (tmp_path / "proto" / "bad" / "v1" / "bad.proto").write_text(BAD_PROTO)
    r = _proto_lint(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    for rule in ("SERVICE_SUFFIX", "RPC_REQUEST_STANDARD_NAME", "RPC_RESPONSE_STANDARD_NAME",
                 "RPC_REQUEST_RESPONSE_UNIQUE", "ENUM_ZERO_VALUE_SUFFIX", "ENUM_VALUE_PREFIX"):
        assert rule in out, (rule, out)
