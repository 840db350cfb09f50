"""The tensor codec and the message mappers: exact round trips, chunking below 4 MiB, lossy casts, per-chunk
checksums, and clear errors on bad input (corrupt, truncated, reordered, oversized, zlib bombs)."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch

from fedent.strategies.base import ClientUpdate, Probe, RoundPayload
from fedentrpc import codec, mappers
from fedentrpc.codec import TransferSpec, WireError, decode_tensors, encode_tensors
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import tensor_pb2 as pb


def _bundle() -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return {
        "params": [torch.randn(3, 4, generator=g), torch.randn(5, generator=g), torch.zeros(0)],
        "extra": [torch.arange(7, dtype=torch.int64), torch.tensor([True, False]), torch.randn(2, 2).double()],
    }


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_native_round_trip_is_exact(compression: str) -> None:
    b = _bundle()
    out = decode_tensors(encode_tensors(b, TransferSpec(compression=compression, chunk_bytes=16)))
    assert list(out) == ["params", "extra"]
    for name in b:
        for x, y in zip(b[name], out[name], strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x, y)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_half_precision_casts_floats_only(wire: str) -> None:
    b = _bundle()
    enc = encode_tensors(b, TransferSpec(wire_dtype=wire))
    out = decode_tensors(enc)
    assert enc.raw_bytes < encode_tensors(b).raw_bytes
    assert out["params"][0].dtype == torch.float32
    assert torch.allclose(out["params"][0], b["params"][0], rtol=1e-2, atol=1e-2)
    assert not torch.equal(out["params"][0], b["params"][0])  # it really was cast
    assert torch.equal(out["extra"][0], b["extra"][0])  # integers travel exactly


def test_large_model_is_chunked_at_most_4mib() -> None:
    big = {"params": [torch.randn(3 * 1024 * 1024)]}  # 12 MiB of float32
    enc = encode_tensors(big)
    assert len(enc.chunks) == 3
    assert all(len(c.data) <= codec.MAX_CHUNK_BYTES for c in enc.chunks)
    assert all(c.ByteSize() < 4 * 1024 * 1024 + 1024 for c in enc.chunks)
    assert torch.equal(decode_tensors(enc)["params"][0], big["params"][0])


def test_corrupted_bytes_fail_the_checksum() -> None:
    chunks = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors(_bundle())]
    data = bytearray(chunks[0].data)
    data[5] ^= 0xFF
    chunks[0].data = bytes(data)
    with pytest.raises(WireError, match="checksum"):
        decode_tensors(chunks)


def test_truncated_and_reordered_streams_are_rejected() -> None:
    chunks = list(encode_tensors(_bundle(), TransferSpec(chunk_bytes=32)))
    with pytest.raises(WireError, match="truncated"):
        decode_tensors(chunks[:-1])
    with pytest.raises(WireError, match="out of order"):
        decode_tensors([chunks[1], chunks[0], *chunks[2:]])
    with pytest.raises(WireError, match="empty"):
        decode_tensors([])


def test_header_that_lies_about_shapes_is_rejected() -> None:
    chunks = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors({"p": [torch.ones(4)]})]
    chunks[0].header.tensors[0].shape[:] = [5]
    with pytest.raises(WireError, match="shorter"):
        decode_tensors(chunks)


def test_transfer_spec_validates() -> None:
    with pytest.raises(ValueError, match="wire_dtype"):
        TransferSpec(wire_dtype="int4")
    with pytest.raises(ValueError, match="chunk_bytes"):
        TransferSpec(chunk_bytes=8 * 1024 * 1024)
    spec = TransferSpec(wire_dtype="bfloat16", compression="zlib", chunk_bytes=1024)
    assert mappers.transfer_from_msg(mappers.transfer_to_msg(spec)) == spec


def test_update_round_trip() -> None:
    u = ClientUpdate(cid=7, params=[torch.randn(2, 3)], num_samples=40, train_loss=0.5,
                     tensors={"delta_c": [torch.ones(2)]}, scalars={"eta": 0.01})
    meta = mappers.UpdateMeta(worker_id="w1", task_id=3, round=2)
    dec = mappers.update_from_parts(list(mappers.update_to_parts(u, meta)))
    assert dec.meta.worker_id == "w1" and dec.meta.round == 2 and dec.meta.task_id == 3
    assert dec.update.cid == 7 and dec.update.num_samples == 40 and dec.update.scalars == {"eta": 0.01}
    assert torch.equal(dec.update.params[0], u.params[0])
    assert torch.equal(dec.update.tensors["delta_c"][0], u.tensors["delta_c"][0])


def test_update_without_header_is_rejected() -> None:
    u = ClientUpdate(cid=1, params=[torch.ones(1)], num_samples=1, train_loss=0.0)
    parts = list(mappers.update_to_parts(u, mappers.UpdateMeta("w", 1, 0)))
    with pytest.raises(WireError, match="header"):
        mappers.update_from_parts(parts[1:])


def test_probe_and_payload_round_trip() -> None:
    p = Probe(cid=4, num_samples=12, scalars={"a": 1.5, "b": 2.0})
    assert mappers.probe_from_msg(mappers.probe_to_msg(p)) == p
    rp = RoundPayload(round=3, scalars={"phi2_next": 4.0}, per_client={4: {"eta_prev": 0.1}})
    back = mappers.payload_from_msg(mappers.payload_to_msg(rp, "blob-x"))
    assert back == rp


def test_check_shapes() -> None:
    codec.check_shapes([torch.ones(2)], [torch.zeros(2)], "u")
    with pytest.raises(WireError, match="expected"):
        codec.check_shapes([torch.ones(3)], [torch.zeros(2)], "u")


def test_unaligned_offsets_decode_to_independent_tensors() -> None:
    b = {"flags": [torch.tensor([True, False, True])], "w": [torch.randn(5)], "i": [torch.arange(3)]}
    out = decode_tensors(encode_tensors(b))
    assert all(torch.equal(b[k][0], out[k][0]) for k in b)
    out["w"][0].add_(1.0)  # in-place on one decoded tensor leaves its neighbours alone
    assert torch.equal(out["i"][0], torch.arange(3)) and torch.equal(out["flags"][0], b["flags"][0])


@pytest.mark.parametrize("algo", ["crc32c", "crc32"])
@pytest.mark.parametrize("chunk_bytes", [1, 5, 7, 64, codec.MAX_CHUNK_BYTES])
def test_either_checksum_round_trips_across_odd_chunk_boundaries(algo: str, chunk_bytes: int) -> None:
    b = _bundle()
    enc = encode_tensors(b, TransferSpec(chunk_bytes=chunk_bytes, checksum=algo))
    header = enc.chunks[0].header
    assert header.checksum_algorithm == codec.CHECKSUMS[algo]
    assert all(c.checksum == codec.checksum(algo, c.data) for c in enc.chunks)
    assert header.num_chunks == len(enc.chunks)
    assert b"".join(c.data for c in enc.chunks) == b"".join(
        bytes(codec._tensor_u8(t, pb.WIRE_DTYPE_NATIVE)) for ts in b.values() for t in ts
    )
    assert all(len(c.data) == chunk_bytes for c in enc.chunks[:-1]) and 0 < len(enc.chunks[-1].data) <= chunk_bytes
    out = decode_tensors(enc)
    for name in b:
        assert all(torch.equal(x, y) for x, y in zip(b[name], out[name], strict=True))


@pytest.mark.parametrize("algo", ["crc32c", "crc32"])
def test_a_flipped_bit_in_a_later_chunk_fails_either_checksum(algo: str) -> None:
    chunks = [pb.TensorChunk.FromString(c.SerializeToString())
              for c in encode_tensors(_bundle(), TransferSpec(chunk_bytes=8, checksum=algo))]
    data = bytearray(chunks[3].data)
    data[2] ^= 0x01
    chunks[3].data = bytes(data)
    with pytest.raises(WireError, match="checksum"):
        decode_tensors(chunks)


def test_unknown_checksum_algorithm_is_a_wire_error() -> None:
    chunks = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors(_bundle())]
    for value, name in ((pb.CHECKSUM_ALGORITHM_UNSPECIFIED, "CHECKSUM_ALGORITHM_UNSPECIFIED"), (9, "value 9")):
        chunks[0].header.checksum_algorithm = value  # type: ignore[assignment]
        with pytest.raises(WireError, match=f"unknown tensor checksum algorithm {name}"):
            decode_tensors(chunks)
    for name in ("md5", "blake2b"):
        with pytest.raises(ValueError, match="checksum"):
            TransferSpec(checksum=name)


def test_assembler_reports_wire_bytes_after_finishing() -> None:
    enc = encode_tensors(_bundle(), TransferSpec(chunk_bytes=16, compression="zlib"))
    asm = codec.TensorAssembler()
    for c in enc:
        asm.add(c)
    asm.finish()
    assert asm.wire_bytes == enc.wire_bytes == sum(len(c.data) for c in enc.chunks)


def test_empty_bundle_round_trips() -> None:
    enc = encode_tensors({"params": []})
    assert len(enc.chunks) == 1 and enc.wire_bytes == 0
    assert decode_tensors(enc) == {"params": []}


@pytest.mark.parametrize("algo", ["crc32c", "crc32"])
def test_a_corrupted_chunk_is_named(algo: str) -> None:
    big = {"params": [torch.randn(600_000)]}  # 2.4 MB in 1 MiB chunks
    chunks = [pb.TensorChunk.FromString(c.SerializeToString())
              for c in encode_tensors(big, TransferSpec(chunk_bytes=2**20, checksum=algo))]
    assert len(chunks) == 3
    data = bytearray(chunks[1].data)
    data[100] ^= 0x10
    chunks[1].data = bytes(data)
    with pytest.raises(WireError, match="chunk 1: checksum mismatch"):
        decode_tensors(chunks)


def test_crc32c_is_the_default_and_matches_the_standard_check_value() -> None:
    assert TransferSpec().checksum == ("crc32c" if codec.google_crc32c.implementation == "c" else "crc32")
    assert codec.checksum("crc32c", b"123456789") == 0xE3069283  # RFC 3720 B.4 check value
    assert codec.checksum("crc32", b"123456789") == 0xCBF43926


def test_a_chunk_without_its_checksum_is_rejected() -> None:
    chunks = [pb.TensorChunk.FromString(c.SerializeToString())
              for c in encode_tensors(_bundle(), TransferSpec(chunk_bytes=32))]
    chunks[1].ClearField("checksum")
    with pytest.raises(WireError, match="chunk 1: checksum mismatch"):
        decode_tensors(chunks)


def test_a_header_claiming_too_many_bytes_fails_before_allocating() -> None:
    chunks = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors(_bundle())]
    with pytest.raises(WireError, match="exceeds this receiver's limit of 100"):
        decode_tensors(chunks, max_bytes=100)
    chunks[0].header.wire_bytes = chunks[0].header.raw_bytes = 2**62
    with pytest.raises(WireError, match="cannot travel in 1 chunks"):
        decode_tensors(chunks, max_bytes=2**63)


def test_a_zlib_bomb_is_stopped_at_the_headers_raw_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is on the memory, not just the message: the decompressor is never allowed to produce more than
    the header's raw size + 1 bytes (a 4 GB bomb must not be inflated before it is refused)."""
    enc = encode_tensors({"params": [torch.zeros(100_000)]}, TransferSpec(compression="zlib"))
    chunks = [pb.TensorChunk.FromString(c.SerializeToString()) for c in enc]
    chunks[0].header.raw_bytes = 400  # the payload inflates to 400,000 bytes
    produced: list[int] = []
    real = zlib.decompressobj

    class Measured:
        def __init__(self) -> None:
            self._d = real()

        def decompress(self, data: object, *args: int) -> bytes:
            out = self._d.decompress(data, *args)
            produced.append(len(out))
            return out

        def __getattr__(self, name: str) -> object:
            return getattr(self._d, name)

    monkeypatch.setattr(codec.zlib, "decompressobj", Measured)
    with pytest.raises(WireError, match="inflates past the header's 400 bytes"):
        decode_tensors(chunks)
    assert produced and sum(produced) <= 401, produced


