"""The receive pool: a decoded stream's buffer is reused by the next stream of its size only once every
tensor viewing it is gone; it is bounded; a failed stream gives its buffer back too."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from fedentrpc import codec
from fedentrpc.codec import TransferSpec, WireError, decode_tensors, encode_tensors
from fedentrpc.receive_pool import RECEIVE_POOL, ReceivePool

MIB = 2**20


@pytest.fixture(autouse=True)
def _empty_pool() -> Iterator[None]:
    gc.collect()
    RECEIVE_POOL.clear()
    yield
    gc.collect()
    RECEIVE_POOL.clear()


def _model(seed: float) -> dict[str, list[torch.Tensor]]:
    """3 MiB in two tensors: over the pool's 1 MiB floor."""
    return {"params": [torch.arange(2**19, dtype=torch.float32).add_(seed), torch.full((2**18,), seed)]}


def _base_ptr(out: dict[str, list[torch.Tensor]]) -> int:
    return out["params"][0].untyped_storage().data_ptr()


def test_a_freed_streams_buffer_takes_the_next_stream_of_its_size() -> None:
    first = decode_tensors(encode_tensors(_model(1.0)))
    ptr = _base_ptr(first)
    assert RECEIVE_POOL.idle_bytes == 0
    del first
    gc.collect()
    assert RECEIVE_POOL.idle_bytes == 3 * MIB
    second = decode_tensors(encode_tensors(_model(2.0)))
    assert _base_ptr(second) == ptr and RECEIVE_POOL.idle_bytes == 0
    for got, want in zip(second["params"], _model(2.0)["params"], strict=True):
        assert torch.equal(got, want)


def test_a_buffer_is_never_reused_while_one_of_its_tensors_lives() -> None:
    first = decode_tensors(encode_tensors(_model(1.0)))
    kept = first["params"][1]  # one view of the buffer outlives the others
    del first
    gc.collect()
    assert RECEIVE_POOL.idle_bytes == 0
    second = decode_tensors(encode_tensors(_model(2.0)))
    assert second["params"][1].untyped_storage().data_ptr() != kept.untyped_storage().data_ptr()
    assert torch.equal(kept, torch.full((2**18,), 1.0))  # not overwritten by the second stream
    del second
    gc.collect()
    assert RECEIVE_POOL.idle_bytes == 3 * MIB  # the second stream's buffer; the first is still held
    del kept
    gc.collect()
    assert RECEIVE_POOL.idle_bytes == 6 * MIB


def test_a_failed_stream_gives_its_buffer_back() -> None:
    chunks = list(encode_tensors(_model(1.0), TransferSpec(chunk_bytes=MIB)))
    chunks[2].checksum ^= 1
    with pytest.raises(WireError, match="chunk 2: checksum mismatch"):
        decode_tensors(chunks)
    gc.collect()
    assert RECEIVE_POOL.idle_bytes == 3 * MIB
    again = decode_tensors(encode_tensors(_model(3.0)))  # the recycled buffer is wholly rewritten
    for got, want in zip(again["params"], _model(3.0)["params"], strict=True):
        assert torch.equal(got, want)


def test_small_streams_are_left_to_malloc() -> None:
    out = decode_tensors(encode_tensors({"params": [torch.ones(1000)]}))
    del out
    gc.collect()
    assert RECEIVE_POOL.idle_bytes == 0


def test_the_pool_is_bounded_and_keeps_the_latest_sizes() -> None:
    pool = ReceivePool(max_idle_bytes=6 * MIB, min_bytes=MIB)
    a, _ = pool.take(2 * MIB)
    b, _ = pool.take(3 * MIB)
    c, _ = pool.take(4 * MIB)
    small, _ = pool.take(1000)
    del a, b, small
    gc.collect()
    assert pool.idle_bytes == 5 * MIB
    del c  # 4 MiB more passes the bound: the longest idle (2 MiB), then 3 MiB, make room
    gc.collect()
    assert pool.idle_bytes == 4 * MIB
    big, _ = pool.take(7 * MIB)
    del big  # larger than the bound alone: not kept
    gc.collect()
    assert pool.idle_bytes == 4 * MIB
    again, mem = pool.take(4 * MIB)
    assert pool.idle_bytes == 0 and again.data_ptr() == mem.ctypes.data


def test_the_codec_draws_from_the_shared_pool() -> None:
    assert codec.RECEIVE_POOL is RECEIVE_POOL
