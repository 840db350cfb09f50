"""The one place where protobuf messages and core types meet.

Tensor lists travel as raw bytes (each tensor's dtype and shape in a header, a checksum of the streamed
bytes) split into chunks of at most 4 MiB, so a model larger than gRPC's message limit still travels. The
checksum names its algorithm ("crc32:<hex>" by default, "blake2b-128:<hex>" on request), so a receiver
verifies whichever the sender chose; crc32 runs at several GB/s where blake2b managed ~0.4 GB/s and was
the transfer's bottleneck, and it is an integrity check against corruption, not an authenticity proof
(TLS gives that). Optional fp16/bf16 casting and zlib compression are transfer settings. Everything else here is
a small, explicit mapping between a core dataclass (``Probe``, ``RoundPayload``, ``ClientUpdate``) and
its message. Decoding validates and raises ``WireError`` (a ``ValueError``) with a one-line message;
servicers map it to ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import google_crc32c
import numpy as np
import torch
from torch import Tensor

from fedent.meanfield.estimator import OfflinePhi2Estimator, Phi2Estimate
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload
from fedentrpc.allocator import Prefaulter, prefault_async
from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import tensor_pb2 as pb
from fedentrpc.wire import (
    ORACLE_MESSAGE_CHUNK_FIELD,
    UPDATE_PART_CHUNK_FIELD,
    Buffer,
    ChunkView,
    WrappedChunkView,
    chunk_bytes,
    parse_chunk,
)

MAX_CHUNK_BYTES = 4 * 1024 * 1024
CHECKSUM_PREFIX = "blake2b-128:"  # kept: older senders and tests name blake2b this way
CRC32_PREFIX = "crc32:"
CRC32C_PREFIX = "crc32c:"
CHECKSUMS = ("crc32c", "crc32", "blake2b")
# google-crc32c's C extension runs at ~20 GB/s; its pure-Python fallback (platforms without a wheel) at a
# few MB/s, where zlib's crc32 (~4 GB/s) is the better default. Receivers verify whichever was sent.
DEFAULT_CHECKSUM = "crc32c" if google_crc32c.implementation == "c" else "crc32"
PARAMS_GROUP = "params"

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_WIRE_DTYPES = {
    "native": pb.WIRE_DTYPE_NATIVE,
    "float16": pb.WIRE_DTYPE_FLOAT16,
    "bfloat16": pb.WIRE_DTYPE_BFLOAT16,
}
_WIRE_TORCH: dict[int, torch.dtype] = {pb.WIRE_DTYPE_FLOAT16: torch.float16, pb.WIRE_DTYPE_BFLOAT16: torch.bfloat16}
_COMPRESSIONS = {"none": pb.COMPRESSION_NONE, "zlib": pb.COMPRESSION_ZLIB}


class WireError(ValueError):
    """A malformed or corrupted message (bad header, wrong sizes, checksum mismatch)."""


# ---- transfer settings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TransferSpec:
    """How tensors are encoded: ``wire_dtype`` native|float16|bfloat16, ``compression`` none|zlib."""

    wire_dtype: str = "native"
    compression: str = "none"
    chunk_bytes: int = MAX_CHUNK_BYTES
    zlib_level: int = 1
    checksum: str = DEFAULT_CHECKSUM

    def __post_init__(self) -> None:
        if self.wire_dtype not in _WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {', '.join(_WIRE_DTYPES)}, got {self.wire_dtype!r}")
        if self.compression not in _COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(_COMPRESSIONS)}, got {self.compression!r}")
        if not 1 <= self.chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in [1, {MAX_CHUNK_BYTES}], got {self.chunk_bytes}")
        if not 0 <= self.zlib_level <= 9:
            raise ValueError(f"zlib_level must be in [0, 9], got {self.zlib_level}")
        if self.checksum not in CHECKSUMS:
            raise ValueError(f"checksum must be one of {', '.join(CHECKSUMS)}, got {self.checksum!r}")


def transfer_to_msg(spec: TransferSpec) -> pb.TransferSettings:
    return pb.TransferSettings(
        wire_dtype=_WIRE_DTYPES[spec.wire_dtype],
        compression=_COMPRESSIONS[spec.compression],
        chunk_bytes=spec.chunk_bytes,
    )


def transfer_from_msg(msg: pb.TransferSettings) -> TransferSpec:
    wire = {v: k for k, v in _WIRE_DTYPES.items()}.get(msg.wire_dtype)
    comp = {v: k for k, v in _COMPRESSIONS.items()}.get(msg.compression)
    if wire is None or comp is None:
        raise WireError("transfer settings: unknown wire dtype or compression")
    chunk = int(msg.chunk_bytes) or MAX_CHUNK_BYTES
    if chunk > MAX_CHUNK_BYTES:
        raise WireError(f"transfer settings: chunk_bytes {chunk} exceeds {MAX_CHUNK_BYTES}")
    return TransferSpec(wire_dtype=wire, compression=comp, chunk_bytes=chunk)


# ---- tensor bundles ------------------------------------------------------------------------------

Bundle = dict[str, list[Tensor]]


@dataclass(frozen=True)
class EncodedTensors:
    """A tensor bundle serialised once: ``wire`` holds each chunk's message bytes, ready to be streamed to
    any number of receivers without serialising again (servers answer FetchBlob with them as they are)."""

    wire: tuple[bytes, ...]
    raw_bytes: int
    wire_bytes: int

    @property
    def chunks(self) -> tuple[pb.TensorChunk, ...]:
        """The chunks as protobuf messages (parsed on each access: for tests and tools, not the bulk path)."""
        return tuple(pb.TensorChunk.FromString(w) for w in self.wire)

    def views(self) -> Iterator[ChunkView | pb.TensorChunk]:
        """The chunks as zero-copy views, for decoding in-process."""
        return (parse_chunk(w) for w in self.wire)

    def __iter__(self) -> Iterator[pb.TensorChunk]:
        return iter(self.chunks)


def _tensor_u8(t: Tensor, wire: int) -> memoryview:
    """The tensor's bytes as a flat uint8 buffer (no copy for a contiguous CPU tensor sent natively)."""
    t = t.detach().to("cpu")
    if wire in _WIRE_TORCH and t.is_floating_point():
        t = t.to(_WIRE_TORCH[wire])
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.view(torch.uint8).numpy().data


