"""Where and with what a run was trained: commit, machine, GPU, library versions (issue 29, item 5).

Written once per run as ``provenance.json`` beside config.yaml so every published number can be traced to the
code and hardware that produced it; the generated reports print it. A run resumed from a checkpoint (a killed
process, a GPU call that ran out of time, another machine) keeps, under ``earlier``, the provenance of each process
that trained the rounds it kept (``resumed``), so a run trained partly at another commit or on another card says
which rounds ran where. Nothing here may fail a run: each field that
cannot be read is recorded as ``"unknown"`` together with the reason, never silently left out.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

COMMIT_ENV = "FEDENT_COMMIT"


def git_commit(cwd: str | Path | None = None) -> dict[str, Any]:
    """The commit of the code that runs (the package's own checkout), with whether the tree had local edits;
    outside a checkout, ``$FEDENT_COMMIT`` when the copy's maker set it, else "unknown" with the reason; a dirty
    checkout whose maker set another commit records it too (``declared_commit``), beside git's own."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    given = os.environ.get(COMMIT_ENV, "").strip()
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": "unknown", "reason": f"git not runnable: {exc}"}
    if out.returncode != 0:
        if given:  # a copy of the tree without .git (a GPU machine, an image): the commit it was copied from
            return {"commit": given, "source": f"{COMMIT_ENV} (not a git checkout)", "dirty": None}
        return {"commit": "unknown", "reason": f"not a git checkout ({out.stderr.strip()[:200]})"}
    info: dict[str, Any] = {"commit": out.stdout.strip()}
    try:
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                            capture_output=True, text=True, timeout=10)
        info["dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        info["dirty"] = None
    if given and given != info["commit"] and info.get("dirty") is not False:
        # a copy that carries a stale .git (a GPU machine's copy of a checkout): what its maker says it is
        info["declared_commit"] = given
    return info


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        return {"torch": "unknown", "reason": str(exc)}
    info: dict[str, Any] = {"torch": str(torch.__version__), "cuda": str(torch.version.cuda or "none (CPU build)")}
    try:
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
        else:
            info["gpu"] = "none"
    except Exception as exc:  # noqa: BLE001 - a broken driver must not stop the run, it is recorded instead
        info["gpu"] = "unknown"
        info["gpu_reason"] = str(exc)[:200]
    return info


def collect(cwd: str | Path | None = None) -> dict[str, Any]:
    """Commit, host, CPU count, GPU, and python/torch/CUDA versions of this process, and when it started the run
    (``started_at``, epoch seconds: a resumed run's status.json holds only the last process's start, so the
    history under ``earlier`` is what says when its first rounds began, e.g. after a tuning that chose its values)."""
    return {
        **git_commit(cwd),
        "started_at": time.time(),
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        **_torch_info(),
    }


def resumed(saved: Mapping[str, Any] | None, current: Mapping[str, Any], kept: int,
            fallback: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """provenance.json of a run resumed after round ``kept`` (1-based: the checkpoint's last round): this process's
    fields at the top with ``from_round``, and under ``earlier`` the processes that trained rounds 1..kept, each
    with its ``rounds`` [first, last]. ``saved``: the provenance the checkpoint holds (its process's fields and its
    own ``earlier``), so the history is exactly the checkpoint's rounds even when newer checkpoints were lost. A
    checkpoint written before checkpoints held provenance has none: then ``fallback`` (the provenance.json the last
    process left) stands for rounds 1..kept with a note saying so, or, without one, an "unknown" entry."""
    if saved:
        earlier = [dict(e) for e in saved.get("earlier", [])]
        first = int(saved.get("from_round", 1))
        head = {k: v for k, v in saved.items() if k not in ("earlier", "from_round")}
    elif fallback and not fallback.get("earlier"):
        earlier, first = [], 1
        head = {**fallback, "note": "from provenance.json, the last process before this resume: its checkpoint "
                                    "predates provenance in checkpoints, so a process before it is not recorded"}
    else:
        earlier, first = [], 1
        head = {"commit": "unknown", "reason": "its checkpoint predates provenance in checkpoints"}
    if first <= kept:
        earlier.append({**head, "rounds": [first, kept]})
    return {**{k: v for k, v in current.items() if k not in ("earlier", "from_round")}, "from_round": kept + 1,
            "earlier": earlier}


def _one(p: Mapping[str, Any]) -> str:
    commit = str(p.get("commit", "unknown"))
    if commit == "unknown":
        commit = f"unknown ({p.get('reason', 'no reason given')})"
        if "hostname" not in p:  # nothing else was recorded: say no more than that
            return f"commit {commit}"
    elif p.get("dirty"):
        declared = f"; declared by its maker: {p['declared_commit']}" if p.get("declared_commit") else ""
        commit += f" (with uncommitted changes{declared})"
    return (f"commit {commit}; host {p.get('hostname')} ({p.get('machine')}, {p.get('cpu_count')} CPUs); "
            f"GPU {p.get('gpu')}; python {p.get('python')}, torch {p.get('torch')}, CUDA {p.get('cuda')}")


def describe(p: dict[str, Any] | None) -> str:
    """One line for a report; says plainly when a run has no provenance.json (older runs). A resumed run whose
    processes differ (commit, machine, GPU, versions) names each with its rounds, "|" between them; one resumed on
    the same commit and machine reads like a run that was never stopped."""
    if not p:
        return "not recorded (run written before provenance.json existed)"
    parts: list[tuple[int, str]] = []  # (first round, description), neighbours with one description merged
    for first, line in [*((int(e["rounds"][0]), _one(e)) for e in p.get("earlier") or ()),
                        (int(p.get("from_round", 1)), _one(p))]:
        if not parts or parts[-1][1] != line:
            parts.append((first, line))
    if len(parts) == 1:
        return parts[0][1]
    ends = [f"{a}–{b - 1}" for (a, _), (b, _) in zip(parts, parts[1:], strict=False)] + [f"{parts[-1][0]} on"]
    return " | ".join(f"rounds {r}: {line}" for r, (_, line) in zip(ends, parts, strict=True))
