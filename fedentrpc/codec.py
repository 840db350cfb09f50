"""The tensor codec: named tensor lists <-> a stream of ``TensorChunk`` messages.

Why it exists: a model can be larger than gRPC's message limit, so tensors travel as raw bytes (each
tensor's dtype and shape in a header on the first chunk) cut into chunks of at most 4 MiB, and every
tensor-carrying RPC streams them. Each chunk carries the CRC-32C of its own bytes, so a sender builds and
sends chunk i while chunk i+1 is cut, and a receiver rejects a bad chunk by number without waiting for the
rest. CRC-32C is an integrity check against corruption, not an authenticity proof (TLS gives that); zlib's
CRC-32 is used only where google-crc32c lacks its C extension (its pure-Python fallback runs at MB/s).
Receivers accept either, nothing else.

The chunks are plain protobuf messages built and parsed by protobuf through the generated stubs:
benchmarks/README.md has the measurement that retired the hand-written framing. A receiver checks the
header's sizes against its own limit before it allocates anything, copies each verified chunk once into
one buffer (recycled across streams of the same size: ``receive_pool``), and returns tensors that view it.
Optional fp16/bf16 casting and zlib compression are transfer settings (``TransferSpec``). Bad input raises
``WireError`` (a ``ValueError``) with a one-line message; servicers map it to ``INVALID_ARGUMENT``.
Messages that carry core types are in ``mappers``.

Why ~500 lines in one module: the encoder and the decoder are the two halves of one wire format (header
layout, dtype and wire tables, chunk cut, checksums); together, a change to the format is made and checked
in one place.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import google_crc32c
import numpy as np
import torch
from torch import Tensor

from fedentrpc.receive_pool import RECEIVE_POOL
from fedentrpc.v1 import tensor_pb2 as pb

MAX_CHUNK_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_STREAM_BYTES = 64 * 2**30  # a receiver's default bound on one tensor stream (64 GiB)
# a receiver's default bound on the tensors one stream declares: each costs a step to lay out and split, and a
# header of a million empty tensors fits in one message
DEFAULT_MAX_TENSORS = 1 << 16
PARAMS_GROUP = "params"
DEFAULT_CHECKSUM = "crc32c" if google_crc32c.implementation == "c" else "crc32"

# The tensor-level enums, one table each: the Python name <-> the proto enum value. A value not in a table
# (UNSPECIFIED, or one from newer protos) is a WireError on receipt.
CHECKSUMS = {"crc32c": pb.CHECKSUM_ALGORITHM_CRC32C, "crc32": pb.CHECKSUM_ALGORITHM_CRC32}
WIRE_DTYPES = {"native": pb.WIRE_DTYPE_NATIVE, "float16": pb.WIRE_DTYPE_FLOAT16, "bfloat16": pb.WIRE_DTYPE_BFLOAT16}
COMPRESSIONS = {"none": pb.COMPRESSION_NONE, "zlib": pb.COMPRESSION_ZLIB}
DTYPES: dict[torch.dtype, pb.Dtype] = {
    torch.float32: pb.DTYPE_FLOAT32, torch.float64: pb.DTYPE_FLOAT64, torch.float16: pb.DTYPE_FLOAT16,
    torch.bfloat16: pb.DTYPE_BFLOAT16, torch.int64: pb.DTYPE_INT64, torch.int32: pb.DTYPE_INT32,
    torch.int16: pb.DTYPE_INT16, torch.int8: pb.DTYPE_INT8, torch.uint8: pb.DTYPE_UINT8, torch.bool: pb.DTYPE_BOOL}
_CHECKSUM_NAMES = {v: k for k, v in CHECKSUMS.items()}
_TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
_WIRE_TORCH: dict[int, torch.dtype] = {pb.WIRE_DTYPE_FLOAT16: torch.float16, pb.WIRE_DTYPE_BFLOAT16: torch.bfloat16}

Bundle = dict[str, list[Tensor]]


class WireError(ValueError):
    """A malformed or corrupted message (bad header, wrong sizes, checksum mismatch).

    ``field`` names the message field at fault when there is one (e.g. ``"params.variant"``) and ``why`` says
    what is wrong with it; the message is then ``"<field>: <why>"``. Callers that re-key the problem (the
    estimator reports it as a FedEntOptions field) read these instead of parsing the text.
    """

    def __init__(self, message: str = "", *, field: str | None = None, why: str | None = None) -> None:
        if field is not None:
            why = message if why is None else why
            message = f"{field}: {why}"
        super().__init__(message)
        self.field = field
        self.why = why if why is not None else message


class TruncatedStream(WireError):
    """A stream that ended before its header's last chunk: cut short, not corrupt (every chunk it holds was
    verified). A sender's cancelled stream can end so on the receiver instead of breaking, so a receiver that
    keeps chunks to resume tells the two apart."""


# ---- transfer settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransferSpec:
    """How tensors are encoded: ``wire_dtype`` native|float16|bfloat16, ``compression`` none|zlib."""

    wire_dtype: str = "native"
    compression: str = "none"
    chunk_bytes: int = MAX_CHUNK_BYTES
    zlib_level: int = 1
    checksum: str = DEFAULT_CHECKSUM

    def __post_init__(self) -> None:
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {', '.join(WIRE_DTYPES)}, got {self.wire_dtype!r}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}")
        if not 1 <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in [1, {MAX_CHUNK_BYTES}], got {self.chunk_bytes}")
        if not 0 <= self.zlib_level <= 9:
            raise ValueError(f"zlib_level must be in [0, 9], got {self.zlib_level}")
        if self.checksum not in CHECKSUMS:
            raise ValueError(f"checksum must be one of {', '.join(CHECKSUMS)}, got {self.checksum!r}")


# ---- checksums -----------------------------------------------------------------------------------------


def checksum(algo: str, data: bytes) -> int:
    """The 32-bit checksum of ``data``: CRC-32C (``"crc32c"``, hardware, ~20 GB/s) or zlib's CRC-32."""
    return int(google_crc32c.value(data)) if algo == "crc32c" else zlib.crc32(data)