def test_every_chunk_but_too_few_bytes_is_rejected_not_padded_with_stale_bytes() -> None:
    """A stream whose chunks all arrive but carry fewer bytes than the header says is refused: the receive
    buffer is sized from the header and may be recycled, so the missing tail would be an earlier stream's."""
    big = {"p": [torch.arange(2**19, dtype=torch.float32)]}  # 2 MiB: its buffer comes from the receive pool
    spec = TransferSpec(chunk_bytes=2**20)
    first = decode_tensors(encode_tensors(big, spec))
    assert torch.equal(first["p"][0], big["p"][0])
    del first  # its buffer goes back to the pool, holding the old bytes
    short = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors(big, spec)]
    short[-1].data = short[-1].data[: len(short[-1].data) // 2]
    short[-1].checksum = codec.checksum(codec.DEFAULT_CHECKSUM, short[-1].data)
    with pytest.raises(WireError, match=r"tensor stream short: its 2 chunks carried 1572864 of the header's "
                                        r"2097152 bytes"):
        decode_tensors(short)
    # and the converse: every byte, but in fewer chunks than the header announced
    fewer = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors(big, spec)]
    fewer[0].header.num_chunks = 3
    with pytest.raises(WireError, match="tensor stream truncated: 2 of 3 chunks, 2097152 of 2097152 bytes"):
        decode_tensors(fewer)
    asm = codec.TensorAssembler(keep_payload=False)  # the verify-only path refuses it too
    for c in short:
        asm.add(c)
    with pytest.raises(WireError, match="tensor stream short"):
        asm.verify()


