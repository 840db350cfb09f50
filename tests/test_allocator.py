"""Process-level memory tuning for tensor streaming: mallopt at start-up and the receive-buffer prefault."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from fedentrpc import allocator

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc/Linux only")


def test_user_malloc_settings_and_the_opt_out_win() -> None:
    assert "left as set" in allocator.tune_for_streaming({"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert "glibc's defaults" in allocator.tune_for_streaming({"FEDENT_MALLOC_TUNING": "off"})


@linux_only
def test_tuning_applies_in_a_fresh_process() -> None:
    code = "import os; from fedentrpc.allocator import tune_for_streaming as t; print(t({}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "malloc: mmap threshold 32 MiB, trim threshold 256 MiB"


@linux_only
def test_prefault_runs_for_large_buffers_only_and_never_changes_contents() -> None:
    small = torch.empty(1024, dtype=torch.uint8)
    assert allocator.prefault_async(small) is None
    big = torch.empty(allocator.PREFAULT_MIN_BYTES + 12345, dtype=torch.uint8)
    big[:4096].fill_(7)  # written before the prefault: must survive it
    pf = allocator.prefault_async(big)
    assert pf is not None
    pf.advance(big.numel())
    big[-4096:].fill_(9)  # written while it may still be running
    pf.thread.join(10)
    assert not pf.thread.is_alive()
    assert int(big[:4096].min()) == 7 and int(big[-4096:].min()) == 9


def test_prefault_stays_a_window_ahead_of_the_received_bytes_and_stops_on_close() -> None:
    calls: list[tuple[int, int]] = []

    def fake_madvise(addr: int, length: int, advice: int) -> int:
        assert advice == allocator.MADV_POPULATE_WRITE
        calls.append((addr, length))
        return 0

    step, window = 1 << 20, 4 << 20
    buf = torch.empty(64 << 20, dtype=torch.uint8)  # a header promised 64 MiB ...
    pf = allocator.Prefaulter(buf, fake_madvise, step=step, window=window, idle_s=5)
    time.sleep(0.3)
    assert len(calls) == window // step  # ... but nothing arrived: only the window is populated
    pf.advance(3 * step)
    time.sleep(0.3)
    assert len(calls) == window // step + 3
    assert all(b[0] - a[0] == step for a, b in zip(calls, calls[1:], strict=False))  # front to back, in steps
    pf.close()
    pf.thread.join(5)
    assert not pf.thread.is_alive() and len(calls) == window // step + 3
