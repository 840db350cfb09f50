"""Which recorded ``fedent reproduce`` calls trained the runs a report shows.

An output directory collects runs from many calls (rows added later, on another machine, or resumed), and
``command.json`` holds only the latest. A report that printed it as "the command" would credit every row to one
call, so the report's header names, per call kept in ``commands.jsonl`` (older directories: ``command.json``
only), the runs it started. A call records them itself (``started_runs``); for a call recorded before it did,
they are inferred: a call *started* a run when its selection (``--settings``, ``--rows``, ``--seeds``;
a flag left out selects everything) includes the run and one of the run's processes (provenance.json's
``started_at``, its ``earlier`` entries' for a resumed run) began while the call ran. A run without a recorded
start time is credited to every call whose selection includes it; a run no call can have started is listed as
such, so the reader goes to its own provenance line instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SELECTORS = ("--settings", "--rows", "--seeds")


def read_calls(out: Path) -> list[dict[str, Any]]:
    """Every call ``commands.jsonl`` kept, oldest first; without it, ``command.json`` alone; else none."""
    history = out / "commands.jsonl"
    if history.exists():
        return [json.loads(line) for line in history.read_text(encoding="utf-8").splitlines() if line.strip()]
    latest = out / "command.json"
    return [json.loads(latest.read_text(encoding="utf-8"))] if latest.exists() else []


def selection(argv: Sequence[str]) -> dict[str, set[str] | None]:
    """The call's ``--settings``/``--rows``/``--seeds`` values (``--x v`` or ``--x=v``); None: not given."""
    got: dict[str, set[str] | None] = dict.fromkeys(SELECTORS)
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in got:
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            got[flag] = {v for v in value.split(",") if v}
    return got


def _selects(sel: Mapping[str, set[str] | None], setting: str, row: str, seed: str) -> bool:
    return all(chosen is None or value in chosen
               for chosen, value in zip((sel[f] for f in SELECTORS), (setting, row, seed), strict=True))


def _starts(prov: Mapping[str, Any] | None) -> list[float] | None:
    """When each process of the run began, or None where any is not recorded."""
    if not prov:
        return None
    times = [p.get("started_at") for p in (*(prov.get("earlier") or ()), prov)]
    return [float(t) for t in times if t is not None] if all(t is not None for t in times) else None


def _split_key(key: str) -> tuple[str, str, str]:
    setting, _, rest = key.partition("/")
    row, _, seed = rest.rpartition("-s")
    return setting, row, seed


def credit(calls: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"calls": [{argv, workers, threads, commit, machine, started, runs: [keys]}], "unrecorded": [keys]}``:
    the calls that started at least one of ``runs`` (each ``{"key": "setting/row-sN", "provenance": ...}``), in
    the order they ran, and the runs none of them can have started."""
    credited: list[list[str]] = [[] for _ in calls]
    unrecorded: list[str] = []
    selections = [selection(call.get("argv") or ()) for call in calls]
    for run in runs:
        key = str(run["key"])
        setting, row, seed = _split_key(key)
        starts = _starts(run.get("provenance"))
        hit = False
        for i, call in enumerate(calls):
            if call.get("started_runs") is not None:  # the call's own record (a replay row's source run included)
                started = key in call["started_runs"]
            else:
                began = call.get("started")
                ended = math.inf if call.get("ended") is None else float(call["ended"])
                started = _selects(selections[i], setting, row, seed) and (
                    starts is None or began is None or any(began <= t <= ended for t in starts))
            if started:
                credited[i].append(key)
                hit = True
        if not hit:
            unrecorded.append(key)
    keep = ("argv", "workers", "threads", "commit", "machine", "started")
    return {"calls": [{**{k: call.get(k) for k in keep}, "runs": keys}
                      for call, keys in zip(calls, credited, strict=True) if keys],
            "unrecorded": unrecorded}
