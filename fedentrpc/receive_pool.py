"""Receive buffers recycled across tensor streams of the same size.

Why: a decoded tensor stream is copied into one buffer that its tensors then view. Memory a process has
never touched costs a page fault per 4 KiB on its first write, which on the 2-core benchmark VM took
about 0.9 s per GB: more than bare gRPC needs to move the bytes (benchmarks/README.md, bench_transfer.py).
Models come in the same sizes round after round (the round model a worker fetches, the updates the
aggregator receives), so once the tensors of the last stream are freed, their buffer takes the next
stream's bytes warm. The pool only ever holds buffers that nothing references: a buffer goes back when
the last tensor viewing it is freed, never before, so a kept tensor (a model that lives on) is never
overwritten.

Bounded: at most ``max_idle_bytes`` (1 GiB by default) sit idle; a freed buffer evicts the longest-idle
ones to make room (the sizes in use now are the likeliest to come again), and one larger than the bound
is not kept. Buffers under ``min_bytes`` are left to malloc, whose heap reuses small blocks anyway.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from torch import Tensor

DEFAULT_MAX_IDLE_BYTES = 2**30
DEFAULT_MIN_BYTES = 2**20


class _Lease(np.ndarray):
    """The array a decoded stream's tensors share (through ``torch.from_numpy``): when the last of them is
    freed, the buffer under it goes back to its pool. Arrays numpy derives from a lease are not leases."""

    _pool: ReceivePool | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self._pool = None

    def __del__(self) -> None:
        pool, base = self._pool, self.base
        if pool is not None and isinstance(base, np.ndarray):
            pool.give_back(base)


class ReceivePool:
    """Freed receive buffers, kept for the next stream of the same size (see the module docstring)."""

    def __init__(self, max_idle_bytes: int = DEFAULT_MAX_IDLE_BYTES, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        self.max_idle_bytes = max_idle_bytes
        self.min_bytes = min_bytes
        self._idle: list[np.ndarray] = []  # longest idle first
        self._idle_bytes = 0
        self._lock = threading.RLock()  # give_back can run from a __del__ while take holds the lock

    def take(self, n: int) -> tuple[Tensor, np.ndarray]:
        """A uint8 tensor of ``n`` bytes (recycled when a freed one of that size is idle, else new) and a
        plain numpy view of the same memory to write it through."""
        if n < self.min_bytes:
            t = torch.empty(n, dtype=torch.uint8)
            return t, t.numpy()
        mem = None
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):  # the most recently freed of this size
                if self._idle[i].nbytes == n:
                    mem = self._idle.pop(i)
                    self._idle_bytes -= n
                    break
        if mem is None:
            mem = np.empty(n, dtype=np.uint8)
        lease = mem.view(_Lease)
        lease._pool = self
        return torch.from_numpy(lease), mem

    def give_back(self, mem: np.ndarray) -> None:
        n = mem.nbytes
        if n > self.max_idle_bytes:
            return
        with self._lock:
            while self._idle and self._idle_bytes + n > self.max_idle_bytes:
                self._idle_bytes -= self._idle.pop(0).nbytes
            self._idle.append(mem)
            self._idle_bytes += n

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes

    def clear(self) -> None:
        """Let every idle buffer go (back to malloc and the OS)."""
        with self._lock:
            self._idle.clear()
            self._idle_bytes = 0


RECEIVE_POOL = ReceivePool()
