"""What an existing run directory allows, decided before anything is written to it.

Why this exists (hardening review, issue 15): a restart with every checkpoint corrupt silently began again
at round 0 and appended duplicate rows to metrics.jsonl; ``fedent cluster up --out`` on a finished
simulator run retrained it and overwrote its model; a finished cluster run restarted with another config
was refused only after its config.yaml, status.json and client counters had been overwritten. Each of
those is one read-only decision taken here, first:

* ``new``: nothing of a run is there (or ``fresh`` moved it aside to ``DIR.old-<UTC time>``);
* ``resume``: a checkpoint of this config is intact;
* ``finished``: status.json says ``done`` and model_final.pt exists: report it, touch nothing;
* refused (:class:`RunDirError`, one line): another kind of run (simulator vs cluster), another config,
  checkpoints none of which is intact, or logged rounds past round 0 with no checkpoint at all.

A run that logged at most round 0 and has no checkpoint file is what a crash before the first checkpoint
leaves behind; it starts again at round 0 (the engine cuts metrics.jsonl), which is the same computation.

One owner at a time (issue 25: a second aggregator on a live directory flipped its finished run to
``failed``; ``--fresh`` moved a live run away from its aggregator). :func:`lock_run_dir` takes the lock file
``.<name>.lock`` beside the directory (beside, so ``--fresh`` can move the run aside while holding it) before
any decision: it records the owner's pid, host and command, and holds an exclusive ``flock`` on it, which the
kernel drops however the owner dies. A second owner is refused in one line naming the first; a lock file that
no live process holds (its owner was killed) is taken over with a note. Re-entrant within one process: the
local launcher and its in-process aggregator are one owner.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedent import runlog
from fedent.checkpoint import CorruptStateError, config_fingerprint, list_checkpoints, load_checkpoint
from fedent.config import ConfigError, ExperimentConfig

SIMULATOR, CLUSTER = "simulator", "cluster"
# Files whose presence means a run was started here (pki/ or plots/ alone do not).
_RUN_FILES = ("config.yaml", "status.json", "metrics.jsonl", "model_final.pt", "checkpoint")


class RunDirError(ConfigError):
    """The run directory cannot be used as asked; nothing was written. One line, exit code 2."""


class RunFinished(Exception):  # noqa: N818 (not an error: the caller reports it and exits 0)
    """The run directory holds this run, finished; the message is the one-line summary."""


@dataclass(frozen=True)
class RunDirPlan:
    action: str  # "new" | "resume" | "finished"
    detail: str = ""  # resume: the checkpoint; finished: the summary
    moved_to: Path | None = None  # where ``fresh`` moved the previous run


def has_run(root: Path) -> bool:
    return any((root / name).exists() for name in _RUN_FILES)


def run_kind(paths: runlog.RunPaths) -> str | None:
    """``cluster`` or ``simulator``: status.json's ``state.mode`` (absent in a simulator's), else the
    checkpoint directory, which only the cluster aggregator writes; None when neither is there (a process
    killed between writing config.yaml and status.json: nothing ran yet)."""
    status = runlog.read_json(paths.status, default=None)
    if isinstance(status, dict):
        state = status.get("state")
        mode = state.get("mode") if isinstance(state, dict) else None
        return CLUSTER if mode == CLUSTER else SIMULATOR
    return CLUSTER if paths.checkpoint.exists() else None


def move_aside(root: Path, now: float | None = None) -> Path:
    """Rename ``root`` to ``root.old-<UTC time>`` (a free name), so a fresh run never mixes with it."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    target = root.with_name(f"{root.name}.old-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = root.with_name(f"{root.name}.old-{stamp}-{n}")
    root.rename(target)
    return target


