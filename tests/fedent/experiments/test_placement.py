"""reproduce's pool workers spread over the visible GPUs, one each, round-robin (faked device lists: no GPU needed)."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

from fedent.config import ConfigError
from fedent.experiments.placement import parse_gpus, take_slot, visible_gpus
from fedent.experiments.reproduce import init_worker


def test_visible_gpus_reads_cuda_visible_devices_else_the_count() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 5"}, count=8) == ["2", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, count=8) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, count=8) == []
    assert visible_gpus({}, count=3) == ["0", "1", "2"]


def test_parse_gpus() -> None:
    assert parse_gpus("auto", {}, 2) == ["0", "1"]
    assert parse_gpus("none", {}, 2) == []
    assert parse_gpus("3,1", {}, 0) == ["3", "1"]
    with pytest.raises(ConfigError, match="--gpus"):
        parse_gpus("1,,2")


def test_slots_go_round_robin_over_the_gpus() -> None:
    counter = get_context("spawn").Value("i", 0)
    env: dict[str, str] = {}
    got = []
    for _ in range(5):
        got.append(take_slot(counter, ["4", "6"], env))
        assert env["CUDA_VISIBLE_DEVICES"] == got[-1]
    assert got == ["4", "6", "4", "6", "4"]
    assert take_slot(counter, [], env) is None and take_slot(None, ["1"], env) is None


def test_pool_workers_start_on_their_gpu() -> None:
    """The initializer run_plan gives its pool: each spawned worker's CUDA_VISIBLE_DEVICES is one of the slots."""
    ctx = get_context("spawn")
    counter = ctx.Value("i", 0)
    with ProcessPoolExecutor(2, mp_context=ctx, initializer=init_worker, initargs=(1, counter, ("7", "9"))) as pool:
        seen = {f.result() for f in [pool.submit(os.getenv, "CUDA_VISIBLE_DEVICES") for _ in range(6)]}
    assert seen and seen <= {"7", "9"}
    assert counter.value == len(seen) or counter.value == 2  # one slot taken per worker started