# ---- encoding ------------------------------------------------------------------------------------------


class Carrier(Protocol):
    """A message that carries one ``TensorChunk`` in its field ``chunk``: the request or response message of
    a tensor-carrying RPC (``PutBlobRequest``, ``*FetchBlobResponse``, ...)."""

    @property
    def chunk(self) -> pb.TensorChunk: ...


C = TypeVar("C", bound=Carrier)


def chunk_of(m: pb.TensorChunk | Carrier) -> pb.TensorChunk:
    """The chunk itself, or the chunk a carrier message holds (a view: nothing is copied)."""
    return m if isinstance(m, pb.TensorChunk) else m.chunk


class EncodedTensors:
    """A tensor list encoded once, to be streamed as it is to any number of receivers (FetchBlob).

    It keeps the messages its chunks arrived or were built in (bare ``TensorChunk``s, or carriers such as
    ``PutBlobRequest``); ``as_messages(Response)`` gives them as a server's response messages, built once
    (a chunk copied into a carrier of another type costs a copy of its bytes) and then kept instead.
    """

    def __init__(self, messages: Sequence[Any], raw_bytes: int, wire_bytes: int) -> None:
        self._messages: tuple[Any, ...] = tuple(messages)
        self.raw_bytes = raw_bytes
        self.wire_bytes = wire_bytes

    @property
    def chunks(self) -> tuple[pb.TensorChunk, ...]:
        return tuple(chunk_of(m) for m in self._messages)

    def __iter__(self) -> Iterator[pb.TensorChunk]:
        return iter(self.chunks)

    def as_messages(self, carrier: type[C]) -> tuple[C, ...]:
        got = self._messages
        if got and type(got[0]) is carrier:
            return got
        out = []
        for m in got:
            wrapped = carrier()
            wrapped.chunk.CopyFrom(chunk_of(m))
            out.append(wrapped)
        self._messages = tuple(out)  # kept in this form: the next receiver gets the same messages
        return self._messages