def _saved_fingerprint(paths: runlog.RunPaths) -> str | None:
    try:
        raw = yaml.safe_load(paths.config.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RunDirError(f"{paths.config} is unreadable ({type(e).__name__}); refusing to overwrite it") from None
    return config_fingerprint(raw) if isinstance(raw, dict) else None


def _check_same_run(paths: runlog.RunPaths, cfg: ExperimentConfig, kind: str) -> None:
    found = run_kind(paths)
    if found is not None and found != kind:
        raise RunDirError(f"{paths.root} holds a {found} run; the {kind} does not resume or overwrite it "
                          "(choose another run directory)")
    if paths.config.exists():
        want = config_fingerprint(runlog.jsonable(runlog.redact(cfg.to_dict())))
        if _saved_fingerprint(paths) != want:
            raise RunDirError(f"{paths.root} holds a run of a different config ({paths.config}); use that config "
                              "to resume it, or another run directory")


def finished_status(paths: runlog.RunPaths) -> dict[str, Any] | None:
    """status.json when the run finished successfully (phase done and the final model written), else None."""
    status = runlog.read_json(paths.status, default=None)
    if isinstance(status, dict) and status.get("phase") == "done" and paths.model.is_file():
        return status
    return None


def _finished(paths: runlog.RunPaths) -> str | None:
    status = finished_status(paths)
    if status is None:
        return None
    acc = runlog.final_accuracy(runlog.read_metrics(paths.metrics))
    acc_s = f"{acc:.4f}" if acc is not None else "n/a"
    return (f"{paths.root} holds this run, finished ({status.get('rounds')} rounds, final test accuracy "
            f"{acc_s}, model {paths.model}); nothing to do")


def _newest_intact(paths: runlog.RunPaths, cfg: ExperimentConfig) -> tuple[int | None, list[str]]:
    """The newest intact checkpoint's round (None if none) and why each newer one was skipped."""
    damaged: list[str] = []
    for rnd, path in list_checkpoints(paths.checkpoint):
        try:
            ckpt = load_checkpoint(path)
        except CorruptStateError as e:
            damaged.append(f"{path.name}: {str(e).rsplit(': ', 1)[-1]}")
            continue
        if ckpt.config_fingerprint != config_fingerprint(cfg):
            raise RunDirError(f"checkpoint {path} was written by a different config; use that config or another "
                              "run directory")
        return rnd, damaged
    return None, damaged


def no_intact_checkpoint(paths: runlog.RunPaths, damaged: list[str]) -> RunDirError:
    return RunDirError(f"{paths.checkpoint} holds {len(damaged)} checkpoint(s) and none is intact "
                       f"({'; '.join(damaged)}); refusing to start again from round 0 over a run that got further. "
                       f"Pass --fresh to move it to {paths.root.name}.old-<time> and start over")


@dataclass(eq=False)
class RunDirLock:
    """This process's hold on a run directory (see :func:`lock_run_dir`); ``release`` once per acquisition."""

    path: Path
    fd: int
    note: str = ""  # the stale owner this process took over from, if any
    count: int = field(default=1, repr=False)

    def release(self) -> None:
        with _HELD_LOCK:
            self.count -= 1
            if self.count > 0 or self.fd < 0:
                return
            _HELD.pop(self.path, None)
            try:
                if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                    self.path.unlink()
            except OSError:
                pass
            os.close(self.fd)  # drops the flock
            self.fd = -1


_HELD: dict[Path, RunDirLock] = {}
_HELD_LOCK = threading.Lock()


def lock_path(root: str | Path) -> Path:
    r = Path(root).absolute()
    return r.with_name(f".{r.name}.lock")


def _owner_text(info: dict[str, Any]) -> str:
    since = info.get("started")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) \
        else ""
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}{when}"


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace")
        info = json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _try_flock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the pid and host in the file are the only evidence
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_run_dir(root: str | Path) -> RunDirLock:
    """Own ``root`` for this process (see the module docstring); raises :class:`RunDirError` (one line) while
    another live process owns it. The caller releases it when its run is over (process exit releases it too)."""
    path = lock_path(root)
    with _HELD_LOCK:
        held = _HELD.get(path)
        if held is not None:
            held.count += 1
            return held
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_flock(fd):
                owner = _read_owner(fd)
                os.close(fd)
                raise RunDirError(f"{Path(root)} is in use by {_owner_text(owner)} ({path}); stop that process "
                                  "first, or choose another run directory")
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file its previous owner unlinked while this process opened it
                break
            os.close(fd)
        previous = _read_owner(fd)
        note = ""
        if previous:
            note = (f"took over the stale lock of {Path(root)} from {_owner_text(previous)}: that process "
                    "holds it no more (it was killed or crashed)")
            print(f"fedent: {note}", file=sys.stderr, flush=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": " ".join(sys.argv)[:500]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        lock = RunDirLock(path, fd, note)
        _HELD[path] = lock
        return lock


def plan_run_dir(root: str | Path, cfg: ExperimentConfig, kind: str, fresh: bool = False) -> RunDirPlan:
    """Decide what starting ``cfg`` on ``root`` as a ``kind`` run does; read-only unless ``fresh`` moves an
    existing run aside. Raises :class:`RunDirError` for every refusal."""
    paths = runlog.RunPaths(Path(root))
    if not has_run(paths.root):
        return RunDirPlan("new")
    if fresh:
        return RunDirPlan("new", moved_to=move_aside(paths.root))
    _check_same_run(paths, cfg, kind)
    summary = _finished(paths)
    if summary is not None:
        return RunDirPlan("finished", summary)
    rnd, damaged = _newest_intact(paths, cfg)
    if rnd is not None:
        return RunDirPlan("resume", f"from the checkpoint of round {rnd + 1}")
    if damaged:
        raise no_intact_checkpoint(paths, damaged)
    logged = sorted({r["round"] for r in runlog.read_metrics(paths.metrics) if isinstance(r.get("round"), int)})
    if any(r > 1 for r in logged):  # 1-based (runlog): more than the first round
        raise RunDirError(f"{paths.root} logged rounds up to {logged[-1]} but has no checkpoint to resume from; "
                          f"pass --fresh to move it to {paths.root.name}.old-<time> and start over")
    return RunDirPlan("new")
