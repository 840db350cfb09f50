"""TensorChunk's protobuf wire format, written and read by hand on the bulk path only.

The bytes are exactly what protobuf produces for the same ``TensorChunk`` (or ``UpdatePart`` holding one),
field by field in number order; tests compare them byte for byte with ``SerializeToString``. Doing it
here saves the copies protobuf's Python API makes of the 4 MiB ``data`` field: building a message copies
the bytes in and ``SerializeToString`` copies them out again, and parsing copies them into the message and
``.data`` once more. Here a chunk is written with one copy straight from the tensors' memory, and read
as a zero-copy uint8 view of the bytes gRPC handed over (``ChunkView``). Any input off the simple path
(an unknown or repeated field, an odd wire type, a bad length) is handed to protobuf itself, so parsing
accepts and rejects exactly what protobuf does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import tensor_pb2 as pb

Buffer = bytes | memoryview

_LEN = 2  # length-delimited wire type
_TAG_HEADER, _TAG_INDEX, _TAG_DATA, _TAG_CHECKSUM = 0x0A, 0x10, 0x1A, 0x22  # TensorChunk fields 1-4
UPDATE_PART_CHUNK_FIELD = 2  # UpdatePart.chunk
ORACLE_MESSAGE_CHUNK_FIELD = 3  # OracleMessage.chunk


class _OffPath(Exception):
    """The input is not a plain chunk: let protobuf parse it."""


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= end or shift > 63:
            raise _OffPath
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


class ChunkView:
    """A received TensorChunk whose ``data`` is a read-only view of the message bytes (no copy).

    It answers what ``TensorAssembler`` asks of a ``pb.TensorChunk``: ``index``, ``data``, ``checksum``,
    ``header`` and ``HasField("header")``; ``raw`` is the whole message's bytes when it was parsed on its
    own (a blob store keeps those to serve them again as they are).
    """

    __slots__ = ("_header", "index", "data", "checksum", "raw")

    def __init__(self, header: pb.TensorListHeader | None, index: int, data: memoryview, checksum: str,
                 raw: bytes | None = None) -> None:
        self._header = header
        self.index = index
        self.data = data
        self.checksum = checksum
        self.raw = raw

    def serialized(self) -> bytes:
        """The message's bytes (its own when it was parsed on its own, else re-encoded, one copy)."""
        if self.raw is not None:
            return self.raw
        head = self._header.SerializeToString() if self._header is not None else None
        return chunk_bytes(self.index, [self.data], len(self.data), self.checksum, head)

    @property
    def header(self) -> pb.TensorListHeader:
        return self._header if self._header is not None else pb.TensorListHeader()

    def HasField(self, name: str) -> bool:  # noqa: N802 - protobuf's spelling
        if name != "header":
            raise ValueError(f"ChunkView has no message field {name!r}")
        return self._header is not None


_EMPTY = memoryview(b"")


def _parse_chunk(buf: bytes, start: int, end: int) -> ChunkView:
    header: pb.TensorListHeader | None = None
    index, data, checksum = 0, _EMPTY, ""
    seen = 0
    i = start
    while i < end:
        tag, i = _read_varint(buf, i, end)
        if tag == _TAG_INDEX:
            index, i = _read_varint(buf, i, end)
            if index >= 2**32:
                raise _OffPath  # protobuf truncates an oversized uint32; let it
        elif tag in (_TAG_HEADER, _TAG_DATA, _TAG_CHECKSUM):
            n, i = _read_varint(buf, i, end)
            if i + n > end:
                raise _OffPath
            if tag == _TAG_DATA:
                data = memoryview(buf)[i : i + n]
            elif tag == _TAG_HEADER:
                header = pb.TensorListHeader.FromString(memoryview(buf)[i : i + n])
            else:
                try:
                    checksum = bytes(memoryview(buf)[i : i + n]).decode("utf-8")
                except UnicodeDecodeError:
                    raise _OffPath from None
            i += n
        else:
            raise _OffPath
        if seen & (1 << (tag >> 3)):
            raise _OffPath  # a repeated field: protobuf's merge rules apply
        seen |= 1 << (tag >> 3)
    if i != end:
        raise _OffPath
    return ChunkView(header, index, data, checksum)


