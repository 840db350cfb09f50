"""SIGTERM handled as SIGINT is: a batch system's timeout, ``kill``, SLURM and Kubernetes stop a run the way
Ctrl-C does, so the round engine writes status.json ``stopped`` with the reason (issue 27: a killed simulator
run stayed ``aggregating`` forever, shown live on the dashboard) and the command can resume from its last
checkpoint.

``Stopped`` is a ``KeyboardInterrupt``, so every ``except KeyboardInterrupt`` treats both signals alike.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    """The process got SIGTERM or SIGINT; ``signame`` says which."""

    def __init__(self, signame: str = "SIGINT") -> None:
        super().__init__(signame)
        self.signame = signame

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signame, signal.SIGINT))


def stop_reason(e: BaseException) -> str:
    """``stopped by SIGTERM`` / ``stopped by SIGINT`` (a plain KeyboardInterrupt is Ctrl-C)."""
    return f"stopped by {e.signame if isinstance(e, Stopped) else 'SIGINT'}"


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block SIGTERM and SIGINT raise ``Stopped`` in the main thread; the old handlers after it.
    Off the main thread (where handlers cannot be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
