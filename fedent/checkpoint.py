"""Resumable run state: one checksummed, atomically written file per completed round.

The aggregator saves a :class:`Checkpoint` after every round; after a crash (even SIGKILL mid-write) it
loads the newest file whose checksum verifies and re-runs from ``next_round``. Client sampling and batch
order are stateless (``fedent.rng.derive_seed``), so the seed and the round number are all the randomness
a resume needs; the strategy's own server state (FedAdam/FedYogi moments, FedDyn's h, SCAFFOLD's c,
FedEnt's estimator trajectory) comes from ``Strategy.server_state()``.

File format (shared with :mod:`fedent.client_store`)::

    MAGIC | sha256(payload) (32 bytes) | len(payload) (8 bytes, little endian) | payload (torch.save)

A torn or bit-flipped file fails the length or digest check and is skipped, never half-loaded. Payloads
are read back with ``torch.load(weights_only=True)``, so a checkpoint file cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedent.config import ConfigError, ExperimentConfig
from fedent.params import Params
from fedent.runlog import atomic_write_bytes, jsonable

log = logging.getLogger(__name__)

MAGIC = b"FEDENT-STATE\x00v1\n"
_DIGEST_LEN = 32
_LEN_BYTES = 8
_CKPT_NAME = re.compile(r"^round-(\d{8,})\.ckpt$")
# Config keys that may differ between a run and its resume: they do not change what is computed.
FINGERPRINT_IGNORED = ("out_dir", "train.device", "train.eval_batch_size")


class CorruptStateError(ValueError):
    """A state file is torn, truncated, tampered with or not a fedent state file."""


class CheckpointMismatchError(ConfigError):
    """The checkpoint belongs to a different configuration than the one asked to resume."""


# ---- checksummed payload framing -------------------------------------------------------------------

def encode_payload(obj: Any) -> bytes:
    """``obj`` (tensors, numbers, strings, lists, dicts) framed with its length and sha256."""
    _check_storable(obj, "state")
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    return MAGIC + hashlib.sha256(payload).digest() + len(payload).to_bytes(_LEN_BYTES, "little") + payload


def decode_payload(data: bytes, where: str) -> Any:
    """Inverse of :func:`encode_payload`; raises :class:`CorruptStateError` on any mismatch."""
    head = len(MAGIC) + _DIGEST_LEN + _LEN_BYTES
    if len(data) < head or not data.startswith(MAGIC):
        raise CorruptStateError(f"{where}: not a fedent state file (bad header)")
    digest = data[len(MAGIC):len(MAGIC) + _DIGEST_LEN]
    size = int.from_bytes(data[len(MAGIC) + _DIGEST_LEN:head], "little")
    payload = data[head:]
    if len(payload) != size:
        raise CorruptStateError(f"{where}: truncated ({len(payload)} of {size} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptStateError(f"{where}: checksum mismatch")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # a verified payload that still fails is a version/format problem
        raise CorruptStateError(f"{where}: unreadable payload ({e.__class__.__name__})") from None


def read_state_file(path: str | Path) -> Any:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CorruptStateError(f"{p}: cannot read ({e.strerror})") from None
    return decode_payload(data, str(p))


def _check_storable(obj: Any, where: str) -> None:
    """Only plain data and tensors: what ``torch.load(weights_only=True)`` reads back. Scalars must be exactly
    bool, int, float or str: a subclass (numpy's float64, torch's version string) is written by ``torch.save``
    but refused by the safe loader, so the file would be written and never read back."""
    if obj is None or type(obj) in (bool, int, float, str) or isinstance(obj, Tensor):
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_storable(v, f"{where}[{i}]")
        return
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if type(k) not in (str, int):
                raise TypeError(f"{where}: key {k!r} must be a str or int (not a subclass: {type(k).__name__})")
            _check_storable(v, f"{where}.{k}")
        return
    sub = next((b.__name__ for b in (bool, int, float, str) if isinstance(obj, b)), None)
    why = f" (a subclass of {sub}: pass {sub}(value))" if sub else ""
    raise TypeError(f"{where}: cannot checkpoint a {type(obj).__name__}{why}")


def _plain(obj: Any) -> Any:
    """Detached CPU copies of tensors, plain dicts/lists elsewhere (so the saved file aliases nothing), and plain
    values for numpy's boolean, integer and (double or narrower) float scalars and for subclasses of int, float and
    str, keys included (the safe loader refuses them; anything else it refuses is left for ``_check_storable``)."""
    if isinstance(obj, Tensor):
        return obj.detach().to("cpu").clone()
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf" and obj.dtype.itemsize <= 8:
        return obj.item()
    if type(obj) is bool:  # an int subclass itself, which cannot be subclassed: plain already
        return obj
    for base in (int, float, str):  # int() and str.__str__ keep an enum's value (str() would give "Cls.NAME")
        if isinstance(obj, base) and type(obj) is not base:
            return str.__str__(obj) if base is str else base(obj)
    if isinstance(obj, Mapping):
        return {_plain(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# ---- config fingerprint ----------------------------------------------------------------------------

def config_fingerprint(config: ExperimentConfig | Mapping[str, Any],
                       ignored: Sequence[str] = FINGERPRINT_IGNORED) -> str:
    """sha256 of the canonical JSON of the config, minus keys that do not change the computation."""
    raw = config.to_dict() if isinstance(config, ExperimentConfig) else dict(config)
    raw = json.loads(json.dumps(jsonable(raw)))  # deep copy with plain types
    for dotted in ignored:
        node: Any = raw
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# ---- checkpoints -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    """Everything needed to continue a run after round ``round`` completed.

    ``server_state`` is whatever ``Strategy.server_state()`` returned; ``estimator`` holds FedEnt's
    trajectory / Algorithm 1 report (estimator.json's content); ``clients`` is the aggregator's client
    registry as plain dicts; ``extra`` is free-form caller data (elapsed time, run id, ...).
    """

    round: int
    global_params: Params
    config_fingerprint: str
    seed: int
    server_state: dict[str, Any] = field(default_factory=dict)
    estimator: dict[str, Any] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    @property
    def next_round(self) -> int:
        """The first round a resumed run executes."""
        return self.round + 1

    def to_payload(self) -> dict[str, Any]:
        return {
            "kind": "checkpoint",
            "round": int(self.round),
            "global_params": _plain(list(self.global_params)),
            "config_fingerprint": str(self.config_fingerprint),
            "seed": int(self.seed),
            "server_state": _plain(dict(self.server_state)),
            "estimator": _plain(dict(self.estimator)),
            "clients": _plain(dict(self.clients)),
            "extra": _plain(dict(self.extra)),
            "created_at": float(self.created_at or time.time()),
        }

    @classmethod
    def from_payload(cls, payload: Any, where: str) -> Checkpoint:
        if not isinstance(payload, dict) or payload.get("kind") != "checkpoint":
            raise CorruptStateError(f"{where}: not a checkpoint")
        params = payload.get("global_params")
        if not isinstance(params, list) or not all(isinstance(t, Tensor) for t in params):
            raise CorruptStateError(f"{where}: global_params is not a list of tensors")
        try:
            return cls(
                round=int(payload["round"]),
                global_params=params,
                config_fingerprint=str(payload["config_fingerprint"]),
                seed=int(payload["seed"]),
                server_state=dict(payload["server_state"]),
                estimator=dict(payload["estimator"]),
                clients=dict(payload["clients"]),
                extra=dict(payload["extra"]),
                created_at=float(payload["created_at"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptStateError(f"{where}: malformed checkpoint ({e.__class__.__name__}: {e})") from None


def checkpoint_path(directory: str | Path, rnd: int) -> Path:
    return Path(directory) / f"round-{int(rnd):08d}.ckpt"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(round, path) of every checkpoint-named file, newest first (temp files are ignored)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _CKPT_NAME.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def _remove_stale_temps(directory: Path) -> None:
    """Temp files a killed writer left behind (``.<name>.*.tmp``, see fedent.runlog.atomic_write_bytes)."""
    for p in directory.glob(".*.tmp"):
        try:
            p.unlink()
        except OSError:
            pass


def save_checkpoint(directory: str | Path, ckpt: Checkpoint, keep: int = 3) -> Path:
    """Write ``ckpt`` atomically, then delete later rounds' checkpoints and all but the newest ``keep``.

    Single writer per directory (the aggregator): stale temp files from an earlier crash are removed.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if ckpt.round < 0:
        raise ValueError(f"checkpoint round must be >= 0, got {ckpt.round}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(d)
    path = checkpoint_path(d, ckpt.round)
    atomic_write_bytes(path, encode_payload(ckpt.to_payload()))
    found = list_checkpoints(d)
    # later rounds belong to a timeline this run left (it resumed from an older checkpoint): never kept
    # over the one just written, which counting by age alone would delete
    stale = [p for r, p in found if r > ckpt.round] + [p for r, p in found if r <= ckpt.round][keep:]
    for old in stale:
        try:
            old.unlink()
        except OSError:
            pass
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    """One checkpoint file, verified; :class:`CorruptStateError` if it is not intact."""
    return Checkpoint.from_payload(read_state_file(path), str(path))


def load_latest_checkpoint(directory: str | Path, expect_fingerprint: str | None = None) -> Checkpoint | None:
    """The newest intact checkpoint (torn/corrupt ones are skipped with a warning), or None if there is none.

    With ``expect_fingerprint`` a checkpoint of a different config raises
    :class:`CheckpointMismatchError` instead of silently resuming the wrong experiment.
    """
    for _, path in list_checkpoints(directory):
        try:
            ckpt = load_checkpoint(path)
        except CorruptStateError as e:
            log.warning("skipping checkpoint: %s", e)
            continue
        if expect_fingerprint is not None and ckpt.config_fingerprint != expect_fingerprint:
            raise CheckpointMismatchError(
                f"checkpoint {path} was written by a different config "
                f"(fingerprint {ckpt.config_fingerprint[:12]} != {expect_fingerprint[:12]}); "
                "use a new run directory or the original config"
            )
        return ckpt
    return None
