"""`make run` / `make test` on a bare machine: the setup installs the system packages it needs when it may,
and otherwise stops with one line naming the exact command (tools/ensure_system_deps.sh). Nothing here
installs or removes a real package: the missing path is fake, and so are apt-get and sudo."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "ensure_system_deps.sh"


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, cwd=ROOT)


NO_RIGHTS = {"FEDENT_EUID": "1000", "FEDENT_SUDO": "/nonexistent/sudo"}


def test_missing_data_without_rights_is_one_line_with_the_command(tmp_path: Path) -> None:
    r = _run([str(tmp_path / "fashion-mnist"), "dataset-fashion-mnist", "the offline Fashion-MNIST copy"], **NO_RIGHTS)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"missing the offline Fashion-MNIST copy ({tmp_path / 'fashion-mnist'}); "
                                             "install it with: sudo apt-get install -y dataset-fashion-mnist"]


def test_present_data_is_a_no_op(tmp_path: Path) -> None:
    r = _run([str(tmp_path), "dataset-fashion-mnist"], **NO_RIGHTS)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_root_installs_the_package(tmp_path: Path) -> None:
    target = tmp_path / "fashion-mnist"
    log = tmp_path / "apt.log"
    fake = tmp_path / "apt-get"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nmkdir -p {target}\n")
    fake.chmod(0o755)
    r = _run([str(target), "dataset-fashion-mnist"], FEDENT_EUID="0", FEDENT_APT_GET=str(fake))
    assert r.returncode == 0, r.stderr
    assert log.read_text().split() == ["install", "-y", "-q", "dataset-fashion-mnist"] and target.is_dir()


def test_optional_browser_skips_with_a_note(tmp_path: Path) -> None:
    r = _run(["--optional", str(tmp_path / "chromium"), "chromium", "Chromium"], **NO_RIGHTS)
    assert r.returncode == 0 and len(r.stderr.strip().splitlines()) == 1
    assert "sudo apt-get install -y chromium" in r.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_stops_before_any_work_when_data_is_missing(tmp_path: Path) -> None:
    """The Makefile's run/test/simulate/reproduce targets depend on `data`, checked before the venv is built."""
    missing = tmp_path / "fashion-mnist"
    env = {**os.environ, **NO_RIGHTS}
    for target in ("run", "test"):
        r = subprocess.run(["make", "-s", "-n", target], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert r.stdout.splitlines()[0].startswith("tools/ensure_system_deps.sh "), (target, r.stdout)
    r = subprocess.run(["make", "-s", "data", f"DATA_DIR={missing}"], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=60)
    assert r.returncode != 0
    assert r.stderr.splitlines()[0] == (f"missing the offline Fashion-MNIST copy ({missing}); "
                                        "install it with: sudo apt-get install -y dataset-fashion-mnist")


def test_ci_installs_through_the_same_targets() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make data browser" in ci and "make test" in ci


def test_off_debian_the_line_says_what_to_do_there_not_apt(tmp_path: Path) -> None:
    """No apt-get (macOS, Fedora, ...): the one line names the other way instead of an apt command."""
    missing = tmp_path / "fashion-mnist"
    r = _run([str(missing), "dataset-fashion-mnist", "the copy", "put the files in DIR"],
             FEDENT_APT_GET="/nonexistent/apt-get", **NO_RIGHTS)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"missing the copy ({missing}); not a Debian/Ubuntu system (no /nonexistent/apt-get): put the files in DIR"]
    r = _run(["--optional", str(missing), "chromium", "Chromium", "use your package manager"],
             FEDENT_APT_GET="/nonexistent/apt-get", **NO_RIGHTS)
    assert r.returncode == 0 and "no /nonexistent/apt-get): use your package manager" in r.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_off_debian_points_at_data_dir_and_passes_it_as_data_root(tmp_path: Path) -> None:
    missing = tmp_path / "fm"
    env = {**os.environ, **NO_RIGHTS, "FEDENT_APT_GET": "/nonexistent/apt-get"}
    r = subprocess.run(["make", "-s", "data", f"DATA_DIR={missing}"], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=60)
    assert r.returncode != 0 and "not a Debian/Ubuntu system" in r.stderr
    assert "make run DATA_DIR=/that/directory" in r.stderr and "apt-get install" not in r.stderr
    for target in ("run", "simulate"):
        r = subprocess.run(["make", "-s", "-n", target, f"DATA_DIR={tmp_path}"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
        assert f"--set data.root={tmp_path}" in r.stdout.splitlines()[-1], r.stdout
    r = subprocess.run(["make", "-s", "-n", "run"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "data.root" not in r.stdout  # the OS copy: nothing to pass