def test_stream_tensors_fails_on_bad_input_before_the_first_chunk_and_equals_encode() -> None:
    with pytest.raises(WireError, match="dtype"):
        codec.stream_tensors({"p": [torch.zeros(2, dtype=torch.complex64)]}, est_pb.PutBlobRequest)
    b = _bundle()
    spec = TransferSpec(chunk_bytes=24)
    streamed = list(codec.stream_tensors(b, est_pb.PutBlobRequest, spec))
    assert all(type(m) is est_pb.PutBlobRequest for m in streamed)
    assert [m.chunk.SerializeToString() for m in streamed] == [c.SerializeToString() for c in encode_tensors(b, spec)]
    kept = encode_tensors(b, spec, est_pb.EstimatorServiceFetchBlobResponse)
    assert kept.as_messages(est_pb.EstimatorServiceFetchBlobResponse)[0].chunk == streamed[0].chunk


def test_encoded_tensors_rewrap_once_into_a_servers_response_messages() -> None:
    """An uploaded blob (kept as its PutBlobRequests) is re-wrapped for FetchBlob once, then kept that way."""
    spec = TransferSpec(chunk_bytes=24)
    received = list(codec.stream_tensors(_bundle(), est_pb.PutBlobRequest, spec))
    enc = codec.EncodedTensors(received, 0, 0)
    first = enc.as_messages(est_pb.EstimatorServiceFetchBlobResponse)
    assert [m.chunk for m in first] == [m.chunk for m in received]
    assert enc.as_messages(est_pb.EstimatorServiceFetchBlobResponse) is first  # no second copy
    assert [c.SerializeToString() for c in enc.chunks] == [m.chunk.SerializeToString() for m in received]