# Checksum algorithms: TransferSpec name -> the name on the wire ("<wire name>:<hex>" in a chunk).
_CHECKSUM_WIRE_NAMES = {"crc32c": "crc32c", "crc32": "crc32", "blake2b": "blake2b-128"}
_CHECKSUM_BY_WIRE_NAME = {v: k for k, v in _CHECKSUM_WIRE_NAMES.items()}


class _Checksum:
    """An incremental checksum whose text names its algorithm: per chunk, or (the older form) per payload."""

    def __init__(self, algo: str) -> None:
        self.algo = algo
        self._crc = 0
        self._blake = hashlib.blake2b(digest_size=16) if algo == "blake2b" else None

    @classmethod
    def for_header(cls, checksum: str) -> _Checksum:
        algo = _CHECKSUM_BY_WIRE_NAME.get(checksum.partition(":")[0])
        if algo is None:
            raise WireError(f"unknown tensor checksum algorithm in {checksum[:24]!r}")
        return cls(algo)

    def update(self, data: Buffer) -> None:
        if self._blake is not None:
            self._blake.update(data)
        elif self.algo == "crc32c":
            # google_crc32c takes bytes or numpy arrays, not memoryviews; the array is a view, not a copy
            self._crc = google_crc32c.extend(self._crc, data if isinstance(data, bytes)
                                             else np.frombuffer(data, dtype=np.uint8))
        else:
            self._crc = zlib.crc32(data, self._crc)

    def text(self) -> str:
        digest = self._blake.hexdigest() if self._blake is not None else f"{self._crc:08x}"
        return f"{_CHECKSUM_WIRE_NAMES[self.algo]}:{digest}"


