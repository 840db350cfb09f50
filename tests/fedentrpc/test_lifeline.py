"""A child started with a lifeline stops when every write end closes (its parent died), even if it ignores SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedentrpc import lifeline

REPO = Path(__file__).resolve().parents[2]


def _child(code: str) -> tuple[subprocess.Popen[bytes], int]:
    r, w = os.pipe()
    env = {**os.environ, lifeline.ENV: str(r), "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=(r,), stdout=subprocess.PIPE)
    os.close(r)
    return p, w


@pytest.mark.skipif(os.name != "posix", reason="pass_fds is POSIX")
def test_child_is_terminated_when_the_write_end_closes() -> None:
    p, w = _child("from fedentrpc.lifeline import watch_parent\nimport os, time\n"
                  f"print(watch_parent(), os.environ.get({lifeline.ENV!r}), flush=True)\ntime.sleep(60)\n")
    assert p.stdout is not None
    assert p.stdout.readline().split() == [b"True", b"None"]  # watching, and the variable is not passed on
    assert p.poll() is None
    os.close(w)  # what the kernel does when the parent dies, SIGKILL included
    assert p.wait(10) == -15  # its own SIGTERM, so a service's clean shutdown runs


@pytest.mark.skipif(os.name != "posix", reason="pass_fds is POSIX")
def test_child_that_ignores_sigterm_exits_after_the_grace_period() -> None:
    p, w = _child("from fedentrpc.lifeline import watch_parent\nimport signal, time\n"
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwatch_parent(grace_s=0.5)\n"
                  "print('up', flush=True)\ntime.sleep(60)\n")
    assert p.stdout is not None and p.stdout.readline() == b"up\n"
    os.close(w)
    assert p.wait(10) == 1


def test_no_or_bad_lifeline_is_not_watched() -> None:
    assert lifeline.watch_parent(environ={}) is False
    assert lifeline.watch_parent(environ={lifeline.ENV: "not-a-number"}) is False
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    assert lifeline.watch_parent(environ={lifeline.ENV: str(r)}) is False  # a closed descriptor