@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_verify_only_checks_everything_without_building_tensors(compression: str) -> None:
    spec = TransferSpec(chunk_bytes=16, compression=compression)

    def verify(chunks: list[pb.TensorChunk]) -> pb.TensorListHeader:
        asm = codec.TensorAssembler(keep_payload=False)
        for c in chunks:
            asm.add(c)
        return asm.verify()

    good = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors(_bundle(), spec)]
    assert verify(good).raw_bytes == encode_tensors(_bundle()).raw_bytes
    lying = [pb.TensorChunk.FromString(c.SerializeToString()) for c in good]
    lying[0].header.tensors[0].shape[:] = [3, 5]
    with pytest.raises(WireError, match="shorter|trailing|inflates"):
        verify(lying)
    corrupt = [pb.TensorChunk.FromString(c.SerializeToString()) for c in good]
    corrupt[-1].data = bytes(len(corrupt[-1].data))
    with pytest.raises(WireError, match="checksum mismatch"):
        verify(corrupt)
    with pytest.raises(WireError, match="truncated"):
        verify(good[:-1])
    asm = codec.TensorAssembler(keep_payload=False)
    for c in good:
        asm.add(c)
    if compression == "none":
        with pytest.raises(WireError, match="only verifies"):
            asm.finish()


def test_update_and_oracle_chunks_are_the_plain_chunks_written_in_place() -> None:
    """The mappers write each chunk into its outer message's oneof: the same bytes as the plain stream."""
    params = [torch.randn(40), torch.arange(5)]
    spec = TransferSpec(chunk_bytes=64)
    plain = [c.SerializeToString() for c in encode_tensors({"params": params}, spec)]
    u = ClientUpdate(cid=2, params=params, num_samples=3, train_loss=0.0)
    parts = list(mappers.update_to_parts(u, mappers.UpdateMeta("w", 1, 0), spec))
    assert parts[0].WhichOneof("part") == "header" and all(p.WhichOneof("part") == "chunk" for p in parts[1:])
    assert [p.chunk.SerializeToString() for p in parts[1:]] == plain
    msgs = list(mappers.oracle_result_messages(7, 2, 3, params, spec))
    assert msgs[0].WhichOneof("kind") == "result" and msgs[0].result.request_id == 7
    grads = [c.SerializeToString() for c in encode_tensors({"grad": params}, spec)]
    assert [m.chunk.SerializeToString() for m in msgs[1:]] == grads
    assert torch.equal(decode_tensors([m.chunk for m in msgs[1:]])["grad"][0], params[0])
    with pytest.raises(WireError, match="dtype"):
        next(mappers.oracle_result_messages(7, 2, 3, [torch.zeros(1, dtype=torch.complex64)]))


