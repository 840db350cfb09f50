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


def _extra(name: str) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {}
    for item in project["optional-dependencies"][name]:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(?:>=|==)\s*([0-9.]+)", item)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_extras_split_the_core_from_the_services_and_dev_keeps_everything() -> None:
    """The core (the simulator) installs without grpc, protobuf, fastapi; [cluster] and [dashboard] bring the
    services' dependencies and [dev] (what make setup installs) takes both, so make run/test are unchanged."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, _ = _deps()
    assert not {"grpcio", "protobuf", "fastapi", "uvicorn", "pydantic"} & set(runtime)
    # the simulator runs secure aggregation (fedent/secagg: cryptography) and DP accounting (dp-accounting)
    assert {"torch", "numpy", "pyyaml", "matplotlib", "cryptography", "dp-accounting"} <= set(runtime)
    cluster = set(_extra("cluster"))
    assert {"grpcio", "grpcio-health-checking", "grpcio-reflection", "protobuf", "cryptography"} <= cluster
    assert {"fastapi", "uvicorn", "pydantic"} <= set(_extra("dashboard"))
    assert "fedent[cluster,dashboard]" in project["optional-dependencies"]["dev"]
    assert "'.[dev]'" in (ROOT / "Makefile").read_text()
    assert 'install ".[cluster,dashboard]"' in (ROOT / "Dockerfile").read_text()


def test_lower_bounds_are_what_the_generated_code_requires() -> None:
    runtime = _extra("cluster")
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


def _installed_venv(tmp_path: Path) -> Path:
    """A fresh venv with the project installed from its wheel (not the editable checkout); the heavy
    dependencies (torch, grpc, ...) come from this interpreter's site-packages through a .pth file."""
    import shutil
    import subprocess
    import sys
    import sysconfig

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("fedent", "fedentrpc", "server", "client", "estimator"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(src)], check=True, timeout=300)
    (wheel,) = wheels.glob("fedent-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, timeout=300)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_cluster_up_runs_from_a_directory_outside_the_repository(tmp_path: Path) -> None:
    """`fedent cluster up` with the default relative run directory, from an unrelated directory, with the
    installed package: every path is resolved before the children (which start in the package's directory)
    get it, so they find the run's PKI and state where the command said."""
    import os
    import subprocess

    if not Path("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz").exists():
        pytest.skip("needs dataset-fashion-mnist (make data)")
    venv = _installed_venv(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import server, fedent; print(server.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), f"imported the checkout, not the wheel: {where}"
    config = str(ROOT / "configs" / "demo.yaml")
    res = subprocess.run([str(venv / "bin" / "fedent"), "cluster", "up", "--config", config,
                          "--workers", "2", "--exit-when-done", "--set", "train.rounds=1"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    finals = list((elsewhere / "runs").glob("*/model_final.pt"))
    assert len(finals) == 1, "the run directory is relative to where the command ran"
    assert (finals[0].parent / "pki" / "server.crt").is_file()


def test_the_core_data_files_are_package_data() -> None:
    """fedent/phi2_style.json (the φ2 series' style, read by fedent plot and embedded by the dashboard) and any other
    data file of the core are in pyproject's package data, so an installed wheel has them as the checkout does."""
    import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["fedent"]
    core = ROOT / "fedent"
    data = [p.relative_to(core).as_posix() for p in core.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert "phi2_style.json" in data
    for f in data:  # setuptools globs: "*" stays within one path segment
        parts = f.split("/")
        assert any(len(g.split("/")) == len(parts) and all(map(fnmatch.fnmatchcase, parts, g.split("/")))
                   for g in globs), f


def test_licence_metadata_and_a_bounded_protobuf() -> None:
    """The wheel says its licence (the LICENSE file's, Apache-2.0) and keeps protobuf below the next major
    version, which generated code of this major refuses at import."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert project["license-files"] == ["LICENSE"]
    (protobuf,) = [d for d in project["optional-dependencies"]["cluster"]
                   if d.split(">")[0].split("<")[0].strip() == "protobuf"]
    assert "<8" in protobuf.replace(" ", "")


@pytest.mark.slow
def test_an_installed_fedent_has_its_configs_and_makes_a_project_that_runs(tmp_path: Path) -> None:
    """From the wheel, in a directory with no repository: --config demo finds the packaged config, and
    `fedent new proj` + `fedent simulate --config config.yaml` in proj trains with the project's plug-ins."""
    import os
    import subprocess

    if not Path("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz").exists():
        pytest.skip("needs dataset-fashion-mnist (make data)")
    venv = _installed_venv(tmp_path)
    fedent = str(venv / "bin" / "fedent")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    small = ["--set", "train.rounds=1", "--set", "data.max_train_samples=600", "--set", "data.max_test_samples=200",
             "--no-plots", "--no-progress", "--device", "cpu"]
    res = subprocess.run([fedent, "simulate", "--config", "demo", *small], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(list((elsewhere / "runs").glob("demo-*/model_final.pt"))) == 1
    res = subprocess.run([fedent, "new", "proj"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    proj = elsewhere / "proj"
    res = subprocess.run([fedent, "simulate", "--config", "config.yaml", *small], cwd=proj, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (run,) = (proj / "runs").iterdir()
    assert '"algorithm":"my-fedavg"' in (run / "metrics.jsonl").read_text()


def test_grpcio_tools_is_pinned_to_the_version_that_generated_the_checked_in_code() -> None:
    """make proto-check regenerates fedentrpc/v1 and compares bytes; the grpc stubs carry the generator's version,
    so any other grpcio-tools (a newer one on the index) fails it on a fresh machine: the dev extra pins it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [d for d in project["optional-dependencies"]["dev"] if d.startswith("grpcio-tools")]
    stub = (ROOT / "fedentrpc" / "v1" / "aggregator_pb2_grpc.py").read_text()
    generated = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", stub)
    assert generated is not None and pins == [f"grpcio-tools=={generated.group(1)}"]
