"""Runs of an earlier search read back by a later one (``fedent tune --reuse DIR``).

A search that adds a knob names its points with that knob (``beta0.99_lr0.09-s0``), so the earlier search's runs
of the same configs (``lr0.09-s0``, trained at the knob's default) are not found under the new names and would be
trained again. ``adopt`` copies such a run's logs in under the new name, unchanged, when its config.yaml is the
point's config to the last key and the run has settled (every round logged, or diverged): the match is by config,
never by name, so a run of any other config (another default, data root or round count) is left alone.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# What a read-back needs and what the published archives keep: the logs, not the model or the checkpoints.
LOG_FILES = ("config.yaml", "metrics.jsonl", "partition.json", "provenance.json", "status.json", "clients.json",
             "estimator.json")


def adopt(run_dir: Path, config: Mapping[str, Any], rounds: int, sources: Sequence[Path]) -> Path | None:
    """Copy into the absent ``run_dir`` the logs of the first settled run with this config found among the
    ``sources`` (run directories, in order); the source it came from, or None (nothing copied)."""
    from fedent.experiments.reproduce import settled_dir

    if run_dir.exists():
        return None
    for src in sources:
        if src.is_dir() and settled_dir(src, config, rounds):
            tmp = run_dir.with_name(f".{run_dir.name}.adopting")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name in LOG_FILES:
                if (src / name).is_file():
                    shutil.copy2(src / name, tmp / name)
            tmp.rename(run_dir)  # whole or not at all: a kill mid-copy leaves no half run under the point's name
            return src
    return None


def candidates(reuse: Sequence[Path], algorithm: str, seed: int) -> list[Path]:
    """Every run of ``algorithm`` and ``seed`` under the earlier searches' output directories, in order."""
    return [d for out in reuse for d in sorted((out / "runs" / algorithm).glob(f"*-s{seed}")) if d.is_dir()]

