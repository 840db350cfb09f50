"""All-gather a rank's results with their arrays as one flat byte tensor, not pickled inside the objects.

``torch.distributed.all_gather_object`` pickles everything: a round of 100 MNIST-CNN uploads (1.66 M float32
parameters each) became ~660 MB of pickles, copied into a byte tensor, gathered, copied out and unpickled, and
rank 0 of ``bench_distributed.py`` spent 38 % of its run in those gathers. Here a result is split in two:

* a *skeleton*, the same object with every plain tensor and numeric numpy array replaced by a ``Slot`` (dtype,
  shape, where its bytes lie): client ids, sample counts, losses, scalars, the slots. It is small and travels
  with ``all_gather_object`` as before (with the length of the rank's byte buffer);
* the arrays' bytes, one contiguous uint8 buffer per rank (every tensor viewed as bytes, so each dtype travels
  bit for bit, and one buffer serves mixed dtypes), all-gathered with ``torch.distributed.all_gather`` after
  padding it to the longest rank's length (gloo for CPU tensors; the padding is never read back: every slot
  says where its bytes end).

The walk keeps every field an object carries (lists, tuples, dicts and dataclass fields are rebuilt around
their arrays; anything else, e.g. a tensor subclass or a bytes answer, rides in the skeleton and is pickled as
before), so secure aggregation's masked vectors (numpy uint64) and SCAFFOLD's tensor groups travel too. A rank
gets its own part back as it gave it (nothing to copy); the other ranks' arrays are fresh CPU copies, as the
unpickled ones were.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from fedent.distributed import World, WorldError, raise_failures, said

T = TypeVar("T")


@dataclass(frozen=True)
class Slot:
    """Where one array's bytes lie in its rank's flat buffer, and how to read them back."""

    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype | np.dtype[Any]
    requires_grad: bool = False  # a torch tensor's flag (numpy arrays: False)


def _flat_array(obj: Any) -> bool:
    """A plain strided tensor or a numeric numpy array: what travels as bytes (subclasses, sparse or quantized
    tensors and object arrays stay in the skeleton)."""
    if type(obj) is Tensor:
        return obj.layout == torch.strided and not obj.is_quantized
    return type(obj) is np.ndarray and obj.dtype.kind in "biufc"


def _nbytes(a: Tensor | np.ndarray) -> int:
    return int(a.numel() * a.element_size()) if isinstance(a, Tensor) else int(a.nbytes)


class _Packer:
    """Collects the arrays of one object, in the order its skeleton's slots name them."""

    def __init__(self) -> None:
        self.arrays: list[Tensor | np.ndarray] = []
        self.slots: list[Slot] = []
        self.length = 0

    def strip(self, obj: Any) -> Any:
        if _flat_array(obj):
            n = _nbytes(obj)
            grad = bool(obj.requires_grad) if isinstance(obj, Tensor) else False
            slot = Slot(self.length, n, tuple(int(s) for s in obj.shape), obj.dtype, grad)
            self.arrays.append(obj)
            self.slots.append(slot)
            self.length += n
            return slot
        if type(obj) is list:
            return [self.strip(v) for v in obj]
        if type(obj) is tuple:
            return tuple(self.strip(v) for v in obj)
        if type(obj) is dict:
            return {k: self.strip(v) for k, v in obj.items()}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            out = copy.copy(obj)  # every field kept; frozen ones too (set below as __init__ would)
            for f in dataclasses.fields(obj):
                object.__setattr__(out, f.name, self.strip(getattr(obj, f.name)))
            return out
        return obj

    def write(self, buf: Tensor) -> None:
        """Copy every array's bytes into ``buf`` (CPU uint8, at least ``self.length`` long)."""
        for a, s in zip(self.arrays, self.slots, strict=True):
            if not s.nbytes:
                continue
            if isinstance(a, Tensor):
                src = a.detach().resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)  # lazy conj: values
            else:
                src = torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
            buf[s.offset:s.offset + s.nbytes].copy_(src)