def test_a_chunk_over_4mib_or_past_the_header_is_refused() -> None:
    chunks = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors({"p": [torch.ones(4)]})]
    chunks[0].data = bytes(codec.MAX_CHUNK_BYTES + 1)
    with pytest.raises(WireError, match="exceeds"):
        decode_tensors(chunks)
    extra = pb.TensorChunk(index=1, data=b"x", checksum=codec.checksum("crc32c", b"x"))
    good = [pb.TensorChunk.FromString(c.SerializeToString()) for c in encode_tensors({"p": [torch.ones(4)]})]
    with pytest.raises(WireError, match="more tensor chunks"):
        decode_tensors([*good, extra])


# ---- boundaries and exact messages (issue 31: each check of the decoder has a test that fails without it) ----


def _copy(enc: codec.EncodedTensors) -> list[pb.TensorChunk]:
    return [pb.TensorChunk.FromString(c.SerializeToString()) for c in enc]


def test_limits_are_inclusive_a_stream_of_exactly_max_bytes_and_a_chunk_of_exactly_4mib_pass() -> None:
    big = {"p": [torch.arange(2**20, dtype=torch.float32)]}  # exactly 4 MiB: one full chunk
    enc = encode_tensors(big)
    assert len(enc.chunks) == 1 and len(enc.chunks[0].data) == codec.MAX_CHUNK_BYTES
    assert torch.equal(decode_tensors(enc, max_bytes=codec.MAX_CHUNK_BYTES)["p"][0], big["p"][0])
    with pytest.raises(WireError, match=f"^tensor stream of {2**22} bytes exceeds this receiver's limit of "
                                        f"{2**22 - 1}$"):
        decode_tensors(enc, max_bytes=codec.MAX_CHUNK_BYTES - 1)
    small = encode_tensors({"p": [torch.ones(4)]}, TransferSpec(compression="zlib"))
    assert small.raw_bytes == 16 and decode_tensors(small, max_bytes=16)["p"][0].tolist() == [1.0] * 4
    with pytest.raises(WireError, match="^tensor stream of 16 bytes exceeds this receiver's limit of 15$"):
        decode_tensors(small, max_bytes=15)