@dataclass(frozen=True)
class Chunk:
    """One chunk's fields, before they are written into a ``TensorChunk`` (alone, or inside an outer
    message's oneof, which ``fill`` writes in place instead of copying the bytes a second time)."""

    index: int
    data: bytes
    checksum: int
    header: pb.TensorListHeader | None

    def fill(self, msg: pb.TensorChunk) -> None:
        if self.header is not None:
            msg.header.CopyFrom(self.header)
        msg.index = self.index
        msg.data = self.data
        msg.checksum = self.checksum


def _tensor_u8(t: Tensor, wire: int) -> memoryview:
    """The tensor's bytes as a flat uint8 buffer (no copy for a contiguous CPU tensor sent natively)."""
    t = t.detach().to("cpu")
    if wire in _WIRE_TORCH and t.is_floating_point():
        t = t.to(_WIRE_TORCH[wire])
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.view(torch.uint8).numpy().data


def _pieces(parts: Sequence[memoryview], total: int, size: int) -> Iterator[list[memoryview]]:
    """``parts`` concatenated and cut into ``size``-byte pieces, each a list of views (nothing copied)."""
    if total == 0:
        yield []
        return
    pending: list[memoryview] = []
    have = 0
    for mv in parts:
        pos = 0
        while pos < len(mv):
            take = min(size - have, len(mv) - pos)
            pending.append(mv[pos : pos + take])
            have += take
            pos += take
            if have == size:
                yield pending
                pending, have = [], 0
    if have:
        yield pending


