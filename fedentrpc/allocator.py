"""glibc malloc settings for the processes that stream tensors (aggregator, estimator, workers).

Every tensor chunk passes through several short-lived 4 MiB buffers (the chunk's bytes, the serialised
message, gRPC's copy). With glibc's defaults the heap's top is handed back to the kernel as soon as such a
buffer is freed (``M_TRIM_THRESHOLD`` 128 KiB, raised only dynamically), so the next chunk faults the same
pages in again. On a VM a page fault is expensive: building and serialising a fresh 4 MiB ``TensorChunk``
ran at 0.5-0.6 GB/s with the defaults and at 8-11 GB/s once freed memory stays in the heap
(benchmarks/README.md). The price is that up to ``trim_threshold`` bytes of freed memory per malloc arena
stay resident instead of going back to the OS.

Called once at process start by ``python -m server|client|estimator``; never by the pure core. A user who
sets glibc's own ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` keeps those settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's ceiling for this setting (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 * 2**20
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_for_streaming(env: Mapping[str, str], mmap_threshold: int = MMAP_THRESHOLD,
                       trim_threshold: int = TRIM_THRESHOLD) -> str:
    """Keep freed chunk buffers in the heap; returns what was done, for the process's start-up log line."""
    if any(k in env for k in USER_SETTINGS):
        return "malloc: left as set in the environment"
    if not sys.platform.startswith("linux"):
        return "malloc: not glibc, left alone"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return "malloc: no mallopt, left alone"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1
    if not ok:
        return "malloc: mallopt refused the settings, left alone"
    return f"malloc: mmap threshold {mmap_threshold >> 20} MiB, trim threshold {trim_threshold >> 20} MiB"