def test_zlib_edge_cases_empty_truncated_and_garbage() -> None:
    empty = encode_tensors({"params": [torch.zeros(0)]}, TransferSpec(compression="zlib"))
    out = decode_tensors(empty)["params"][0]
    assert out.shape == (0,) and out.dtype == torch.float32
    enc = _copy(encode_tensors({"p": [torch.randn(50)]}, TransferSpec(compression="zlib")))
    cut = [pb.TensorChunk.FromString(c.SerializeToString()) for c in enc]
    cut[0].data = cut[0].data[:-6]
    cut[0].header.wire_bytes = len(cut[0].data)
    cut[0].checksum = codec.checksum(codec.DEFAULT_CHECKSUM, cut[0].data)
    with pytest.raises(WireError, match=r"^bad zlib payload \(truncated\)$"):
        decode_tensors(cut)
    bad = [pb.TensorChunk.FromString(c.SerializeToString()) for c in enc]
    bad[0].data = b"\x00" * len(bad[0].data)
    bad[0].checksum = codec.checksum(codec.DEFAULT_CHECKSUM, bad[0].data)
    with pytest.raises(WireError, match=r"^bad zlib payload \(Error -3 while decompressing data: .+\)$"):
        decode_tensors(bad)
    short = [pb.TensorChunk.FromString(c.SerializeToString()) for c in enc]
    short[0].header.raw_bytes = 400  # inflates to 200 bytes, not the 400 the header says
    with pytest.raises(WireError, match="^tensor payload is 200 bytes, header says 400$"):
        decode_tensors(short)


def test_aligned_tensors_are_views_of_one_received_buffer() -> None:
    b = {"w": [torch.randn(4), torch.randn(4)], "i": [torch.arange(2)]}  # the int64 at byte 32: aligned
    out = decode_tensors(encode_tensors(b))
    ptrs = {t.untyped_storage().data_ptr() for ts in out.values() for t in ts}
    assert len(ptrs) == 1  # decoded in place: nothing copied out of the buffer
    assert [tuple(t.shape) for t in out["w"]] == [(4,), (4,)] and out["i"][0].tolist() == [0, 1]
    assert all(torch.equal(x, y) for x, y in zip(b["w"], out["w"], strict=True))


