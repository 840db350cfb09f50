"""glibc malloc settings for the processes that stream tensors (aggregator, estimator, workers).

Every tensor chunk passes through several short-lived 4 MiB buffers (the chunk's bytes, the serialised
message, gRPC's copy). With glibc's defaults the heap's top is handed back to the kernel as soon as such a
buffer is freed (``M_TRIM_THRESHOLD`` 128 KiB, raised only dynamically), so the next chunk faults the same
pages in again. On a VM a page fault is expensive: building and serialising a fresh 4 MiB ``TensorChunk``
ran at 0.5-0.6 GB/s with the defaults and at 8-11 GB/s once freed memory stays in the heap
(benchmarks/README.md). The price is that up to ``trim_threshold`` bytes of freed memory per malloc arena
stay resident instead of going back to the OS.

Called once at process start by ``python -m server|client|estimator``; never by the pure core. A user who
sets glibc's own ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` keeps those settings, and
``FEDENT_MALLOC_TUNING=off`` leaves glibc's defaults alone.
``prefault_async`` covers the buffers too large for the heap: a decoded stream's one destination buffer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

from torch import Tensor

M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling for this setting (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 * 2**20
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
OPT_OUT = "FEDENT_MALLOC_TUNING"  # "off" keeps glibc's defaults untouched


@functools.cache
def _libc_fn(name: str) -> Any:
    """A libc function through ctypes (calls release the GIL), or None off Linux or where it is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True), name)
    except (OSError, AttributeError):  # musl has no mallopt, for one
        return None


def tune_for_streaming(env: Mapping[str, str], mmap_threshold: int = MMAP_THRESHOLD,
                       trim_threshold: int = TRIM_THRESHOLD) -> str:
    """Keep freed chunk buffers in the heap; returns what was done, for the process's start-up log line."""
    if env.get(OPT_OUT, "").lower() in ("0", "off", "no", "false"):
        return f"malloc: glibc's defaults ({OPT_OUT}={env[OPT_OUT]})"
    if any(k in env for k in USER_SETTINGS):
        return "malloc: left as set in the environment"
    mallopt = _libc_fn("mallopt")
    if mallopt is None:
        return "malloc: no glibc mallopt here, left alone"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1
    if not ok:
        return "malloc: mallopt refused the settings, left alone"
    return f"malloc: mmap threshold {mmap_threshold >> 20} MiB, trim threshold {trim_threshold >> 20} MiB"


MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault pages in writable without touching their contents
PREFAULT_MIN_BYTES = 32 * 2**20  # smaller buffers come from the (recycled) heap, see MMAP_THRESHOLD
PREFAULT_STEP = 8 * 2**20
PREFAULT_WINDOW = 64 * 2**20  # never more than this far ahead of the bytes actually received
PREFAULT_IDLE_S = 10.0  # a stalled or abandoned stream releases its helper thread after this long


def _madvise() -> Callable[[int, int, int], int] | None:
    fn = _libc_fn("madvise")
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return cast(Callable[[int, int, int], int] | None, fn)


class Prefaulter:
    """Faults a fresh receive buffer's pages in on a helper thread, a bounded window ahead of the data.

    A new buffer above glibc's mmap threshold is fresh anonymous memory, and on a VM its first-touch page
    faults cost about as much as receiving the bytes (~3 GB/s here). MADV_POPULATE_WRITE does that work on
    another core, through ctypes (which releases the GIL), while the receiver waits on the network. It
    never changes the buffer's contents, so it needs no synchronisation with the copies into it. The
    receiver reports its progress with ``advance``; the helper stays at most ``window`` bytes ahead, so a
    header that promises gigabytes it never sends cannot make it populate them.
    """

    def __init__(self, t: Tensor, madvise: Callable[[int, int, int], int], step: int = PREFAULT_STEP,
                 window: int = PREFAULT_WINDOW, idle_s: float = PREFAULT_IDLE_S) -> None:
        self.step = step
        self._credit = 0
        self._permits = threading.Semaphore(max(1, window // step))
        self._closed = False
        self.thread = threading.Thread(target=self._run, args=(t, madvise, idle_s), name="prefault", daemon=True)
        self.thread.start()

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more of the buffer have been written by the receiver."""
        self._credit += nbytes
        while self._credit >= self.step:
            self._credit -= self.step
            self._permits.release()

    def close(self) -> None:
        self._closed = True
        self._permits.release()

    def _run(self, t: Tensor, madvise: Callable[[int, int, int], int], idle_s: float) -> None:
        page = mmap.PAGESIZE
        ptr = t.data_ptr()
        start, end = -(-ptr // page) * page, (ptr + t.numel() * t.element_size()) // page * page
        for addr in range(start, end, self.step):
            if not self._permits.acquire(timeout=idle_s) or self._closed:
                return
            if madvise(addr, min(self.step, end - addr), MADV_POPULATE_WRITE) != 0:
                return  # an older kernel (EINVAL): the copies fault the pages in themselves


def prefault_async(t: Tensor) -> Prefaulter | None:
    """A ``Prefaulter`` for a large CPU receive buffer; None where it would not help or cannot run."""
    if t.device.type != "cpu" or t.numel() * t.element_size() < PREFAULT_MIN_BYTES:
        return None
    madvise = _madvise()
    return Prefaulter(t, madvise) if madvise is not None else None
