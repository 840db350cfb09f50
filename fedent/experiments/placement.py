"""Where ``fedent reproduce``'s runs train: one GPU per pool worker, round-robin over the visible ones.

The pool's workers are spawned processes; each takes the next slot from a shared counter when it starts and
sets ``CUDA_VISIBLE_DEVICES`` to that slot's GPU before anything touches CUDA, so its runs' ``cuda`` is that
card. With W workers on G GPUs, worker i trains on GPU i mod G (W > G stacks several runs on a card, which
pays while one run leaves the card idle). Nothing here needs a GPU: the device list can be given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from fedent.config import ConfigError


def visible_gpus(env: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES``'s entries when it is set (empty: none), else
    ``0..count-1`` (``count``: ``torch.cuda.device_count()`` when not given)."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if count is None:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [str(i) for i in range(count)]


def parse_gpus(spec: str, env: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """``--gpus``: ``auto`` (every visible GPU), ``none``, or a comma-separated list of device ids."""
    spec = spec.strip()
    if spec == "auto":
        return visible_gpus(env, count)
    if spec in ("none", ""):
        return []
    ids = [s.strip() for s in spec.split(",")]
    if any(not s for s in ids):
        raise ConfigError(f"--gpus: {spec!r} is not auto, none or a comma-separated list of device ids")
    return ids


def take_slot(counter: Any, gpus: Sequence[str], env: dict[str, str] | None = None) -> str | None:
    """In a pool worker at start: take the next slot of ``counter`` (a shared ``multiprocessing.Value``) and
    bind this process to its GPU (``CUDA_VISIBLE_DEVICES``). Returns the GPU, or None when there are none."""
    if counter is None or not gpus:
        return None
    with counter.get_lock():
        slot = int(counter.value)
        counter.value += 1
    gpu = str(gpus[slot % len(gpus)])
    (os.environ if env is None else env)["CUDA_VISIBLE_DEVICES"] = gpu
    return gpu
