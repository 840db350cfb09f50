"""Process-level memory tuning for tensor streaming: mallopt at start-up and the receive-buffer prefault."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fedentrpc import allocator

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc/Linux only")


def test_user_malloc_settings_win() -> None:
    assert "left as set" in allocator.tune_for_streaming({"MALLOC_TRIM_THRESHOLD_": "131072"})


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
    th = allocator.prefault_async(big)
    assert th is not None
    big[-4096:].fill_(9)  # written while it may still be running
    th.join(10)
    assert not th.is_alive()
    assert int(big[:4096].min()) == 7 and int(big[-4096:].min()) == 9
