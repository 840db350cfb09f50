"""Lossy upload encodings of a client's model delta: unbiased stochastic 8-bit, and top-k with error feedback.

Why: across a capped link the bytes of an upload, not compute, set a round's time (docs/cluster.md). Both act on
the delta d = w_i(t+1) − w(t), so the aggregator rebuilds w_i(t+1) = w(t) + decode(codes) from the round's model
it already has, and the client half (``fedent.rounds.host``) applies the same encode + decode to the update it
keeps, so the simulator aggregates exactly the values a cluster receives (cluster == simulator under
compression: the rounding is drawn from the ``fedent.rng`` stream keyed by (seed, "upload", round, client)).

* ``int8``: per tensor s = max|d| / 127, q = floor(d / s + u) with u ~ U[0, 1): E[s q] = d (unbiased), 1 byte
  per element plus one float per tensor (~4x fewer bytes than float32).
* ``topk``: x = d + e (e: the client's residual, ``ClientState.tensors["upload_residual"]``), keep the k =
  ceil(fraction × n) largest |x| per tensor (int32 index + float32 value: 8 bytes each), e ← x with the kept
  entries zeroed (error feedback: what is not sent now is sent later).
Pure tensors, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from fedent.rng import torch_generator

INT8_CODES, INT8_SCALES = "upload.int8.codes", "upload.int8.scales"
TOPK_INDEX, TOPK_VALUES = "upload.topk.index", "upload.topk.values"
GROUPS = {"int8": (INT8_CODES, INT8_SCALES), "topk": (TOPK_INDEX, TOPK_VALUES)}
RESIDUAL = "upload_residual"
Codes = dict[str, list[Tensor]]


def encode(delta: Sequence[Tensor], kind: str, seed: int, rnd: int, cid: int, fraction: float = 0.01,
           residual: Sequence[Tensor] | None = None) -> tuple[Codes, list[Tensor] | None]:
    """``delta`` (float tensors) as ``kind``'s codes, and top-k's new residual (None for int8)."""
    if kind == "int8":
        gen = torch_generator(seed, "upload", rnd, cid)
        codes, scales = [], []
        for d in delta:
            d = d.detach().to("cpu", torch.float32)
            s = d.abs().max() / 127 if d.numel() else torch.tensor(0.0)
            s = s if float(s) > 0 else torch.tensor(1.0)
            u = torch.rand(d.shape, generator=gen, dtype=torch.float32)
            codes.append(torch.floor(d / s + u).clamp_(-127, 127).to(torch.int8))
            scales.append(s.reshape(1).to(torch.float32))
        return {INT8_CODES: codes, INT8_SCALES: scales}, None
    if kind == "topk":
        index, values, left = [], [], []
        for i, d in enumerate(delta):
            x = d.detach().to("cpu", torch.float32).reshape(-1).clone()
            if residual is not None:
                x += residual[i].to("cpu", torch.float32).reshape(-1)
            k = min(x.numel(), max(1, math.ceil(fraction * x.numel()))) if x.numel() else 0
            idx = torch.topk(x.abs(), k, sorted=False).indices.sort().values
            index.append(idx.to(torch.int32))
            values.append(x[idx].clone())
            x[idx] = 0
            left.append(x.reshape(d.shape))
        return {TOPK_INDEX: index, TOPK_VALUES: values}, left
    raise ValueError(f"unknown upload encoding {kind!r}")


def decode(base: Sequence[Tensor], codes: Codes) -> list[Tensor]:
    """w(t) + the decoded delta, per tensor, in ``base``'s dtype and device (the one rebuild both the client
    half and the aggregator run, so both hold the same values)."""
    out = []
    if INT8_CODES in codes:
        for b, q, s in zip(base, codes[INT8_CODES], codes[INT8_SCALES], strict=True):
            d = q.to(torch.float32).reshape(b.shape) * s.to(torch.float32)
            out.append((b.detach().to("cpu", torch.float32) + d).to(b.dtype).to(b.device))
        return out
    if TOPK_INDEX in codes:
        for b, idx, v in zip(base, codes[TOPK_INDEX], codes[TOPK_VALUES], strict=True):
            flat = b.detach().to("cpu", torch.float32).reshape(-1).clone()
            flat[idx.to(torch.int64)] += v.to(torch.float32)
            out.append(flat.reshape(b.shape).to(b.dtype).to(b.device))
        return out
    raise ValueError("no upload codes to decode")


def check_codes(codes: Codes, like: Sequence[Tensor]) -> None:
    """ValueError unless ``codes`` fit a model shaped like ``like`` (an adversarial upload must not index
    outside a tensor or broadcast into another shape)."""
    for group in codes.values():
        if len(group) != len(like):
            raise ValueError(f"upload codes: {len(group)} tensors, the model has {len(like)}")
    if INT8_CODES in codes:
        for q, s, ref in zip(codes[INT8_CODES], codes[INT8_SCALES], like, strict=True):
            if q.dtype != torch.int8 or q.numel() != ref.numel() or s.numel() != 1 or not torch.isfinite(s).all():
                raise ValueError("upload codes: an int8 tensor does not fit the model")
    elif TOPK_INDEX in codes:
        for idx, v, ref in zip(codes[TOPK_INDEX], codes[TOPK_VALUES], like, strict=True):
            if idx.dtype != torch.int32 or idx.shape != v.shape or idx.dim() != 1 or v.dtype != torch.float32:
                raise ValueError("upload codes: a top-k tensor is malformed")
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= ref.numel()):
                raise ValueError("upload codes: a top-k index lies outside its tensor")
    else:
        raise ValueError("no upload codes")
