"""Fail (exit 1) when the committed generated code in fedentrpc/ is stale.

Regenerates every proto/fedentrpc/v1/*.proto into a temporary directory with the same protoc command
as ``make proto`` and compares file by file, so a .proto edit without ``make proto`` cannot slip in.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Run grpc_tools.protoc in-process; returns the generated files relative to out_dir."""
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(proto_dir)) for p in (proto_dir / "fedentrpc" / "v1").glob("*.proto"))
    if not sources:
        raise SystemExit("check_proto: no .proto files under proto/fedentrpc/v1")
    # the well-known types (google/protobuf/struct.proto) ship with grpc_tools; `python -m grpc_tools.protoc`
    # (make proto) appends the same include directory
    wkt = Path(protoc.__file__).resolve().parent / "_proto"
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
            f"--pyi_out={out_dir}", *sources, f"-I{wkt}"]
    import os

    cwd = os.getcwd()
    os.chdir(proto_dir)  # protoc resolves the relative source names against -I; cwd keeps errors short
    try:
        rc = protoc.main(args)
    finally:
        os.chdir(cwd)
    if rc != 0:
        raise SystemExit(f"check_proto: protoc failed with exit code {rc}")
    return sorted(p.relative_to(out_dir) for p in out_dir.rglob("*") if p.name.endswith(SUFFIXES))


def main(root: Path = ROOT) -> int:
    """0 when ``root``/fedentrpc holds exactly what ``root``/proto generates, else 1 with a one-line reason."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp), root / "proto")
        committed = sorted(
            p.relative_to(root) for p in (root / "fedentrpc").rglob("*") if p.name.endswith(SUFFIXES)
        )
        problems = []
        for rel in sorted(set(fresh) - set(committed)):
            problems.append(f"missing: {rel}")
        for rel in sorted(set(committed) - set(fresh)):
            problems.append(f"no longer generated (stale): {rel}")
        for rel in sorted(set(fresh) & set(committed)):
            if (Path(tmp) / rel).read_bytes() != (root / rel).read_bytes():
                problems.append(f"differs: {rel}")
    if problems:
        print("check_proto: generated code in fedentrpc/ is out of date with proto/ "
              f"({'; '.join(problems)}); run `make proto` and commit", file=sys.stderr)
        return 1
    print(f"check_proto: {len(fresh)} generated files up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
