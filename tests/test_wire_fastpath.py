"""The hand-written TensorChunk wire path (fedentrpc.wire, fedentrpc.rpc) against protobuf itself.

What it writes must be byte-for-byte what protobuf writes; what it reads must be what protobuf reads
(and where protobuf refuses bytes, so must it); and a real service and stub must use it end to end.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import torch
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimator.service import EstimatorHandle, create_estimator_service
from estimator.settings import EstimatorSettings
from fedentrpc import convert, rpc, wire
from fedentrpc.options import grpc_options
from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import tensor_pb2 as pb

CASES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
pytestmark = pytest.mark.timeout(120)

headers = st.one_of(st.none(), st.builds(
    pb.TensorListHeader, raw_bytes=st.integers(0, 2**40), wire_bytes=st.integers(0, 2**40),
    num_chunks=st.integers(0, 2**32 - 1), chunk_checksum=st.sampled_from(["", "crc32c", "crc32"]),
    tensors=st.lists(st.builds(pb.TensorSpec, dtype=st.sampled_from(["float32", "int64"]),
                               shape=st.lists(st.integers(0, 9), max_size=3)), max_size=3)))


@CASES
@given(headers, st.integers(0, 2**32 - 1), st.binary(max_size=300), st.text(max_size=20),
       st.integers(1, 4), st.sampled_from(["", "update", "oracle"]))
def test_written_bytes_equal_protobufs(header: pb.TensorListHeader | None, index: int, data: bytes,
                                       checksum: str, pieces: int, wrap: str) -> None:
    msg = pb.TensorChunk(index=index, data=data, checksum=checksum)
    if header is not None:
        msg.header.CopyFrom(header)
    cut = max(1, len(data) // pieces)
    parts = [memoryview(data)[i : i + cut] for i in range(0, len(data), cut)]
    head = header.SerializeToString() if header is not None else None
    field = {"": 0, "update": wire.UPDATE_PART_CHUNK_FIELD, "oracle": wire.ORACLE_MESSAGE_CHUNK_FIELD}[wrap]
    got = wire.chunk_bytes(index, parts, len(data), checksum, head, field)
    want = {"": msg, "update": agg_pb.UpdatePart(chunk=msg), "oracle": est_pb.OracleMessage(chunk=msg)}[wrap]
    assert got == want.SerializeToString()


def _same(view: wire.ChunkView | pb.TensorChunk, msg: pb.TensorChunk) -> None:
    assert view.index == msg.index and bytes(view.data) == msg.data and view.checksum == msg.checksum
    assert view.HasField("header") == msg.HasField("header")
    if msg.HasField("header"):
        assert view.header == msg.header


@CASES
@given(headers, st.integers(0, 2**32 - 1), st.binary(max_size=300), st.text(max_size=20))
def test_parsed_views_equal_protobufs_parse(header: pb.TensorListHeader | None, index: int, data: bytes,
                                           checksum: str) -> None:
    msg = pb.TensorChunk(index=index, data=data, checksum=checksum)
    if header is not None:
        msg.header.CopyFrom(header)
    raw = msg.SerializeToString()
    view = wire.parse_chunk(raw)
    assert isinstance(view, wire.ChunkView)
    _same(view, msg)
    assert view.serialized() == raw
    part = wire.parse_update_part(agg_pb.UpdatePart(chunk=msg).SerializeToString())
    assert isinstance(part, wire.WrappedChunkView) and part.WhichOneof("part") == "chunk"
    _same(part.chunk, msg)
    assert part.chunk.serialized() == raw  # re-encoded from the view: one copy, same bytes
    oracle = wire.parse_oracle_message(est_pb.OracleMessage(chunk=msg).SerializeToString())
    assert isinstance(oracle, wire.WrappedChunkView) and oracle.WhichOneof("kind") == "chunk"
    _same(oracle.chunk, msg)


@CASES
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_read_exactly_as_protobuf_reads_them(raw: bytes) -> None:
    try:
        want = pb.TensorChunk.FromString(raw)
    except DecodeError:
        with pytest.raises(DecodeError):
            wire.parse_chunk(raw)
        return
    _same(wire.parse_chunk(raw), want)


def test_repeated_or_unknown_fields_go_through_protobuf() -> None:
    a = pb.TensorChunk(index=1, data=b"ab").SerializeToString()
    b = pb.TensorChunk(index=2, data=b"cd").SerializeToString()
    merged = wire.parse_chunk(a + b)  # protobuf's merge: last scalar wins, bytes replaced
    assert isinstance(merged, pb.TensorChunk) and merged.index == 2 and merged.data == b"cd"
    unknown = a + b"\x28\x07"  # field 5, varint: unknown to TensorChunk
    assert isinstance(wire.parse_chunk(unknown), pb.TensorChunk)
    header_part = agg_pb.UpdatePart(header=agg_pb.UpdateHeader(cid=3)).SerializeToString()
    parsed = wire.parse_update_part(header_part)
    assert isinstance(parsed, agg_pb.UpdatePart) and parsed.header.cid == 3
    hello = est_pb.OracleMessage(hello=est_pb.OracleHello(worker_id="w")).SerializeToString()
    got = wire.parse_oracle_message(hello)
    assert isinstance(got, est_pb.OracleMessage) and got.hello.worker_id == "w"


def test_overrides_must_name_real_methods() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(1))
    with pytest.raises(ValueError, match="no methods"):
        rpc.add_servicer(server, agg_pb.DESCRIPTOR.services_by_name["Aggregator"], object(),
                         {"Nope": (None, None)})


@pytest.fixture
def service() -> Iterator[EstimatorHandle]:
    handle = create_estimator_service(EstimatorSettings(port=0))
    yield handle
    handle.stop(0.5)


def test_fast_stub_and_service_round_trip_a_multi_chunk_model(service: EstimatorHandle) -> None:
    tensors = [torch.randn(1_500_000), torch.arange(10), torch.randn(3, 3).double()]  # 6 MB: 2 chunks
    with grpc.insecure_channel(f"127.0.0.1:{service.port}", options=grpc_options()) as ch:
        stub = rpc.estimator_stub(ch)
        ref = stub.PutBlob(convert.stream_wire({"params": tensors}), timeout=30)
        got = list(stub.FetchBlob(pb.FetchBlobRequest(blob_id=ref.blob_id), timeout=30))
        assert len(got) == 2 and all(isinstance(c, wire.ChunkView) for c in got)
        back = convert.decode_tensors(got)["params"]
        assert all(torch.equal(x, y) for x, y in zip(back, tensors, strict=True))
        # the stored bytes are served as received: a protobuf stub reads the same chunks
        plain = list(rpc.est_grpc.EstimatorStub(ch).FetchBlob(pb.FetchBlobRequest(blob_id=ref.blob_id)))
        assert [c.SerializeToString() for c in plain] == [c.serialized() for c in got]
        # a corrupted chunk sent through the fast path is still caught by the service
        parts = list(convert.stream_wire({"params": tensors}))
        bad = bytearray(parts[1])
        bad[-100] ^= 1  # inside the data, not the trailing checksum field
        with pytest.raises(grpc.RpcError) as ei:
            stub.PutBlob(iter([parts[0], bytes(bad)]), timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "chunk 1: checksum" in ei.value.details()
