"""A run's scalars as TensorBoard event files, from metrics.jsonl alone (finished, live and cluster runs alike).

Tags (step = the round as the CLI prints it, 1..R; wall time = the run's start + ``elapsed_s`` when known):

- ``accuracy/test``, ``loss/train``, ``loss/test``: the global model, on the rounds where they were measured
- ``eta/client_<id>``: FedEnt's η_i(t) on the rounds client <id> took part in
- ``phi2/predicted``, ``phi2/actual``: the mean-field φ2(t+1) against Σθ_i‖w_i(t+1)‖² after training
- ``entropy/uploads``: Σ p_i log p_i of the uploads

plus a Custom Scalars layout that draws φ2 predicted vs actual, and all clients' η, in one chart each.
``tensorboard`` (and torch's SummaryWriter on top of it) is imported only when exporting: ``pip install
'fedent[tracking]'``. The core imports this module without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedent import runlog

Records = Sequence[Mapping[str, Any]]
EVENT_GLOB = "events.out.tfevents.*"
TOP_LEVEL = {"test_acc": "accuracy/test", "train_loss": "loss/train", "test_loss": "loss/test"}
FEDENT = {"phi2_pred": "phi2/predicted", "phi2_actual": "phi2/actual", "entropy": "entropy/uploads"}


class TrackingUnavailable(RuntimeError):
    """The optional tensorboard package is not installed."""


def _finite(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def scalars(records: Records) -> Iterator[tuple[str, int, float]]:
    """(tag, step, value) of every scalar the export writes, in log order (pure; the test compares with it)."""
    for r in records:
        step = runlog.round_of(r)  # 1..R, as everywhere (fedent.runlog)
        for key, tag in TOP_LEVEL.items():
            v = _finite(r.get(key))
            if v is not None:
                yield tag, step, v
        fd = r.get("fedent") or {}
        for key, tag in FEDENT.items():
            v = _finite(fd.get(key))
            if v is not None:
                yield tag, step, v
        for row in fd.get("clients") or []:
            v = _finite(row.get("eta"))
            if v is not None:
                yield f"eta/client_{int(row['client'])}", step, v


def _start_time(paths: runlog.RunPaths) -> float | None:
    status = runlog.read_json(paths.status)
    if isinstance(status, dict):
        t = _finite(status.get("started_at"))
        if t is not None and t > 0:
            return t
    return None


def export(run_dir: str | Path, out_dir: str | Path | None = None) -> Path | None:
    """Write RUN_DIR's scalars to ``out_dir`` (default RUN_DIR/tensorboard); None when nothing was logged yet.

    Event files from an earlier export into the same folder are replaced, so exporting a live run again does not
    duplicate points."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # torch raises ImportError("TensorBoard logging requires TensorBoard ...")
        raise TrackingUnavailable("TensorBoard export needs the tensorboard package: "
                                  "pip install 'fedent[tracking]'") from e
    paths = runlog.RunPaths(Path(run_dir))
    records = runlog.read_metrics(paths.metrics)
    if not records:
        return None
    out = Path(out_dir) if out_dir is not None else paths.root / "tensorboard"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(EVENT_GLOB):
        old.unlink()
    t0 = _start_time(paths)
    elapsed = {runlog.round_of(r): _finite(r.get("elapsed_s")) for r in records}
    writer = SummaryWriter(log_dir=str(out))
    try:
        for tag, step, value in scalars(records):
            el = elapsed.get(step)
            # new style in double precision: the entropy varies in its 7th digit, float32 would flatten it
            writer.add_scalar(tag, value, global_step=step, walltime=None if t0 is None or el is None else t0 + el,
                              new_style=True, double_precision=True)
        writer.add_custom_scalars({"fedent": {
            "φ2(t+1): predicted vs actual": ["Multiline", ["phi2/predicted", "phi2/actual"]],
            "η_i(t) of every client": ["Multiline", [r"eta/client_.*"]],
            "loss: train vs test": ["Multiline", ["loss/train", "loss/test"]],
        }})
    finally:
        writer.close()
    return out
