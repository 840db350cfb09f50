"""Progress of a run: a redrawn one-line bar on a terminal, one plain line per round elsewhere.

On a terminal (stderr and stdout both TTYs) the bar is redrawn in place on stderr. Where there is no
terminal (batch jobs, ``nohup``, CI, ``| tee``), control characters would litter the log, so each round
prints one plain line on stdout instead (``round 3/20 acc 0.8123 elapsed 41s ETA 3m05s``). Small on
purpose: no tqdm dependency.
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


def _isatty(stream: TextIO | None) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(callable(isatty) and isatty())
    except ValueError:  # a closed stream
        return False


class ProgressBar:
    """``update(done, acc)`` redraws the bar or prints a line; ``close()`` ends it. ETA = mean round time x left.

    ``stream`` is where the bar is drawn (stderr), ``lines`` where plain lines go (stdout). ``bar=False``
    keeps the terminal quiet but still prints the plain lines where there is no terminal (parallel runs,
    whose bars would overwrite each other).
    """

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, enabled: bool = True,
                 width: int = 24, lines: TextIO | None = None, bar: bool = True, client_every_s: float = 10.0) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.lines = lines if lines is not None else sys.stdout
        terminal = _isatty(self.stream) and _isatty(self.lines)
        self.enabled = bool(enabled and bar and terminal)  # draws the bar
        self.plain = bool(enabled and not terminal)  # prints a line per round
        self.width = width
        self._start = time.perf_counter()
        self._drawn = False
        self._done = 0  # rounds done so far (the bar's position while a round runs)
        self.client_every_s = client_every_s  # off a terminal: at most one in-round line this often
        self._last_line = self._start

    def plain_line(self, done: int, acc: float | None, elapsed: float) -> str:
        """One round's line where there is no terminal: no control characters, complete by itself."""
        acc_txt = f"acc {acc:.4f}" if acc is not None else "acc -"
        eta = format_duration(elapsed / done * (self.total - done)) if done else "?"
        prefix = f"{self.label}: " if self.label else ""
        return f"{prefix}round {done}/{self.total} {acc_txt} elapsed {format_duration(elapsed)} ETA {eta}"

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

    def note(self, text: str, always: bool = False) -> None:
        """A line of its own (the start banner, the first estimate): on stdout, above the bar on a terminal;
        ``always``: also with progress off."""
        if not (self.enabled or self.plain or always):
            return
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._drawn = False
        self.lines.write(text + "\n")
        self.lines.flush()

    def client(self, done: int, total: int) -> None:
        """Progress inside the round in progress: ``clients done/total``. On a terminal the bar shows it; elsewhere
        a plain line, at most one per ``client_every_s`` (a long round is not silent, a short one not noisy)."""
        now = time.perf_counter()
        current = min(self._done + 1, self.total)
        if self.plain:
            if now - self._last_line >= self.client_every_s:
                prefix = f"{self.label}: " if self.label else ""
                self.lines.write(f"{prefix}round {current}/{self.total}: clients {done}/{total} "
                                 f"elapsed {format_duration(now - self._start)}\n")
                self.lines.flush()
                self._last_line = now
            return
        if not self.enabled:
            return
        text = self.line(self._done, None, now - self._start) + f" | round {current}: clients {done}/{total}"
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()
        self._drawn = True

    def update(self, done: int, acc: float | None = None) -> None:
        self._done = done
        self._last_line = time.perf_counter()
        if self.plain:
            self.lines.write(self.plain_line(done, acc, time.perf_counter() - self._start) + "\n")
            self.lines.flush()
            return
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
