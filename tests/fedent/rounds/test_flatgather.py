"""The flat all-gather: every array comes back bit for bit, with its own client, whole, through real gloo ranks
that own different numbers of clients with different-size tensors (one rank's buffer padded)."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from distributed_support import gather_main, ragged_updates
from torch import nn

from fedent.distributed import World, WorldError, free_port
from fedent.rounds.flatgather import Slot, _Packer, all_gather_flat, fill


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())


def _same_update(got: Any, want: Any) -> None:
    assert (got.cid, got.num_samples, got.scalars, got.codes) == (want.cid, want.num_samples, want.scalars, {})
    assert str(got.train_loss) == str(want.train_loss)  # -0.0 stays -0.0
    pairs = [(got.params, want.params)] + [(got.tensors[k], want.tensors[k]) for k in want.tensors]
    assert list(got.tensors) == list(want.tensors)
    for g, w in pairs:
        assert len(g) == len(w)
        for a, b in zip(g, w, strict=True):
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
            assert _bits(a) == _bits(b)  # exact, NaN payloads included
    if want.masked is None:
        assert got.masked is None
    else:
        assert got.masked.dtype == want.masked.dtype and np.array_equal(got.masked, want.masked)


@pytest.fixture(scope="module")
def gathered(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[dict[int, Any], dict[int, str], dict[int, Any]]]:
    out = tmp_path_factory.mktemp("flat")
    mp.spawn(gather_main, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(2)]


@pytest.mark.parametrize("rank", [0, 1])
def test_two_gloo_ranks_get_every_clients_arrays_whole_and_in_place(
        gathered: list[tuple[dict[int, Any], dict[int, str], dict[int, Any]]], rank: int) -> None:
    """Rank 0 owns 3 small clients, rank 1 two (one large): a swap between clients, a shift by the padding or
    a truncation to the shorter rank's length would change some client's bytes; so would stale bytes of the
    first gather read by the second (the same kept buffers, the other rank padded)."""
    results, failed, again = gathered[rank]
    want = {**ragged_updates(0), **ragged_updates(1)}
    for got in (results, again):
        assert list(got) == [0, 1, 2, 3, 4]
        for cid, w in want.items():
            _same_update(got[cid], w)
    assert failed == {9: "rank 1 lost it"}


def test_round_trip_keeps_dtypes_shapes_flags_and_fields() -> None:
    @dataclasses.dataclass(frozen=True)
    class Box:
        a: Any
        note: str
        extra: Any = dataclasses.field(default=None, init=False)

    param = nn.Parameter(torch.ones(2))
    box = Box({"x": [torch.arange(6, dtype=torch.int64).view(2, 3).t(), torch.tensor(-0.0)],
               "y": (np.array([[1.5, -2]], dtype=np.float16), b"raw", param),
               "z": torch.tensor([1 + 2j, 3 - 1j]).conj()}, "kept")
    object.__setattr__(box, "extra", torch.ones(3, requires_grad=True))
    packer = _Packer()
    skel = packer.strip(box)
    assert isinstance(skel.a["x"][0], Slot) and skel.a["y"][1] == b"raw" and skel.a["y"][2] is param
    buf = torch.empty(packer.length + 5, dtype=torch.uint8)
    packer.write(buf)
    got = fill(skel, buf)
    assert type(got) is Box and got.note == "kept" and got.a["y"][2] is param
    assert torch.equal(got.a["x"][0], box.a["x"][0]) and got.a["x"][0].dtype == torch.int64
    assert _bits(got.a["x"][1]) == _bits(torch.tensor(-0.0))
    assert got.a["y"][0].dtype == np.float16 and np.array_equal(got.a["y"][0], box.a["y"][0])
    assert torch.equal(got.a["z"], torch.tensor([1 - 2j, 3 + 1j])) and not got.a["z"].is_conj()
    assert got.extra.requires_grad and torch.equal(got.extra.detach(), torch.ones(3))
    assert box.a["x"][0] is not got.a["x"][0]  # the input is never changed


def test_a_buffer_shorter_than_its_slots_is_an_error() -> None:
    packer = _Packer()
    skel = packer.strip([torch.ones(4)])
    buf = torch.empty(packer.length, dtype=torch.uint8)
    packer.write(buf)
    with pytest.raises(WorldError, match="ends before"):
        fill(skel, buf[:-1])


def test_one_process_gets_its_object_back_untouched(tmp_path: Path) -> None:
    obj = {1: [torch.ones(2)]}
    assert all_gather_flat(World(), obj)[0] is obj
