"""A child process that ends when the process that started it dies, however it dies (SIGKILL included).

The parent (``fedent cluster up``) makes a pipe, keeps the write end and hands the read end to each child
(``pass_fds``), naming it in the ``FEDENT_LIFELINE_FD`` environment variable. Nothing is ever written: the
kernel closes the write end when the parent exits for any reason, the child's blocking read returns EOF,
and the child stops itself with SIGTERM (its own clean shutdown), then exits hard after a grace period.

Why a pipe and not ``prctl(PR_SET_PDEATHSIG)``: PDEATHSIG needs a ``preexec_fn``, which CPython documents
as unsafe (it may deadlock) in a process with threads, and the launcher has gRPC and dashboard threads
when it starts the workers; it fires when the *thread* that forked exits, not the process; a parent that
dies before the child's ``prctl`` is missed; and it is Linux-only. The pipe is inherited at fork, so there
is no window (a parent already dead reads as EOF at once), and it works on every POSIX system.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import MutableMapping

ENV = "FEDENT_LIFELINE_FD"

log = logging.getLogger("fedent.lifeline")


def watch_parent(grace_s: float = 5.0, environ: MutableMapping[str, str] | None = None) -> bool:
    """Start watching the lifeline named in the environment (removed from it, so this process's own children
    do not look for it); False when there is none. Call it early in ``main``."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    text = env.pop(ENV, "")
    if not text:
        return False
    try:
        fd = int(text)
        os.fstat(fd)
    except (ValueError, OSError):
        log.warning("ignoring %s=%r: not an open file descriptor", ENV, text)
        return False
    threading.Thread(target=_watch, args=(fd, grace_s), name="lifeline", daemon=True).start()
    return True


def _watch(fd: int, grace_s: float) -> None:
    try:
        while os.read(fd, 1):  # never written to: returns b"" once every write end is closed
            pass
    except OSError:
        pass
    log.warning("the launcher that started this process is gone; stopping")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(1)
