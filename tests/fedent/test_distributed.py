"""The process group's choices that need no second process: the backend for ranks on GPUs, the reduce mode."""

from __future__ import annotations

import pytest
import torch

from fedent.distributed import RanksFailed, World, WorldError, backend_for, said


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


def test_a_ranks_failure_travels_bounded_and_names_every_failed_rank() -> None:
    assert said(None) is None
    assert said(ValueError("x" * 2000)) == ("ValueError: " + "x" * 2000)[:500]
    e = RanksFailed(4, [(1, "MemoryError: out"), (3, "KeyError: 'g'")])
    assert isinstance(e, WorldError) and e.failures == [(1, "MemoryError: out"), (3, "KeyError: 'g'")]
    assert str(e) == "rank 1 of 4 failed: MemoryError: out; rank 3 of 4 failed: KeyError: 'g'"


def test_one_process_agree_reraises_its_own_error_and_passes_without_one() -> None:
    World().agree(None)
    with pytest.raises(KeyError, match="mine"):
        World().agree(KeyError("mine"))
