"""A one-line progress bar on stderr (round, accuracy, ETA), silent when the stream is not a terminal.

Small on purpose: no tqdm dependency, and nothing printed into log files or CI output.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``."""
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


class ProgressBar:
    """``update(done, acc)`` redraws the line; ``close()`` ends it. ETA = mean round time x rounds left."""

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, enabled: bool = True,
                 width: int = 24) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(enabled and callable(isatty) and isatty())
        self.width = width
        self._start = time.perf_counter()
        self._drawn = False

    def line(self, done: int, acc: float | None, elapsed: float) -> str:
        """The text of the bar (separate from drawing so it can be tested without a terminal)."""
        frac = min(max(done / self.total, 0.0), 1.0)
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        acc_txt = f"acc {acc:.4f}" if acc is not None else "acc   -   "
        eta = elapsed / done * (self.total - done) if done else None
        eta_txt = f"ETA {format_duration(eta)}" if eta is not None else "ETA ?"
        prefix = f"{self.label} " if self.label else ""
        return f"{prefix}[{bar}] round {done}/{self.total} {acc_txt} {eta_txt}"

    def update(self, done: int, acc: float | None = None) -> None:
        if not self.enabled:
            return
        text = self.line(done, acc, time.perf_counter() - self._start)
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
