"""server.downloads: a held model kept with the right digest gets a delta, encoded once and marked on its first
message; an unknown, pruned (older than ``delta_history`` rounds) or mismatched base gets None (the whole blob), as
does a delta no smaller than the blob; the delta rebuilds to the published model."""

from __future__ import annotations

import torch
from torch import Tensor

from fedentrpc import codec, mappers, model_delta
from fedentrpc.model_delta import Held, HeldRef
from fedentrpc.v1 import aggregator_pb2 as pb
from server.downloads import DeltaDownloads

SPEC = codec.TransferSpec(chunk_bytes=4096)
BIG = 1 << 30  # a full blob size no delta reaches


def _model(seed: int, step: float = 0.0, of: list[Tensor] | None = None) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    if of is None:
        return [torch.randn(100, 50, generator=g), torch.randn(50, generator=g)]
    return [t + step * torch.randn(t.shape, generator=g) for t in of]


def _ref(blob: str, params: list[Tensor], wire: str = "native") -> HeldRef:
    return Held.of(blob, params, wire).ref


def test_a_kept_base_gets_a_delta_once_that_rebuilds_the_model() -> None:
    w0 = _model(0)
    w1 = _model(1, 1e-3, w0)
    d = DeltaDownloads(SPEC, history=1)
    d.publish(0, "r0-model", w0)
    d.publish(1, "r1-model", w1)
    enc = d.serve("r1-model", _ref("r0-model", w0), BIG)
    assert enc is not None and enc is d.serve("r1-model", _ref("r0-model", w0), BIG)  # encoded once, shared
    first = enc.as_messages(pb.AggregatorServiceFetchBlobResponse)[0]
    info = mappers.delta_from_msg(first)
    assert info is not None and info.base_blob == "r0-model" and info.digest == d.digest_of("r1-model")
    assert all(not m.HasField("delta") for m in enc.as_messages(pb.AggregatorServiceFetchBlobResponse)[1:])
    assert len(enc.chunks) > 1 and enc.chunks[0].header.compression == codec.COMPRESSIONS["zlib"]
    got = Held.of("r0-model", w0, "native").rebuild(info, codec.decode_tensors(enc.chunks)[model_delta.DELTA_GROUP])
    assert all(torch.equal(a, b) for a, b in zip(got, w1, strict=True))
    assert enc.wire_bytes < 0.8 * sum(t.numel() * 4 for t in w1)


def test_no_delta_from_an_unknown_mismatched_or_pruned_base() -> None:
    w = [_model(0)]
    for r in range(1, 4):
        w.append(_model(r, 1e-3, w[-1]))
    d = DeltaDownloads(SPEC, history=1)
    for r, params in enumerate(w):
        d.publish(r, f"r{r}-model", params)
    assert d.serve("r3-model", _ref("r2-model", w[2]), BIG) is not None
    assert d.serve("r3-model", _ref("r1-model", w[1]), BIG) is None  # two rounds back: pruned
    assert d.digest_of("r1-model") is None and d.digest_of("r2-model") is not None
    assert d.serve("r3-model", _ref("r2-model", w[1]), BIG) is None  # the right id, another model's digest
    assert d.serve("r3-model", _ref("r9-model", w[2]), BIG) is None
    assert d.serve("r3-payload", _ref("r2-model", w[2]), BIG) is None  # not a published model
    kept = DeltaDownloads(SPEC, history=2)
    for r, params in enumerate(w):
        kept.publish(r, f"r{r}-model", params)
    assert kept.serve("r3-model", _ref("r1-model", w[1]), BIG) is not None


def test_a_delta_no_smaller_than_the_blob_is_not_sent() -> None:
    w0 = _model(0)
    w1 = _model(1, 1e-3, w0)

    def served(full: int) -> codec.EncodedTensors | None:
        d = DeltaDownloads(SPEC, history=1)
        d.publish(0, "r0-model", w0)
        d.publish(1, "r1-model", w1)
        return d.serve("r1-model", _ref("r0-model", w0), full)

    enc = served(BIG)
    assert enc is not None
    assert served(enc.wire_bytes) is None  # as large as the blob: the blob itself
    assert served(enc.wire_bytes + 1) is not None


def test_deltas_are_in_the_wire_dtype_and_a_published_model_is_a_copy() -> None:
    w0 = _model(0)
    w1 = _model(1, 1e-3, w0)
    d = DeltaDownloads(codec.TransferSpec(wire_dtype="float16"), history=1)
    d.publish(0, "r0-eval", w0)
    d.publish(1, "r1-model", w1)
    expect = [t.half().float() for t in w1]  # what a float16 download of w1 decodes to
    w1[0].add_(1.0)  # the engine's tensors may change later: the kept version must not
    assert d.serve("r1-model", _ref("r0-eval", w0), BIG) is None  # a float32 digest does not name the fp16 model
    enc = d.serve("r1-model", _ref("r0-eval", w0, "float16"), BIG)
    assert enc is not None
    info = mappers.delta_from_msg(enc.as_messages(pb.AggregatorServiceFetchBlobResponse)[0])
    assert info is not None and info.wire_dtype == "float16"
    planes = codec.decode_tensors(enc.chunks)[model_delta.DELTA_GROUP]
    assert planes[0].numel() == 100 * 50 * 2  # two bytes per element: float16 bit patterns
    got = Held.of("r0-eval", w0, "float16").rebuild(info, planes)
    assert all(torch.equal(a, b) for a, b in zip(got, expect, strict=True))
