"""The run directory: layout, atomic JSON files, the metrics.jsonl log and its reader.

Written by the simulator and the cluster aggregator alike and read by ``fedent plot`` and the dashboard,
so nothing here knows who is writing. Live files (status.json, clients.json) are replaced atomically
(temp file, fsync, rename) so a reader polling them never sees half a file; metrics.jsonl is append-only
and its reader skips a torn last line, which is what a crash mid-write leaves behind.

Rounds are numbered 1..R everywhere a round number appears (metrics.jsonl, status.json, estimator.json,
the CLI, the API, the dashboard, plots and reports): "round k" is the k-th round, and once it is logged k
rounds are complete. Files written so carry ``"round_base": 1``; run directories from before (rounds logged
0..R-1, no marker) are read through ``read_metrics`` / ``one_based`` and come out numbered the same way.

Times (``started_at``, ``updated_at``, ``last_heartbeat``) are Unix epoch seconds (float, UTC).
clients.json holds ``{"clients": [row, ...], "updated_at": t}`` with rows from ``client_row``;
estimator.json holds ``{"algorithm", "report", "trajectory": [{round, phi2_pred, phi2_actual, entropy, guards}]}``.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Keys of one metrics.jsonl line; always present, null when not measured that round (docs/architecture.md).
METRIC_KEYS = (
    "round", "round_base", "algorithm", "test_acc", "test_loss", "train_loss", "clients", "num_clients",
    "wall_s", "elapsed_s", "fedent", "diagnostics", "privacy", "val_acc", "val_loss",
)
PHASES = ("starting", "estimating", "training", "aggregating", "evaluating", "done", "failed", "stopped")
STATUS_KEYS = ("run_id", "algorithm", "phase", "round", "round_base", "rounds", "started_at", "updated_at", "state")
CLIENT_KEYS = (
    "cid", "worker", "state", "device", "samples", "participation", "bytes", "eta", "eta_star", "last_heartbeat",
    "data_source", "label_counts", "last_failure",
)
# The base of every round number this package writes (see the module docstring); a record or file without
# the marker is from before and counted from 0.
ROUND_BASE = 1
# Config keys whose values never reach disk (cluster configs may carry tokens or key passwords).
_SECRET_KEY = re.compile(r"(secret|password|passwd|token|private_key|api_key)", re.IGNORECASE)
REDACTED = "***"


@dataclass(frozen=True)
class RunPaths:
    """Where each file of a run lives; the one place that spells the layout."""

    root: Path

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def partition(self) -> Path:
        return self.root / "partition.json"

    @property
    def provenance(self) -> Path:
        return self.root / "provenance.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def clients(self) -> Path:
        return self.root / "clients.json"

    @property
    def estimator(self) -> Path:
        return self.root / "estimator.json"

    @property
    def model(self) -> Path:
        return self.root / "model_final.pt"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def instance(self) -> Path:
        return self.root / "instance"


def new_run_id(name: str, algorithm: str, seed: int, now: float | None = None) -> str:
    """``<name>-<algorithm>-s<seed>-<UTC timestamp>``, filesystem-safe."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}-{algorithm}-s{seed}")
    return f"{safe}-{stamp}"


_INSTANCE = re.compile(r"[0-9a-f]{12}")


def run_instance(paths: RunPaths, create: bool) -> str:
    """The run directory's instance: a random id written once when a run starts there, read back on resume.

    Why: a run's id is its directory's name, so a run started over in the same directory (``--fresh``) has
    the same id, and what outlives a run elsewhere keyed by it (a standalone worker's ``--state-dir D`` holds
    ``D/<run key>``) would carry over into the new run. ``create=False`` (a resume) never writes one: a run
    started before instances existed has none (""), so its key stays its id and its workers still resume.
    """
    try:
        text = paths.instance.read_text().strip()
    except FileNotFoundError:
        text = ""
    if text and not _INSTANCE.fullmatch(text):
        raise ValueError(f"{paths.instance}: not a run instance ({text[:40]!r}); it holds 12 hex digits")
    if text or not create:
        return text
    text = uuid.uuid4().hex[:12]
    atomic_write_text(paths.instance, text + "\n")
    return text


def run_key(paths: RunPaths, instance: str) -> str:
    """What identifies the run to its workers and the estimator: ``<run id>.<instance>`` (the id alone for
    a run without an instance)."""
    return f"{paths.run_id}.{instance}" if instance else paths.run_id


def create_run_dir(root: str | Path, exist_ok: bool = False) -> RunPaths:
    """Make the run directory (and plots/); a taken name gets a numeric suffix unless exist_ok."""
    base = Path(root)
    path = base
    if not exist_ok:
        n = 1
        while path.exists() and any(path.iterdir()):
            n += 1
            path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True, exist_ok=True)
    paths = RunPaths(path)
    paths.plots.mkdir(exist_ok=True)
    return paths


def jsonable(obj: Any) -> Any:
    """Plain JSON types only: numpy/torch scalars and arrays become Python values, NaN/inf become null.

    Browsers reject the NaN literal that json.dumps would otherwise emit, and a diverged run must still
    produce a readable log.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    tolist = getattr(obj, "tolist", None)  # numpy arrays/scalars, torch tensors
    if callable(tolist):
        return jsonable(tolist())
    item = getattr(obj, "item", None)
    if callable(item):
        return jsonable(item())
    raise TypeError(f"cannot store {type(obj).__name__} in a run log")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process umask (read by setting and restoring it once; it does not change while fedent runs)."""
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


_UMASK: int | None = None


