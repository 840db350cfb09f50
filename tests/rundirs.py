"""Run directories for the restart tests: one as the cluster aggregator leaves it, and a byte-for-byte digest
("nothing was written" is checked on every file's content)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from fedent import runlog
from fedent.checkpoint import Checkpoint, config_fingerprint, save_checkpoint
from fedent.config import ExperimentConfig
from fedent.rounds.rundir import CLUSTER


def cluster_run_dir(root: Path, cfg: ExperimentConfig, rounds_logged: int, checkpoints: tuple[int, ...],
                    phase: str = "training") -> None:
    """The files the planner reads, as a cluster run that logged ``rounds_logged`` rounds leaves them."""
    paths = runlog.create_run_dir(root, exist_ok=True)
    runlog.write_config(paths.config, cfg.to_dict())
    runlog.atomic_write_json(paths.status, runlog.status_record(
        root.name, cfg.algorithm.name, phase, rounds_logged or None, cfg.train.rounds, 0.0, {"mode": CLUSTER}))
    log = runlog.MetricsLog(paths.metrics)
    for r in range(1, rounds_logged + 1):  # rounds 1..R (fedent.runlog); checkpoints keep the loop's index
        log.append(runlog.metrics_record(round=r, algorithm=cfg.algorithm.name, test_acc=0.5 + (r - 1) / 100))
    for r in checkpoints:
        save_checkpoint(paths.checkpoint, Checkpoint(round=r, global_params=[torch.zeros(2)],
                                                     config_fingerprint=config_fingerprint(cfg), seed=0), keep=5)
    if phase == "done":
        torch.save([torch.zeros(2)], paths.model)


def digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the sha256 of its content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def damage(path: Path) -> None:
    """Flip the last byte (a checksum mismatch)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