def test_every_header_check_says_what_is_wrong() -> None:
    def bad(mutate: Any, message: str, bundle: dict[str, list[torch.Tensor]] | None = None,
            spec: TransferSpec | None = None) -> None:
        chunks = _copy(encode_tensors(bundle or {"p": [torch.ones(4)], "q": [torch.ones(2)]}, spec))
        mutate(chunks)
        with pytest.raises(WireError, match=message):
            decode_tensors(chunks)

    def setattr_(field: str, value: object) -> Any:
        return lambda cs: setattr(cs[0].header, field, value)

    bad(lambda cs: cs[0].header.tensors[0].shape.__setitem__(slice(None), [-4]),
        r"^negative dimension in shape \[-4\]$")
    bad(lambda cs: setattr(cs[0].header.groups[1], "name", "p"), "^duplicate tensor group names$")
    bad(lambda cs: setattr(cs[0].header.groups[1], "count", 2), "^tensor groups do not cover the tensor list$")
    bad(lambda cs: setattr(cs[0].header.tensors[0], "dtype", pb.DTYPE_UNSPECIFIED),
        "^unknown tensor dtype DTYPE_UNSPECIFIED$")
    bad(setattr_("wire_dtype", 77), "^unknown wire dtype value 77$")
    bad(setattr_("compression", pb.COMPRESSION_UNSPECIFIED), "^unknown compression COMPRESSION_UNSPECIFIED$")
    bad(setattr_("num_chunks", 0), "^tensor header: 24 bytes cannot travel in 0 chunks$")
    bad(setattr_("num_chunks", 25), "^tensor header: 25 chunks for 24 bytes$")
    bad(setattr_("raw_bytes", 23), r"^uncompressed tensor stream: raw 23 != wire 24 bytes$")
    bad(lambda cs: cs[0].header.tensors[0].shape.__setitem__(slice(None), [3]), "^tensor payload has 4 trailing bytes$")
    bad(lambda cs: cs[1].header.CopyFrom(cs[0].header), "^only the first tensor chunk may carry a header$",
        spec=TransferSpec(chunk_bytes=8))
    bad(lambda cs: cs[0].ClearField("header"), "^the first tensor chunk carries no header$")
    bad(lambda cs: setattr(cs[0], "data", bytes(codec.MAX_CHUNK_BYTES + 1)),
        f"^tensor chunk of {codec.MAX_CHUNK_BYTES + 1} bytes exceeds {codec.MAX_CHUNK_BYTES}$")
    bad(lambda cs: setattr(cs[1], "index", 2), r"^tensor chunk 2 arrived out of order \(expected 1\)$",
        spec=TransferSpec(chunk_bytes=8))
    bad(lambda cs: setattr(cs[1], "checksum", cs[1].checksum ^ 1),
        r"^tensor chunk 1: checksum mismatch \(corrupted transfer\)$", spec=TransferSpec(chunk_bytes=8))
    with pytest.raises(WireError, match=r"^tensor stream truncated: 2 of 3 chunks, 16 of 24 bytes$"):
        decode_tensors(_copy(encode_tensors({"p": [torch.ones(6)]}, TransferSpec(chunk_bytes=8)))[:2])
    with pytest.raises(WireError, match=r"^cannot send tensors of dtype torch.complex64$"):
        encode_tensors({"p": [torch.zeros(1, dtype=torch.complex64)]})


def test_transfer_spec_bounds_are_inclusive_and_their_messages_exact() -> None:
    for ok in (TransferSpec(zlib_level=0), TransferSpec(zlib_level=9), TransferSpec(chunk_bytes=1),
               TransferSpec(chunk_bytes=codec.MAX_CHUNK_BYTES), TransferSpec(wire_dtype="float16", checksum="crc32")):
        assert ok.compression == "none"
    for kw, message in (({"zlib_level": -1}, "zlib_level must be in [0, 9], got -1"),
                        ({"zlib_level": 10}, "zlib_level must be in [0, 9], got 10"),
                        ({"chunk_bytes": 0}, f"chunk_bytes must be in [1, {codec.MAX_CHUNK_BYTES}], got 0"),
                        ({"compression": "lz4"}, "compression must be one of none, zlib, got 'lz4'"),
                        ({"wire_dtype": "int4"}, "wire_dtype must be one of native, float16, bfloat16, got 'int4'"),
                        ({"checksum": "md5"}, "checksum must be one of crc32c, crc32, got 'md5'")):
        with pytest.raises(ValueError) as err:
            TransferSpec(**kw)  # type: ignore[arg-type]
        assert str(err.value) == message


