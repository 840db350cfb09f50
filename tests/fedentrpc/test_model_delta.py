"""fedentrpc.model_delta: a model rebuilt from an XOR delta is bit-identical to the blob's own download in every
wire dtype (where a float subtraction is not), a delta that does not fit or rebuilds to another digest is refused,
and between nearby models the delta's byte planes compress well under zlib while a random model's do not."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch import Tensor

from fedentrpc import codec, model_delta
from fedentrpc.model_delta import DeltaError, DeltaInfo, Held


def _models(seed: int = 0, step: float = 1e-3) -> tuple[list[Tensor], list[Tensor]]:
    """w(t−1) and w(t) = w(t−1) + a small step, plus values a float subtraction cannot round-trip: sign changes,
    a jump of many orders of magnitude, inf, NaN and −0.0."""
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(64, 32, generator=g), torch.randn(32, generator=g)]
    new = [b + step * torch.randn(b.shape, generator=g) for b in base]
    base[1][:7] = torch.tensor([1e-30, -2.0, 3.0, 5.0, 0.0, 7.0, 1.0])
    new[1][:7] = torch.tensor([1.0, 2.0, float("inf"), float("nan"), -0.0, 1e30, -1e-8])
    return base, new


def _bits(ts: list[Tensor]) -> list[Tensor]:
    return [t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16) for t in ts]


def _full_download(params: list[Tensor], wire: str) -> list[Tensor]:
    return codec.decode_tensors(codec.encode_tensors({"params": params}, codec.TransferSpec(wire_dtype=wire)))["params"]


@pytest.mark.parametrize("wire", ["native", "float16", "bfloat16"])
def test_a_rebuilt_model_is_bit_identical_to_the_full_download(wire: str) -> None:
    base, new = _models()
    held = Held.of("r0-model", _full_download(base, wire), wire)  # what a worker holds after round 0
    target = model_delta.wire_form(new, wire)
    planes = model_delta.encode(list(held.wire), target)
    info = DeltaInfo("r0-model", held.digest, model_delta.digest(target), wire)
    got = held.rebuild(info, planes)
    full = _full_download(new, wire)
    assert [t.dtype for t in got] == [torch.float32, torch.float32]
    for a, b in zip(_bits(got), _bits(full), strict=True):
        assert torch.equal(a, b)  # bit for bit, NaN and -0.0 included
    assert Held.of("r1-model", got, wire).digest == info.digest


def test_a_float_subtraction_would_not_round_trip_where_the_xor_does() -> None:
    base, new = _models()
    sub = [b + (n - b) for b, n in zip(base, new, strict=True)]
    assert any(not torch.equal(a, b) for a, b in zip(_bits(sub), _bits(new), strict=True))  # why XOR, not w − b


def test_the_byte_planes_hold_every_elements_kth_byte_in_plane_k() -> None:
    b, t = torch.tensor([0x01020304, 0x0A0B0C0D], dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    (planes,) = model_delta.encode([b], [t])
    assert planes.tolist() == [0x04, 0x0D, 0x03, 0x0C, 0x02, 0x0B, 0x01, 0x0A]  # little-endian byte k of each
    assert torch.equal(model_delta.apply([t], [planes])[0], b)


def test_nearby_models_give_a_compressible_delta_and_unrelated_ones_do_not() -> None:
    base, new = _models(step=1e-4)
    raw = sum(t.numel() * 4 for t in new)
    near = model_delta.encode(base, new)
    assert len(zlib.compress(b"".join(p.numpy().tobytes() for p in near), 1)) < 0.6 * raw
    far = model_delta.encode(base, [torch.randn(t.shape) for t in new])
    assert len(zlib.compress(b"".join(p.numpy().tobytes() for p in far), 1)) > 0.85 * raw


def test_a_delta_that_does_not_fit_the_held_model_is_refused() -> None:
    base, new = _models()
    planes = model_delta.encode(base, new)
    with pytest.raises(DeltaError, match="2 tensors"):
        model_delta.apply(base[:1], planes)
    with pytest.raises(DeltaError, match="does not fit"):
        model_delta.apply(base, [planes[0][:-4], planes[1]])
    with pytest.raises(DeltaError, match="does not fit"):
        model_delta.apply(base, [planes[0].to(torch.int16), planes[1]])
    with pytest.raises(DeltaError, match="against the model's"):
        model_delta.encode(base, [new[0].t(), new[1]])


def test_rebuild_refuses_another_base_a_wrong_wire_dtype_and_a_wrong_digest() -> None:
    base, new = _models()
    held = Held.of("r0-model", base, "native")
    planes = model_delta.encode(list(held.wire), new)
    good = DeltaInfo("r0-model", held.digest, model_delta.digest(new), "native")
    with pytest.raises(DeltaError, match="holds 'r0-model'"):
        held.rebuild(DeltaInfo("r0-eval", held.digest, good.digest, "native"), planes)
    with pytest.raises(DeltaError, match="holds"):
        held.rebuild(DeltaInfo("r0-model", b"\0" * 32, good.digest, "native"), planes)
    with pytest.raises(DeltaError, match="float16"):
        held.rebuild(DeltaInfo("r0-model", held.digest, good.digest, "float16"), planes)
    tampered = [planes[0].clone(), planes[1]]
    tampered[0][5] ^= 1
    with pytest.raises(DeltaError, match="digest"):
        held.rebuild(good, tampered)
    assert all(torch.equal(a, b) for a, b in zip(_bits(held.rebuild(good, planes)), _bits(new), strict=True))


def test_the_digest_covers_dtypes_shapes_and_bytes() -> None:
    x = torch.arange(6, dtype=torch.float32)
    d = model_delta.digest([x])
    assert len(d) == model_delta.DIGEST_BYTES
    assert d == model_delta.digest([x.clone()])
    assert d != model_delta.digest([x.reshape(2, 3)])
    assert d != model_delta.digest([x.view(torch.int32)])
    y = x.clone()
    y[3] = 3.0000002
    assert d != model_delta.digest([y])
    assert model_delta.digest(model_delta.wire_form([x], "float16")) != d  # the wire form is what is named


def test_integer_and_bool_tensors_travel_natively_and_round_trip() -> None:
    base = [torch.tensor([1, 2, 3], dtype=torch.int64), torch.tensor([True, False])]
    new = [torch.tensor([1, 7, -3], dtype=torch.int64), torch.tensor([False, False])]
    wire = model_delta.wire_form(new, "float16")
    assert [t.dtype for t in wire] == [torch.int64, torch.bool]
    got = model_delta.apply(base, model_delta.encode(base, wire))
    assert torch.equal(got[0], new[0]) and torch.equal(got[1], new[1])
