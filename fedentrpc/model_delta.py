"""A model sent as its difference from the one the receiver holds: XOR of bit patterns, as byte planes.

Why: across a capped link a round downloads the whole global model to every worker, though a worker that took
part in the last round holds w(t−1) already. The aggregator (``--download-encoding delta``) then sends w(t) as its
difference from that model, and the worker rebuilds w(t).

Why XOR and not w(t) − w(t−1): a float subtraction rounds (b + (w − b) ≠ w in float32 where w and b differ in
sign or by more than a factor of 2), and under a half-precision wire dtype the rebuilt model would drift from the
one a full download gives. XOR of the bit patterns in the wire dtype is exact: the rebuilt tensors are
**bit-identical** to what the blob's own download decodes to, whatever the wire dtype (native, float16,
bfloat16). Between nearby models the sign, exponent and high mantissa bits mostly agree, so the XOR's high bytes
are mostly zero; cut into byte planes (every element's first byte, then every second byte...) they compress
under zlib (the delta stream is always zlib-compressed: a dense delta is as large as the model uncompressed).

The digest names what a worker holds (SHA-256 of the tensors' dtypes, shapes and bytes in the wire dtype): the
aggregator sends a delta only from a model it still has with that digest, and the worker checks the rebuilt
model's digest against the one the aggregator sends. Pure tensors and hashlib, no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# the wire dtype names of fedentrpc.codec.TransferSpec and the torch dtype floating tensors travel in
WIRE_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DELTA_GROUP = "delta"
DIGEST_BYTES = 32
DOWNLOAD_ENCODINGS = ("full", "delta")  # the aggregator's --download-encoding (server.settings)


class DeltaError(ValueError):
    """A delta that does not fit the held model (another shape, size or dtype)."""


def wire_form(tensors: Sequence[Tensor], wire_dtype: str) -> list[Tensor]:
    """The tensors as the wire carries them: floating ones cast to the wire dtype (native: unchanged),
    contiguous on the CPU. A model decoded from that wire dtype maps back to the same bits (the cast is exact)."""
    target = WIRE_TORCH.get(wire_dtype)
    out = []
    for t in tensors:
        t = t.detach().to("cpu")
        if target is not None and t.is_floating_point():
            t = t.to(target)
        out.append(t.contiguous())
    return out


def _bits(t: Tensor) -> Tensor:
    """The tensor's bit patterns as an integer tensor of the same element size (a view, nothing copied)."""
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.reshape(-1).view(_BITS[t.element_size()])


def digest(wire: Sequence[Tensor]) -> bytes:
    """SHA-256 of ``wire`` (tensors in wire form): each tensor's dtype, shape and bytes, in order."""
    h = hashlib.sha256()
    for t in wire:
        h.update(f"{t.dtype}:{tuple(t.shape)};".encode())
        h.update(_bits(t.contiguous()).view(torch.uint8).numpy().data)
    return h.digest()


def encode(base: Sequence[Tensor], target: Sequence[Tensor]) -> list[Tensor]:
    """``target`` as its XOR with ``base`` (both in wire form, alike in shapes and dtypes): per tensor a uint8
    tensor of its byte planes, plane k holding byte k of every element."""
    if len(base) != len(target):
        raise DeltaError(f"the base has {len(base)} tensors, the model {len(target)}")
    out = []
    for b, t in zip(base, target, strict=True):
        if b.shape != t.shape or b.dtype != t.dtype:
            raise DeltaError(f"a base tensor {b.dtype}{tuple(b.shape)} against the model's {t.dtype}{tuple(t.shape)}")
        x = _bits(b.contiguous()) ^ _bits(t.contiguous())
        size = max(1, t.element_size())
        out.append(x.view(torch.uint8).reshape(-1, size).t().contiguous().reshape(-1))
    return out


def apply(base: Sequence[Tensor], planes: Sequence[Tensor]) -> list[Tensor]:
    """The model ``encode(base, target)`` came from: ``target`` in wire form, exactly. DeltaError when the planes
    do not fit ``base`` (an adversarial or mismatched stream must not broadcast or index elsewhere)."""
    if len(base) != len(planes):
        raise DeltaError(f"the delta has {len(planes)} tensors, the held model {len(base)}")
    out = []
    for b, p in zip(base, planes, strict=True):
        size = max(1, b.element_size())
        if p.dtype != torch.uint8 or p.dim() != 1 or p.numel() != b.numel() * size:
            raise DeltaError(f"a delta tensor of {p.numel()} {p.dtype} bytes does not fit a held "
                             f"{b.dtype}{tuple(b.shape)}")
        x = p.reshape(size, -1).t().contiguous().view(_BITS[size]).reshape(-1)
        bits = _bits(b.contiguous()) ^ x
        dtype = torch.uint8 if b.dtype == torch.bool else b.dtype
        t = bits.view(dtype).reshape(b.shape)
        out.append(t.to(torch.bool) if b.dtype == torch.bool else t)
    return out


@dataclass(frozen=True)
class HeldRef:
    """What a worker says it holds: a model blob's id and its digest (``HeldModel`` on the wire)."""

    blob_id: str
    digest: bytes


@dataclass(frozen=True)
class DeltaInfo:
    """What a delta stream says it is (``ModelDelta`` on its first message): the base it applies to, the rebuilt
    model's digest, and the wire dtype whose bit patterns were XORed."""

    base_blob: str
    base_digest: bytes
    digest: bytes
    wire_dtype: str


@dataclass(frozen=True)
class Held:
    """A model a worker keeps to rebuild the next one from: its blob id, its tensors' dtypes, the model in wire
    form (``wire_dtype``) and that form's digest."""

    blob_id: str
    wire_dtype: str
    wire: tuple[Tensor, ...]
    dtypes: tuple[torch.dtype, ...]
    digest: bytes

    @classmethod
    def of(cls, blob_id: str, tensors: Sequence[Tensor], wire_dtype: str) -> Held:
        wire = wire_form(tensors, wire_dtype)
        return cls(blob_id, wire_dtype, tuple(wire), tuple(t.dtype for t in tensors), digest(wire))

    @property
    def ref(self) -> HeldRef:
        return HeldRef(self.blob_id, self.digest)

    def rebuild(self, info: DeltaInfo, planes: Sequence[Tensor]) -> list[Tensor]:
        """The model the delta stream encodes, in this model's dtypes, bit-identical to the blob's own download;
        DeltaError when the stream is from another base, does not fit, or rebuilds to another digest."""
        if info.base_blob != self.blob_id or info.base_digest != self.digest:
            raise DeltaError(f"the delta is from {info.base_blob!r}, this worker holds {self.blob_id!r} "
                             "(or another digest)")
        if info.wire_dtype != self.wire_dtype:
            raise DeltaError(f"the delta XORs {info.wire_dtype} bit patterns, the held model is {self.wire_dtype}")
        wire = apply(self.wire, planes)
        if digest(wire) != info.digest:
            raise DeltaError("the rebuilt model's digest differs from the aggregator's")
        return [w.to(d) if w.dtype != d else w for w, d in zip(wire, self.dtypes, strict=True)]