def _digest(algo: str, *parts: Buffer) -> str:
    """``"<wire name>:<hex>"`` of the concatenated ``parts``."""
    c = _Checksum(algo)
    for p in parts:
        c.update(p)
    return c.text()


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
    wire = _WIRE_DTYPES[spec.wire_dtype]
    specs, groups, parts = [], [], []
    for name, tensors in bundle.items():
        groups.append(pb.TensorGroup(name=name, count=len(tensors)))
        for t in tensors:
            if t.dtype not in _DTYPE_NAMES:
                raise WireError(f"cannot send tensors of dtype {t.dtype}")
            specs.append(pb.TensorSpec(dtype=_DTYPE_NAMES[t.dtype], shape=list(t.shape)))
            parts.append(_tensor_u8(t, wire))
    raw_len = sum(len(p) for p in parts)
    if spec.compression == "zlib":
        comp = zlib.compressobj(spec.zlib_level)
        parts = [memoryview(b"".join([comp.compress(p) for p in parts] + [comp.flush()]))]
    wire_len = sum(len(p) for p in parts)
    header = pb.TensorListHeader(
        tensors=specs,
        groups=groups,
        wire_dtype=wire,
        compression=_COMPRESSIONS[spec.compression],
        raw_bytes=raw_len,
        wire_bytes=wire_len,
        num_chunks=max(1, -(-wire_len // spec.chunk_bytes)),
        chunk_checksum=_CHECKSUM_WIRE_NAMES[spec.checksum],
    )
    return header, parts


def _wire_chunks(header: pb.TensorListHeader, parts: list[memoryview], spec: TransferSpec,
                 wrap_field: int = 0) -> Iterator[bytes]:
    """Each chunk's serialised message, its bytes gathered straight from the tensors with one copy."""
    head = header.SerializeToString()
    for i, piece in enumerate(_pieces(parts, header.wire_bytes, spec.chunk_bytes)):
        n = sum(len(p) for p in piece)
        yield chunk_bytes(i, piece, n, _digest(spec.checksum, *piece), head if i == 0 else None, wrap_field)


def stream_wire(bundle: Mapping[str, Sequence[Tensor]], spec: TransferSpec | None = None,
                wrap_field: int = 0) -> Iterator[bytes]:
    """Named tensor lists (dict order kept) as serialised, checksummed chunks of ≤ ``chunk_bytes``, built as
    consumed (wrapped as field ``wrap_field`` of an outer message, e.g. ``UpdatePart.chunk``, if non-zero).

    Every chunk carries the checksum of its own bytes, so nothing waits for the whole payload: an upload
    sends chunk i while chunk i+1 is being cut, and never holds more than a chunk or two of encoded bytes.
    Bad input (an unsupported dtype) raises here, before the first chunk, not inside the stream. Send
    these through a stub whose request serializer is ``wire.serialize_any`` (``fedentrpc.rpc``).
    """
    spec = spec or TransferSpec()
    header, parts = _plan(bundle, spec)
    return _wire_chunks(header, parts, spec, wrap_field)


def stream_tensors(
    bundle: Mapping[str, Sequence[Tensor]], spec: TransferSpec | None = None
) -> Iterator[pb.TensorChunk]:
    """``stream_wire`` as protobuf messages, for stubs with protobuf's own serializers."""
    return (pb.TensorChunk.FromString(w) for w in stream_wire(bundle, spec))


def encode_tensors(bundle: Mapping[str, Sequence[Tensor]], spec: TransferSpec | None = None) -> EncodedTensors:
    """``stream_wire`` kept in memory: encoded once, then streamed to any number of receivers."""
    spec = spec or TransferSpec()
    header, parts = _plan(bundle, spec)
    return EncodedTensors(tuple(_wire_chunks(header, parts, spec)), int(header.raw_bytes), int(header.wire_bytes))


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


DEFAULT_MAX_STREAM_BYTES = 64 * 2**30  # a receiver's default bound on one tensor stream (64 GiB)


class TensorAssembler:
    """Collects streamed chunks in order and rebuilds the bundle, checking sizes and checksums.

    The header's sizes are checked against ``max_bytes`` before anything is allocated; then each chunk
    is verified against its own checksum and copied once, straight into its place in one buffer sized
    from the header, so the decoded tensors are views into it and nothing is joined at the end.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_STREAM_BYTES, keep_payload: bool = True) -> None:
        self.header: pb.TensorListHeader | None = None
        self.max_bytes = max_bytes
        self.keep_payload = keep_payload  # False: verify only (``verify``), e.g. a store that keeps the chunks
        self._dst: Tensor | None = None
        self._np: Any = None  # numpy view of _dst
        self._count = 0
        self._received = 0
        self._whole: _Checksum | None = None  # the older whole-payload form
        self._algo = ""  # the per-chunk form
        self._prefault: Prefaulter | None = None

    def _start(self, h: pb.TensorListHeader) -> None:
        if h.chunk_checksum:
            algo = _CHECKSUM_BY_WIRE_NAME.get(h.chunk_checksum)
            if algo is None:
                raise WireError(f"unknown tensor checksum algorithm {h.chunk_checksum[:24]!r}")
            self._algo = algo
        else:
            self._whole = _Checksum.for_header(h.checksum)
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
            self._dst = torch.empty(int(h.wire_bytes), dtype=torch.uint8)
        except RuntimeError:
            raise WireError(f"cannot allocate {h.wire_bytes} bytes for a tensor stream") from None
        self._prefault = prefault_async(self._dst)
        self._np = self._dst.numpy()

    def add(self, chunk: pb.TensorChunk | ChunkView) -> None:
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
        data = chunk.data  # read once: on a protobuf message each access copies
        n = len(data)
        if n > MAX_CHUNK_BYTES:
            raise WireError(f"tensor chunk of {n} bytes exceeds {MAX_CHUNK_BYTES}")
        if chunk.index >= h.num_chunks:
            raise WireError(f"more tensor chunks than the header's {h.num_chunks}")
        if self._received + n > h.wire_bytes:
            raise WireError("tensor stream longer than its header says")
        if self._algo:
            if _digest(self._algo, data) != chunk.checksum:
                raise WireError(f"tensor chunk {chunk.index}: checksum mismatch (corrupted transfer)")
        else:
            assert self._whole is not None
            self._whole.update(data)
        if n and self._np is not None:
            self._np[self._received : self._received + n] = np.frombuffer(data, dtype=np.uint8)
        self._count += 1
        self._received += n
        if self._prefault is not None:
            self._prefault.advance(n)

    def close(self) -> None:
        """Release the prefault helper (``finish``/``verify`` do; an abandoned stream's times out when idle)."""
        if self._prefault is not None:
            self._prefault.close()
            self._prefault = None

    @property
    def wire_bytes(self) -> int:
        return self._received

    def verify(self) -> pb.TensorListHeader:
        """Finish a stream without building tensors: sizes, checksums, and shapes against the payload size."""
        h = self._complete()
        if self._dst is None:
            _layout(h, int(h.raw_bytes))
        else:
            self.finish()
        return h

    def _complete(self) -> pb.TensorListHeader:
        self.close()
        h = self.header
        if h is None:
            raise WireError("empty tensor stream")
        if self._count != h.num_chunks or self._received != h.wire_bytes:
            raise WireError(f"tensor stream truncated: {self._received} of {h.wire_bytes} bytes")
        if self._whole is not None and self._whole.text() != h.checksum:
            raise WireError("tensor checksum mismatch (corrupted transfer)")
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
            raise WireError(f"unknown compression {h.compression}")
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
        raise WireError(f"unknown wire dtype {h.wire_dtype}")
    slots: list[_Slot] = []
    offset = 0
    for s in h.tensors:
        dtype = _DTYPES.get(s.dtype)
        if dtype is None:
            raise WireError(f"unknown tensor dtype {s.dtype!r}")
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


def chunk_message_bytes(chunk: pb.TensorChunk | ChunkView) -> bytes:
    """A received chunk's message bytes, to store and serve again as they are."""
    return chunk.serialized() if isinstance(chunk, ChunkView) else bytes(chunk.SerializeToString())


def decode_tensors(chunks: Iterable[pb.TensorChunk | ChunkView], max_bytes: int = DEFAULT_MAX_STREAM_BYTES) -> Bundle:
    asm = TensorAssembler(max_bytes)
    try:
        for c in chunks:
            asm.add(c)
        return asm.finish()
    finally:
        asm.close()


def check_shapes(got: Sequence[Tensor], like: Sequence[Tensor], what: str) -> None:
    """Raise WireError unless ``got`` has the same number, shapes and dtypes as ``like``."""
    if len(got) != len(like):
        raise WireError(f"{what}: {len(got)} tensors, expected {len(like)}")
    for i, (g, ref) in enumerate(zip(got, like, strict=True)):
        if g.shape != ref.shape or g.dtype != ref.dtype:
            raise WireError(
                f"{what}: tensor {i} is {g.dtype} {tuple(g.shape)}, expected {ref.dtype} {tuple(ref.shape)}"
            )


# ---- scalars -------------------------------------------------------------------------------------


def _scalars(m: Mapping[str, float]) -> dict[str, float]:
    return {str(k): float(v) for k, v in m.items()}


# ---- probes --------------------------------------------------------------------------------------


def probe_to_msg(p: Probe) -> agg_pb.ProbeMsg:
    return agg_pb.ProbeMsg(cid=p.cid, num_samples=p.num_samples, scalars=_scalars(p.scalars))


def probe_from_msg(m: agg_pb.ProbeMsg) -> Probe:
    if m.num_samples < 0:
        raise WireError(f"probe of client {m.cid}: negative sample count")
    return Probe(cid=int(m.cid), num_samples=int(m.num_samples), scalars=_scalars(m.scalars))


# ---- round payload -------------------------------------------------------------------------------


def payload_to_msg(p: RoundPayload, tensors_blob: str = "") -> agg_pb.RoundPayloadMsg:
    """The payload's tensors travel separately as a blob (``payload_bundle``); this carries the rest."""
    return agg_pb.RoundPayloadMsg(
        round=p.round,
        scalars=_scalars(p.scalars),
        per_client={int(c): pb.ScalarMap(values=_scalars(v)) for c, v in p.per_client.items()},
        tensors_blob=tensors_blob,
    )


def payload_bundle(p: RoundPayload) -> Bundle:
    return {k: list(v) for k, v in p.tensors.items()}


def payload_from_msg(m: agg_pb.RoundPayloadMsg, tensors: Bundle | None = None) -> RoundPayload:
    return RoundPayload(
        round=int(m.round),
        tensors=dict(tensors or {}),
        scalars=_scalars(m.scalars),
        per_client={int(c): _scalars(v.values) for c, v in m.per_client.items()},
    )


# ---- client updates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpdateMeta:
    """Routing fields of an upload that are not part of the core ``ClientUpdate``."""

    worker_id: str
    task_id: int
    round: int
    train_s: float = 0.0
    wire_bytes: int = 0


def update_wire(u: ClientUpdate, meta: UpdateMeta, spec: TransferSpec | None = None) -> Iterator[bytes]:
    """An upload as serialised ``UpdatePart`` messages: the header, then the tensors' chunks (group
    "params" = w_i(t+1), then the update's extra groups), each chunk built with one copy as it is sent."""
    if PARAMS_GROUP in u.tensors:
        raise WireError(f"update extra tensors may not be named {PARAMS_GROUP!r}")
    bundle: dict[str, Sequence[Tensor]] = {PARAMS_GROUP: u.params, **u.tensors}
    chunks = stream_wire(bundle, spec, wrap_field=UPDATE_PART_CHUNK_FIELD)
    header = agg_pb.UpdatePart(
        header=agg_pb.UpdateHeader(
            worker_id=meta.worker_id,
            task_id=meta.task_id,
            round=meta.round,
            cid=u.cid,
            num_samples=u.num_samples,
            train_loss=float(u.train_loss),
            scalars=_scalars(u.scalars),
            train_s=meta.train_s,
        )
    )
    return itertools.chain([header.SerializeToString()], chunks)


def update_to_parts(
    u: ClientUpdate, meta: UpdateMeta, spec: TransferSpec | None = None
) -> Iterator[agg_pb.UpdatePart]:
    """``update_wire`` as protobuf messages, for stubs with protobuf's own serializers."""
    return (agg_pb.UpdatePart.FromString(w) for w in update_wire(u, meta, spec))


@dataclass
class DecodedUpdate:
    meta: UpdateMeta
    update: ClientUpdate
    extra: dict[str, float] = field(default_factory=dict)


def update_from_parts(
    parts: Iterable[agg_pb.UpdatePart | WrappedChunkView], max_bytes: int = DEFAULT_MAX_STREAM_BYTES
) -> DecodedUpdate:
    it = iter(parts)
    first = next(it, None)
    if not isinstance(first, agg_pb.UpdatePart) or first.WhichOneof("part") != "header":
        raise WireError("an update stream must start with its header")
    h = first.header
    asm = TensorAssembler(max_bytes)
    try:
        for part in it:
            if part.WhichOneof("part") != "chunk":
                raise WireError("an update stream carries one header, then tensor chunks only")
            asm.add(part.chunk)
        bundle = asm.finish()
    finally:
        asm.close()
    if PARAMS_GROUP not in bundle:
        raise WireError("update carries no 'params' tensor group")
    params = bundle.pop(PARAMS_GROUP)
    if h.num_samples < 0:
        raise WireError(f"update of client {h.cid}: negative sample count")
    update = ClientUpdate(
        cid=int(h.cid),
        params=params,
        num_samples=int(h.num_samples),
        train_loss=float(h.train_loss),
        tensors=bundle,
        scalars=_scalars(h.scalars),
    )
    meta = UpdateMeta(h.worker_id, int(h.task_id), int(h.round), float(h.train_s), asm.wire_bytes)
    return DecodedUpdate(meta, update)


# ---- estimator service ---------------------------------------------------------------------------


def solve_online_request(
    run_id: str, rnd: int, c: float, thetas: Sequence[float], a: Sequence[float], b: Sequence[float],
    beta: float, variant: str,
) -> est_pb.SolveOnlineRequest:
    """The Phi2Estimator.estimate arguments as a SolveOnline request (clients numbered by position)."""
    if not len(thetas) == len(a) == len(b):
        raise WireError("thetas, a and b must have one entry per participant")
    return est_pb.SolveOnlineRequest(
        run_id=run_id, round=rnd, c=float(c),
        clients=[est_pb.ClientScalars(cid=i, a=float(ai), b=float(bi), theta=float(th))
                 for i, (th, ai, bi) in enumerate(zip(thetas, a, b, strict=True))],
        params=est_pb.FedEntParams(beta=float(beta), variant=variant),
    )


def estimate_from_reply(reply: est_pb.SolveOnlineReply) -> Phi2Estimate:
    report: dict[str, Any] = {}
    if reply.report_json:
        try:
            loaded = json.loads(reply.report_json)
        except ValueError:
            raise WireError("estimator reply: report_json is not JSON") from None
        if not isinstance(loaded, dict):
            raise WireError("estimator reply: report_json must be a JSON object")
        report = loaded
    report.setdefault("iterations", int(reply.iterations))
    report.setdefault("converged", bool(reply.converged))
    return Phi2Estimate(float(reply.phi2_next), report)


def start_offline_request(
    run_id: str, init_blob: str, sizes: Sequence[int], rounds: int, beta: float, gamma: float, variant: str,
    eps1: float, eps2: float, max_sweeps: int, seed: int, batch_size: int,
) -> est_pb.StartOfflineRequest:
    """Algorithm 1's inputs: w(0) (a blob already uploaded), every client's D_i, T and FedEnt's options."""
    return est_pb.StartOfflineRequest(
        run_id=run_id, init_blob=init_blob,
        clients=[est_pb.OfflineClient(cid=i, num_samples=int(n)) for i, n in enumerate(sizes)],
        rounds=int(rounds), params=est_pb.FedEntParams(beta=beta, gamma=gamma, variant=variant),
        eps1=eps1, eps2=eps2, max_sweeps=max_sweeps, seed=seed, batch_size=batch_size,
    )


def offline_estimator_from_job(job: est_pb.OfflineJob) -> OfflinePhi2Estimator:
    """A finished Algorithm 1 job as the in-process OfflinePhi2Estimator FedEnt reads φ2(t+1) from."""
    if job.state != "done":
        raise WireError(f"offline job {job.job_id} is {job.state}: {job.message}")
    report: dict[str, Any] = {}
    if job.report_json:
        try:
            loaded = json.loads(job.report_json)
        except ValueError:
            raise WireError("offline job: report_json is not JSON") from None
        report = loaded if isinstance(loaded, dict) else {}
    report.setdefault("stop_reason", job.stop_reason)
    report.setdefault("sweeps", int(job.sweep))
    try:
        return OfflinePhi2Estimator(list(job.phi2), report)
    except ValueError as e:
        raise WireError(f"offline job: {e}") from None


def oracle_request_cids(req: est_pb.OracleRequest) -> list[int]:
    return [int(c) for c in req.client_ids]


def oracle_result_messages(request_id: int, cid: int, num_samples: int, grads: Sequence[Tensor],
                           spec: TransferSpec | None = None) -> Iterator[est_pb.OracleMessage | bytes]:
    """One gradient answer on the Oracle stream: a header message, then its tensor chunks as serialised
    ``OracleMessage`` bytes (send them through ``rpc.estimator_stub``, whose serializer passes bytes on)."""
    yield est_pb.OracleMessage(result=est_pb.OracleResultHeader(request_id=request_id, cid=cid,
                                                                num_samples=num_samples))
    yield from stream_wire({"grad": list(grads)}, spec, wrap_field=ORACLE_MESSAGE_CHUNK_FIELD)