def file_mode() -> int:
    """The one permission policy for the files fedent writes (run directories, reports, checkpoints, worker
    state): what ``open()`` gives, 0o666 less the umask (0644 under umask 022). Nothing secret is in them:
    config.yaml is redacted (``redact``), and keys and tokens are written with an explicit ``mode=0o600``."""
    return 0o666 & ~_umask()


def atomic_write_bytes(path: str | Path, data: bytes, mode: int | None = None) -> None:
    """Write to a temp file beside ``path``, fsync it, rename over ``path`` (readers see old or new, never half).

    The file gets ``mode``, by default ``file_mode()`` (mkstemp alone would leave 0600, unlike appended files).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, file_mode() if mode is None else mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(target.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 1) -> None:
    atomic_write_text(path, json.dumps(jsonable(obj), indent=indent, allow_nan=False) + "\n")


def read_json(path: str | Path, default: Any = None) -> Any:
    """The file's JSON, or ``default`` when it does not exist yet."""
    p = Path(path)
    if not p.exists():
        return default
    return json.loads(p.read_text())


def redact(obj: Any) -> Any:
    """A copy of a nested config with secret-looking keys' values replaced by ``***``."""
    if isinstance(obj, Mapping):
        return {k: (REDACTED if _SECRET_KEY.search(str(k)) and v is not None else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj


def write_config(path: str | Path, config: Mapping[str, Any]) -> None:
    """The resolved config as YAML, secrets redacted."""
    atomic_write_text(path, yaml.safe_dump(jsonable(redact(config)), sort_keys=False))


# ---- metrics.jsonl ---------------------------------------------------------------------------------

def metrics_record(**values: Any) -> dict[str, Any]:
    """One metrics line with every documented key present (null when not given); unknown keys are errors."""
    unknown = sorted(set(values) - set(METRIC_KEYS))
    if unknown:
        raise ValueError(f"unknown metrics key(s): {', '.join(unknown)}")
    rec: dict[str, Any] = {k: values.get(k) for k in METRIC_KEYS}
    rec["round_base"] = ROUND_BASE
    if rec["diagnostics"] is None:
        rec["diagnostics"] = {}
    return rec


class ReplacedRunError(RuntimeError):
    """The file this run writes was deleted or replaced by someone else (the run directory was removed and
    made again, e.g. by a fresh run): stop rather than write into another run's log."""


class MetricsLog:
    """Append-only metrics.jsonl: one JSON object per completed round, flushed and fsynced per line.

    It keeps the file it first wrote open (so its inode cannot be reused) and refuses to append once the path
    names another file or none: a process left running after its run directory was removed and started again
    (an orphaned worker of a killed ``fedent reproduce``) once interleaved its rounds into the new run's log.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: Any = None

    def append(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(jsonable(record), allow_nan=False, separators=(",", ":"))
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept for the run's life
        else:
            mine = os.fstat(self._file.fileno())
            try:
                st = os.stat(self.path)
                same = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                same = False
            if not same:
                raise ReplacedRunError(f"{self.path} was removed or replaced while this run wrote it; stopping "
                                       "instead of writing into another run's log")
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics.jsonl (a torn last line from a crash or a live writer is skipped)."""
    p = Path(path)
    if not p.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(one_based(rec))
    return out


def round_of(rec: Mapping[str, Any]) -> int:
    """The record's round, 1..R, whichever numbering wrote it (for records handed over in memory)."""
    return int(one_based(dict(rec))["round"])


def one_based(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` (a metrics line, status.json, a trajectory point) with its ``round`` counted 1..R: a record
    from before the marker (rounds 0..R-1) is shifted by one and marked; a marked one is returned as it is."""
    if rec.get("round_base") == ROUND_BASE:
        return rec
    r = rec.get("round")
    out = dict(rec)
    if isinstance(r, int) and not isinstance(r, bool):
        out["round"] = r + 1
    out["round_base"] = ROUND_BASE
    return out


# ---- live status ------------------------------------------------------------------------------------

def status_record(
    run_id: str,
    algorithm: str,
    phase: str,
    round: int | None,
    rounds: int,
    started_at: float,
    state: Mapping[str, Any] | None = None,
    updated_at: float | None = None,
) -> dict[str, Any]:
    """status.json's content; ``state`` holds free-form extras (e.g. an error message when failed)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    return {
        "run_id": run_id,
        "algorithm": algorithm,
        "phase": phase,
        "round": round,
        "round_base": ROUND_BASE,
        "rounds": int(rounds),
        "started_at": float(started_at),
        "updated_at": float(time.time() if updated_at is None else updated_at),
        "state": dict(state or {}),
    }


def client_row(cid: int, **values: Any) -> dict[str, Any]:
    """One clients.json row with every documented key present (null when unknown)."""
    unknown = sorted(set(values) - set(CLIENT_KEYS))
    if unknown:
        raise ValueError(f"unknown client key(s): {', '.join(unknown)}")
    row: dict[str, Any] = {k: values.get(k) for k in CLIENT_KEYS}
    row["cid"] = int(cid)
    return row


def write_clients(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    atomic_write_json(path, {"clients": list(rows), "updated_at": time.time()}, indent=None)


def read_clients(path: str | Path) -> list[dict[str, Any]]:
    data = read_json(path, default={"clients": []})
    rows = data.get("clients", []) if isinstance(data, dict) else data
    return list(rows)


def final_accuracy(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The last measured test accuracy of a run's metrics (None if never evaluated)."""
    for rec in reversed(records):
        if rec.get("test_acc") is not None:
            return float(rec["test_acc"])
    return None