def parse_chunk(buf: bytes) -> ChunkView | pb.TensorChunk:
    """gRPC deserializer for a TensorChunk message."""
    try:
        view = _parse_chunk(buf, 0, len(buf))
    except _OffPath:
        return pb.TensorChunk.FromString(buf)
    view.raw = buf
    return view


class WrappedChunkView:
    """An ``UpdatePart`` or ``OracleMessage`` whose oneof holds a chunk, as a ``ChunkView``."""

    __slots__ = ("chunk", "_size", "_oneof")

    def __init__(self, chunk: ChunkView, size: int, oneof: str) -> None:
        self.chunk = chunk
        self._size = size
        self._oneof = oneof

    def WhichOneof(self, name: str) -> str:  # noqa: N802 - protobuf's spelling
        if name != self._oneof:
            raise ValueError(f"no oneof {name!r}")
        return "chunk"

    def ByteSize(self) -> int:  # noqa: N802 - protobuf's spelling
        """The message's size on the wire, as protobuf's ``ByteSize``."""
        return self._size


def _parse_wrapped(buf: bytes, field: int, oneof: str) -> WrappedChunkView:
    tag, i = _read_varint(buf, 0, len(buf))
    if tag != (field << 3 | _LEN):
        raise _OffPath
    n, i = _read_varint(buf, i, len(buf))
    if i + n != len(buf):
        raise _OffPath
    return WrappedChunkView(_parse_chunk(buf, i, i + n), len(buf), oneof)


def parse_update_part(buf: bytes) -> WrappedChunkView | agg_pb.UpdatePart:
    """gRPC deserializer for an UpdatePart: chunk parts as views, anything else through protobuf."""
    try:
        return _parse_wrapped(buf, UPDATE_PART_CHUNK_FIELD, "part")
    except _OffPath:
        return agg_pb.UpdatePart.FromString(buf)


def parse_oracle_message(buf: bytes) -> WrappedChunkView | est_pb.OracleMessage:
    """gRPC deserializer for an OracleMessage: gradient chunks as views, anything else through protobuf."""
    try:
        return _parse_wrapped(buf, ORACLE_MESSAGE_CHUNK_FIELD, "kind")
    except _OffPath:
        return est_pb.OracleMessage.FromString(buf)


def chunk_bytes(index: int, parts: Sequence[Buffer], nbytes: int, checksum: str,
                header: bytes | None = None, wrap_field: int = 0) -> bytes:
    """A serialised TensorChunk (wrapped as field ``wrap_field`` of an outer message when non-zero), with
    ``parts`` (``nbytes`` together) copied exactly once, into the result."""
    head: list[bytes] = []
    if header is not None:
        head += [bytes([_TAG_HEADER]), varint(len(header)), header]
    if index:
        head += [bytes([_TAG_INDEX]), varint(index)]
    if nbytes:
        head += [bytes([_TAG_DATA]), varint(nbytes)]
    ck = checksum.encode()
    tail = [bytes([_TAG_CHECKSUM]), varint(len(ck)), ck] if ck else []
    if wrap_field:
        inner = sum(len(x) for x in head) + nbytes + sum(len(x) for x in tail)
        head = [bytes([wrap_field << 3 | _LEN]), varint(inner), *head]
    return b"".join([*head, *parts, *tail]) if nbytes else b"".join([*head, *tail])


def serialize_any(msg: Any) -> bytes:
    """gRPC serializer that passes pre-serialised ``bytes`` through and serialises messages."""
    return msg if isinstance(msg, bytes) else bytes(msg.SerializeToString())