def _read(buf: Tensor, s: Slot) -> Tensor | np.ndarray:
    if s.offset + s.nbytes > buf.numel():
        raise WorldError(f"an all-gathered buffer of {buf.numel()} bytes ends before its array "
                         f"[{s.offset}, {s.offset + s.nbytes})")
    raw = buf[s.offset:s.offset + s.nbytes].clone()  # own storage, aligned: viewing it as any dtype is allowed
    if isinstance(s.dtype, torch.dtype):
        t = raw.view(s.dtype).reshape(s.shape)
        return t.requires_grad_(True) if s.requires_grad else t
    return raw.numpy().view(s.dtype).reshape(s.shape)


def fill(skeleton: Any, buf: Tensor) -> Any:
    """The object a skeleton stands for, its slots read from ``buf`` (the inverse of ``_Packer.strip``)."""
    if isinstance(skeleton, Slot):
        return _read(buf, skeleton)
    if type(skeleton) is list:
        return [fill(v, buf) for v in skeleton]
    if type(skeleton) is tuple:
        return tuple(fill(v, buf) for v in skeleton)
    if type(skeleton) is dict:
        return {k: fill(v, buf) for k, v in skeleton.items()}
    if dataclasses.is_dataclass(skeleton) and not isinstance(skeleton, type):
        out = copy.copy(skeleton)
        for f in dataclasses.fields(skeleton):
            object.__setattr__(out, f.name, fill(getattr(skeleton, f.name), buf))
        return out
    return skeleton


class Buffers:
    """The send and receive buffers of one caller's gathers, kept from one to the next: a round's updates are
    the same size every round, and fresh buffers of hundreds of MB cost their page faults again each time. Holds
    (P + 1) × the longest rank's bytes between gathers; nothing returned aliases them (``_read`` copies)."""

    def __init__(self) -> None:
        self.send = torch.empty(0, dtype=torch.uint8)
        self.recv: list[Tensor] = []

    def get(self, n: int, size: int) -> tuple[Tensor, list[Tensor]]:
        if self.send.numel() < n or len(self.recv) != size:
            self.send = torch.empty(0, dtype=torch.uint8)  # the old ones go before the new ones come
            self.recv = []
            self.send = torch.empty(n, dtype=torch.uint8)
            self.recv = [torch.empty(n, dtype=torch.uint8) for _ in range(size)]
        return self.send[:n], [b[:n] for b in self.recv]


def all_gather_flat(world: World, obj: T, buffers: Buffers | None = None,
                    error: BaseException | None = None) -> list[T]:
    """Every rank's ``obj`` in rank order, like ``world.all_gather``; the arrays inside travel as one flat byte
    tensor per rank (rank r's own ``obj`` comes back unchanged, the others' arrays on the CPU). ``buffers``: keep
    the byte buffers for the next call (None: fresh ones, freed on return). ``error``: this rank failed in its own
    part; what it ``said`` travels with the skeletons, and if any rank failed every rank raises before the byte
    gather (``raise_failures``: its own error, or ``RanksFailed``), so no rank already short of memory allocates
    buffers sized for the healthy ranks' updates."""
    if not world.distributed:
        raise_failures(1, error, [])
        return [obj]
    packer = _Packer()
    skeleton = packer.strip(obj)
    parts = world.all_gather((skeleton, packer.length, said(error)))
    raise_failures(world.size, error, [(r, why) for r, (_, _, why) in enumerate(parts)])
    longest = max(int(n) for _, n, _ in parts)
    if longest == 0:  # nothing but small fields (probes, answers, failures): the object gather was all
        bufs = [torch.empty(0, dtype=torch.uint8) for _ in parts]
    else:
        mine, bufs = (buffers or Buffers()).get(longest, len(parts))
        packer.write(mine)  # the tail past packer.length is padding, never read
        dist.all_gather(bufs, mine)
    return [obj if r == world.rank else fill(skel, bufs[r][:int(n)]) for r, (skel, n, _) in enumerate(parts)]