def test_check_shapes_and_wire_error_fields() -> None:
    with pytest.raises(WireError, match=r"^u: 2 tensors, expected 1$"):
        codec.check_shapes([torch.ones(2), torch.ones(2)], [torch.zeros(2)], "u")
    with pytest.raises(WireError, match=r"^u: tensor 0 is torch.float64 \(2,\), expected torch.float32 \(2,\)$"):
        codec.check_shapes([torch.ones(2, dtype=torch.float64)], [torch.zeros(2)], "u")
    e = WireError("bad value", field="params.variant")
    assert (str(e), e.field, e.why) == ("params.variant: bad value", "params.variant", "bad value")
    e = WireError("ignored", field="f", why="too big")
    assert (str(e), e.field, e.why) == ("f: too big", "f", "too big")
    e = WireError("plain")
    assert (str(e), e.field, e.why) == ("plain", None, "plain")


def test_encoded_sizes_and_bool_and_cpu_tensors() -> None:
    b = {"flags": [torch.tensor([True, False, True, True])], "w": [torch.ones(3, dtype=torch.float64)]}
    enc = encode_tensors(b, TransferSpec(compression="zlib"))
    assert enc.raw_bytes == 4 + 24 and enc.wire_bytes == sum(len(c.data) for c in enc.chunks)
    assert enc.chunks[0].header.raw_bytes == 28 and enc.chunks[0].header.wire_bytes == enc.wire_bytes
    out = decode_tensors(enc)
    assert out["flags"][0].dtype == torch.bool and out["flags"][0].tolist() == [True, False, True, True]
    assert [g.name for g in enc.chunks[0].header.groups] == ["flags", "w"]
    half = decode_tensors(encode_tensors(b, TransferSpec(wire_dtype="float16")))
    assert half["flags"][0].dtype == torch.bool and half["w"][0].dtype == torch.float64


def test_a_non_canonical_bool_byte_decodes_to_a_canonical_true() -> None:
    """A peer may send any byte for a bool: the receiver converts (uint8 -> bool), never reinterprets, so every
    decoded bool is stored as 0 or 1 (a bool byte of 2 is undefined behaviour in torch's kernels)."""
    chunks = _copy(encode_tensors({"flags": [torch.tensor([True, False, True])]}))
    chunks[0].data = bytes([2, 0, 1])
    chunks[0].checksum = codec.checksum(codec.DEFAULT_CHECKSUM, chunks[0].data)
    out = decode_tensors(chunks)["flags"][0]
    assert out.dtype == torch.bool and out.view(torch.uint8).tolist() == [1, 0, 1]


def test_layout_refuses_an_unknown_wire_dtype_itself() -> None:
    """_layout (verify's shape check and the decoder's split) checks the wire dtype on its own, not only the
    assembler's header check before it."""
    h = pb.TensorListHeader(tensors=[pb.TensorSpec(dtype=pb.DTYPE_FLOAT32, shape=[1])],
                            groups=[pb.TensorGroup(name="p", count=1)], wire_dtype=77)  # type: ignore[arg-type]
    with pytest.raises(WireError, match="^unknown wire dtype value 77$"):
        codec._layout(h, 4)


def test_encoded_messages_are_built_in_the_carrier_asked_for() -> None:
    b = _bundle()
    kept = encode_tensors(b, TransferSpec(chunk_bytes=24), est_pb.EstimatorServiceFetchBlobResponse)
    assert all(type(m) is est_pb.EstimatorServiceFetchBlobResponse for m in kept._messages)  # built once, at encode
    bare = encode_tensors(b, TransferSpec(chunk_bytes=24))
    assert all(type(m) is pb.TensorChunk for m in bare._messages)
    received = list(codec.stream_tensors(b, est_pb.PutBlobRequest, TransferSpec(chunk_bytes=24)))
    rewrapped = codec.EncodedTensors(received, 0, 0).as_messages(est_pb.EstimatorServiceFetchBlobResponse)
    assert all(type(m) is est_pb.EstimatorServiceFetchBlobResponse for m in rewrapped)
    assert codec.EncodedTensors([], 0, 0).as_messages(est_pb.PutBlobRequest) == ()
