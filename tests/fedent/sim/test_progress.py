"""Progress inside a round (issue 27: a first research command was silent for 200 s): clients done / total on the
bar on a terminal, plain throttled lines elsewhere; notes (the start banner, the estimate) as lines of their own."""

from __future__ import annotations

import io

from fedent.sim.progress import ProgressBar


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_clients_are_plain_lines_throttled() -> None:
    out, err = io.StringIO(), io.StringIO()
    bar = ProgressBar(3, stream=err, lines=out, client_every_s=0.0)
    bar.note("fedent simulate: banner")
    bar.client(1, 5)
    bar.client(2, 5)
    bar.update(1, 0.5)
    bar.client(4, 5)
    lines = out.getvalue().splitlines()
    assert lines[0] == "fedent simulate: banner"
    assert lines[1].startswith("round 1/3: clients 1/5 elapsed") and lines[2].startswith("round 1/3: clients 2/5")
    assert lines[3].startswith("round 1/3 acc 0.5000") and lines[4].startswith("round 2/3: clients 4/5")
    assert "\x1b" not in out.getvalue() and err.getvalue() == ""
    quiet = ProgressBar(3, stream=err, lines=(q := io.StringIO()))  # default: at most one line per 10 s
    quiet.client(1, 5)
    assert q.getvalue() == ""


def test_on_a_terminal_the_bar_counts_clients_and_notes_go_above_it() -> None:
    out, err = Tty(), Tty()
    bar = ProgressBar(3, stream=err, lines=out)
    bar.client(2, 5)
    assert "round 1: clients 2/5" in err.getvalue().rsplit("\r", 1)[-1]
    bar.note("round 1 took 3s; estimated 6s for the 2 round(s) left")
    assert out.getvalue() == "round 1 took 3s; estimated 6s for the 2 round(s) left\n"
    assert err.getvalue().endswith("\r\x1b[2K")  # the bar was cleared first
