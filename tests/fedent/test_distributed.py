"""The process group's choices that need no second process: the backend for ranks on GPUs, the reduce mode."""

from __future__ import annotations

import pytest
import torch

from fedent.distributed import World, WorldError, backend_for


def test_ranks_sharing_a_gpu_get_gloo_alone_and_ranks_with_their_own_get_nccl() -> None:
    assert backend_for(gpus=1, local_size=2) == "gloo"  # NCCL refuses two ranks on one device
    assert backend_for(gpus=2, local_size=2) == "cpu:gloo,cuda:nccl"
    assert backend_for(gpus=8, local_size=4) == "cpu:gloo,cuda:nccl"
    assert backend_for(gpus=4, local_size=8) == "gloo"


def test_one_process_keeps_the_reduce_mode_and_reduces_to_itself() -> None:
    world = World.from_env({}, reduce="gather")
    assert not world.distributed and world.reduce == "gather"
    t = torch.arange(3.0)
    assert world.all_reduce_sum(t) is t and t.tolist() == [0.0, 1.0, 2.0]


def test_an_unknown_reduce_mode_is_refused() -> None:
    with pytest.raises(WorldError, match="reduce must be one of auto, gather, sum"):
        World.from_env({}, reduce="mean")  # type: ignore[arg-type]