def _plan(bundle: Mapping[str, Sequence[Tensor]], spec: TransferSpec) -> tuple[pb.TensorListHeader, list[memoryview]]:
    """The stream's header and its payload as buffers (views of the tensors unless cast or compressed)."""
    wire = WIRE_DTYPES[spec.wire_dtype]
    specs, groups, parts = [], [], []
    for name, tensors in bundle.items():
        groups.append(pb.TensorGroup(name=name, count=len(tensors)))
        for t in tensors:
            if t.dtype not in DTYPES:
                raise WireError(f"cannot send tensors of dtype {t.dtype}")
            specs.append(pb.TensorSpec(dtype=DTYPES[t.dtype], shape=list(t.shape)))
            parts.append(_tensor_u8(t, wire))
    raw_len = sum(len(p) for p in parts)
    if spec.compression == "zlib":
        comp = zlib.compressobj(spec.zlib_level)
        parts = [memoryview(b"".join([comp.compress(p) for p in parts] + [comp.flush()]))]
    wire_len = sum(len(p) for p in parts)
    header = pb.TensorListHeader(
        tensors=specs, groups=groups, wire_dtype=wire, compression=COMPRESSIONS[spec.compression],
        raw_bytes=raw_len, wire_bytes=wire_len, num_chunks=max(1, -(-wire_len // spec.chunk_bytes)),
        checksum_algorithm=CHECKSUMS[spec.checksum],
    )
    return header, parts


def _cut(header: pb.TensorListHeader, parts: list[memoryview], spec: TransferSpec, start: int = 0) -> Iterator[Chunk]:
    for i, piece in enumerate(_pieces(parts, header.wire_bytes, spec.chunk_bytes)):
        if i < start:
            continue  # a resumed stream: the receiver holds these already (nothing is copied for them)
        data = b"".join(piece)  # the one copy out of the tensors' memory
        yield Chunk(i, data, checksum(spec.checksum, data), header if i == 0 else None)


def tensor_chunks(bundle: Mapping[str, Sequence[Tensor]], spec: TransferSpec | None = None,
                  start: int = 0) -> Iterator[Chunk]:
    """Named tensor lists (dict order kept) as checksummed chunks of ≤ ``chunk_bytes``, cut as consumed,
    so an upload never holds more than a chunk or two of encoded bytes. Bad input (an unsupported dtype)
    raises here, before the first chunk, not inside the stream. ``start``: the first chunk to yield (a cut
    stream resumed where the receiver's copy ends; the encoding is deterministic, so chunk i is the same
    bytes every time)."""
    spec = spec or TransferSpec()
    header, parts = _plan(bundle, spec)
    return _cut(header, parts, spec, start)


def _message(c: Chunk) -> pb.TensorChunk:
    msg = pb.TensorChunk()
    c.fill(msg)
    return msg


def wrap_chunks(chunks: Iterable[Chunk], carrier: type[C]) -> Iterator[C]:
    """Each chunk written in place into a new ``carrier`` message (its bytes are not copied again)."""
    for c in chunks:
        msg = carrier()
        c.fill(msg.chunk)
        yield msg


def stream_tensors(bundle: Mapping[str, Sequence[Tensor]], carrier: type[C],
                   spec: TransferSpec | None = None) -> Iterator[C]:
    """``tensor_chunks`` in ``carrier`` messages (e.g. ``PutBlobRequest``), built as gRPC consumes them."""
    return wrap_chunks(tensor_chunks(bundle, spec), carrier)


def encode_tensors(bundle: Mapping[str, Sequence[Tensor]], spec: TransferSpec | None = None,
                   carrier: type[Carrier] | None = None) -> EncodedTensors:
    """The chunks kept in memory: encoded once, then streamed to any number of receivers. ``carrier``: the
    response message a server streams them in (built now, so serving them copies nothing); None keeps bare
    ``TensorChunk`` messages."""
    spec = spec or TransferSpec()
    header, parts = _plan(bundle, spec)
    chunks = _cut(header, parts, spec)
    msgs: Iterable[Any] = map(_message, chunks) if carrier is None else wrap_chunks(chunks, carrier)
    return EncodedTensors(tuple(msgs), int(header.raw_bytes), int(header.wire_bytes))


# ---- decoding ------------------------------------------------------------------------------------------


class TensorAssembler:
    """Collects streamed chunks in order and rebuilds the bundle, checking sizes and checksums.

    The header's sizes are checked against ``max_bytes`` before anything is allocated; then each chunk
    is verified against its own checksum and copied once, straight into its place in one buffer sized
    from the header (recycled from a freed stream of the same size: ``receive_pool``), so the decoded
    tensors are views into it and nothing is joined at the end.
    ``keep_payload=False`` only verifies (a blob store that keeps the chunks themselves).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_STREAM_BYTES, keep_payload: bool = True,
                 max_tensors: int = DEFAULT_MAX_TENSORS) -> None:
        self.header: pb.TensorListHeader | None = None
        self.max_bytes = max_bytes
        self.max_tensors = max_tensors
        self.keep_payload = keep_payload
        self._dst: Tensor | None = None
        self._np: Any = None  # numpy view of _dst
        self._algo = ""
        self._count = 0
        self._received = 0

    def _start(self, h: pb.TensorListHeader) -> None:
        algo = _CHECKSUM_NAMES.get(h.checksum_algorithm)
        if algo is None:
            raise WireError("unknown tensor checksum algorithm "
                            f"{_enum_name(pb.ChecksumAlgorithm, h.checksum_algorithm)}")
        if h.compression not in (pb.COMPRESSION_NONE, pb.COMPRESSION_ZLIB):
            raise WireError(f"unknown compression {_enum_name(pb.Compression, h.compression)}")
        if h.wire_dtype not in (pb.WIRE_DTYPE_NATIVE, *_WIRE_TORCH):
            raise WireError(f"unknown wire dtype {_enum_name(pb.WireDtype, h.wire_dtype)}")
        self._algo = algo
        if len(h.tensors) > self.max_tensors:
            raise WireError(f"tensor stream declares {len(h.tensors)} tensors; this receiver takes at most "
                            f"{self.max_tensors}")
        if h.wire_bytes > self.max_bytes or h.raw_bytes > self.max_bytes:
            raise WireError(f"tensor stream of {max(h.wire_bytes, h.raw_bytes)} bytes exceeds this receiver's "
                            f"limit of {self.max_bytes}")
        if h.num_chunks < 1 or h.wire_bytes > h.num_chunks * MAX_CHUNK_BYTES:
            raise WireError(f"tensor header: {h.wire_bytes} bytes cannot travel in {h.num_chunks} chunks")
        if h.num_chunks > max(1, h.wire_bytes):
            raise WireError(f"tensor header: {h.num_chunks} chunks for {h.wire_bytes} bytes")
        if h.compression == pb.COMPRESSION_NONE and h.raw_bytes != h.wire_bytes:
            raise WireError(f"uncompressed tensor stream: raw {h.raw_bytes} != wire {h.wire_bytes} bytes")
        if not self.keep_payload and h.compression == pb.COMPRESSION_NONE:
            return  # sizes and shapes are checked from the header alone; zlib must be inflated to check
        try:
            self._dst, self._np = RECEIVE_POOL.take(int(h.wire_bytes))
        except (RuntimeError, MemoryError):
            raise WireError(f"cannot allocate {h.wire_bytes} bytes for a tensor stream") from None

    def add(self, chunk: pb.TensorChunk) -> None:
        if chunk.index != self._count:
            raise WireError(f"tensor chunk {chunk.index} arrived out of order (expected {self._count})")
        if chunk.index == 0:
            if not chunk.HasField("header"):
                raise WireError("the first tensor chunk carries no header")
            self.header = chunk.header
            self._start(self.header)
        elif chunk.HasField("header"):
            raise WireError("only the first tensor chunk may carry a header")
        h = self.header
        assert h is not None
        data = chunk.data  # read once: each access copies
        n = len(data)
        if n > MAX_CHUNK_BYTES:
            raise WireError(f"tensor chunk of {n} bytes exceeds {MAX_CHUNK_BYTES}")
        if chunk.index >= h.num_chunks:
            raise WireError(f"more tensor chunks than the header's {h.num_chunks}")
        if self._received + n > h.wire_bytes:
            raise WireError("tensor stream longer than its header says")
        if checksum(self._algo, data) != chunk.checksum:
            raise WireError(f"tensor chunk {chunk.index}: checksum mismatch (corrupted transfer)")
        if n and self._np is not None:
            self._np[self._received : self._received + n] = np.frombuffer(data, dtype=np.uint8)
        self._count += 1
        self._received += n

    @property
    def wire_bytes(self) -> int:
        return self._received

    @property
    def chunks(self) -> int:
        """How many chunks were verified and kept: a cut stream resumes at this index."""
        return self._count

    def _complete(self) -> pb.TensorListHeader:
        h = self.header
        if h is None:
            raise WireError("empty tensor stream")
        if self._count != h.num_chunks:
            raise TruncatedStream(f"tensor stream truncated: {self._count} of {h.num_chunks} chunks, "
                            f"{self._received} of {h.wire_bytes} bytes")
        if self._received != h.wire_bytes:
            # every chunk came but they carried too few bytes: the rest of the buffer (recycled from an earlier
            # stream) would be decoded as if it had been sent
            raise WireError(f"tensor stream short: its {h.num_chunks} chunks carried {self._received} of the "
                            f"header's {h.wire_bytes} bytes")
        return h

    def verify(self) -> pb.TensorListHeader:
        """Finish a stream without building tensors: sizes, checksums, and shapes against the payload size."""
        h = self._complete()
        if self._dst is None:
            _layout(h, int(h.raw_bytes))
        else:
            self.finish()
        return h

    def finish(self) -> Bundle:
        h = self._complete()
        if self._dst is None and not self.keep_payload:
            raise WireError("this assembler only verifies (keep_payload=False); it has no tensors to return")
        payload = self._dst if self._dst is not None else torch.empty(0, dtype=torch.uint8)
        self._dst, self._np = None, None  # the tensors own the buffer from here on
        if h.compression == pb.COMPRESSION_ZLIB:
            raw = _inflate(payload, int(h.raw_bytes))
        elif h.compression == pb.COMPRESSION_NONE:
            raw = payload
        else:
            raise WireError(f"unknown compression {_enum_name(pb.Compression, h.compression)}")
        if raw.numel() != h.raw_bytes:
            raise WireError(f"tensor payload is {raw.numel()} bytes, header says {h.raw_bytes}")
        return _split(h, raw)


def _inflate(payload: Tensor, raw_bytes: int) -> Tensor:
    """zlib-decompress at most ``raw_bytes`` + 1 bytes, so a small bomb cannot claim unbounded memory."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(payload.numpy().data, raw_bytes + 1)
    except zlib.error as e:
        raise WireError(f"bad zlib payload ({e})") from None
    if len(out) > raw_bytes or d.unconsumed_tail:
        raise WireError(f"tensor payload inflates past the header's {raw_bytes} bytes")
    if not d.eof:
        raise WireError("bad zlib payload (truncated)")
    return torch.frombuffer(bytearray(out), dtype=torch.uint8) if out else torch.empty(0, dtype=torch.uint8)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class _Slot:
    offset: int
    nbytes: int
    store: torch.dtype  # the element type on the wire (uint8 for bool)
    dtype: torch.dtype  # the element type the receiver restores
    shape: tuple[int, ...]


def _layout(h: pb.TensorListHeader, total: int) -> list[_Slot]:
    """Where each tensor sits in a payload of ``total`` bytes; WireError unless they tile it exactly."""
    if sum(g.count for g in h.groups) != len(h.tensors):
        raise WireError("tensor groups do not cover the tensor list")
    if len({g.name for g in h.groups}) != len(h.groups):
        raise WireError("duplicate tensor group names")
    wire_dtype = _WIRE_TORCH.get(h.wire_dtype)
    if h.wire_dtype not in (pb.WIRE_DTYPE_NATIVE, *_WIRE_TORCH):
        raise WireError(f"unknown wire dtype {_enum_name(pb.WireDtype, h.wire_dtype)}")
    slots: list[_Slot] = []
    offset = 0
    for s in h.tensors:
        dtype = _TORCH_DTYPES.get(s.dtype)
        if dtype is None:
            raise WireError(f"unknown tensor dtype {_enum_name(pb.Dtype, s.dtype)}")
        if any(d < 0 for d in s.shape):
            raise WireError(f"negative dimension in shape {list(s.shape)}")
        sent = wire_dtype if (wire_dtype is not None and dtype.is_floating_point) else dtype
        store = torch.uint8 if sent == torch.bool else sent
        nbytes = math.prod(s.shape) * _element_size(store)
        if offset + nbytes > total:
            raise WireError("tensor payload shorter than its shapes need")
        slots.append(_Slot(offset, nbytes, store, dtype, tuple(s.shape)))
        offset += nbytes
    if offset != total:
        raise WireError(f"tensor payload has {total - offset} trailing bytes")
    return slots


def _split(h: pb.TensorListHeader, buf: Tensor) -> Bundle:
    """Tensors as views into ``buf`` (a uint8 tensor owned by them alone) where aligned, else copies."""
    tensors: list[Tensor] = []
    for slot in _layout(h, buf.numel()):
        piece = buf[slot.offset : slot.offset + slot.nbytes]
        t = (piece if slot.offset % _element_size(slot.store) == 0 else piece.clone()).view(slot.store)
        if slot.store != slot.dtype:
            t = t.to(slot.dtype)
        tensors.append(t.reshape(slot.shape))
    out: Bundle = {}
    pos = 0
    for g in h.groups:
        out[g.name] = tensors[pos : pos + g.count]
        pos += g.count
    return out


def decode_tensors(chunks: Iterable[pb.TensorChunk | Carrier],
                   max_bytes: int = DEFAULT_MAX_STREAM_BYTES) -> Bundle:
    """A stream of chunks, or of the messages carrying them (a FetchBlob response stream), as tensors."""
    asm = TensorAssembler(max_bytes)
    for c in chunks:
        asm.add(chunk_of(c))
    return asm.finish()


def _enum_name(enum: Any, value: int) -> str:
    """``NAME`` of a known enum value (e.g. ``WIRE_DTYPE_UNSPECIFIED``), else ``value N``."""
    try:
        return str(enum.Name(value))
    except ValueError:
        return f"value {value}"


def check_shapes(got: Sequence[Tensor], like: Sequence[Tensor], what: str) -> None:
    """Raise WireError unless ``got`` has the same number, shapes and dtypes as ``like``."""
    if len(got) != len(like):
        raise WireError(f"{what}: {len(got)} tensors, expected {len(like)}")
    for i, (g, ref) in enumerate(zip(got, like, strict=True)):
        if g.shape != ref.shape or g.dtype != ref.dtype:
            raise WireError(
                f"{what}: tensor {i} is {g.dtype} {tuple(g.shape)}, expected {ref.dtype} {tuple(ref.shape)}"
            )
