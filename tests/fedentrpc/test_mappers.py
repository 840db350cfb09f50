"""Fuzzing the wire decoders: whatever bytes arrive, fedentrpc.codec and fedentrpc.mappers either decode
them or raise their clear ``WireError`` (a ValueError with a one-line message) — never another exception, never a hang.

Inputs: random bytes parsed as each message type (protobuf's own DecodeError is gRPC's business and is
skipped), byte-level mutations of valid encoded streams, and structured random headers (odd dtypes,
shapes, counts, sizes, compression) with random payloads.
"""

from __future__ import annotations

import dataclasses
import math
import typing
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedent.config import OptionError
from fedent.strategies.options import FedEntOptions
from fedentrpc import codec, mappers
from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import tensor_pb2 as pb

# No per-example deadline (a loaded CI box would make it flaky); a hang is caught by the module timeout.
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
pytestmark = pytest.mark.timeout(120)


def clear_or_ok(fn: Callable[[], Any]) -> Any:
    """Run a decoder: success, or WireError with a one-line message; anything else fails the test."""
    try:
        return fn()
    except codec.WireError as e:
        msg = str(e)
        assert msg and "\n" not in msg
        return None


def as_header_says(out: codec.Bundle, chunks: list[pb.TensorChunk]) -> None:
    """A decoded bundle is exactly what its stream's header declares: the groups (names, order, counts), each
    tensor's dtype and shape, and the payload's size."""
    h = chunks[0].header
    assert list(out) == [g.name for g in h.groups]
    assert [len(out[g.name]) for g in h.groups] == [g.count for g in h.groups]
    tensors = [t for ts in out.values() for t in ts]
    assert [(codec.DTYPES[t.dtype], list(t.shape)) for t in tensors] == [(s.dtype, list(s.shape)) for s in h.tensors]
    assert sum(len(c.data) for c in chunks) == h.wire_bytes and len(chunks) == h.num_chunks
    wire = codec._WIRE_TORCH.get(h.wire_dtype)
    sent = [wire if wire is not None and t.is_floating_point() else t.dtype for t in tensors]
    assert sum(t.numel() * torch.empty((), dtype=d).element_size() for t, d in zip(tensors, sent, strict=True)) \
        == h.raw_bytes


def parsed(cls: type[Message], data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except DecodeError:
        return None


def _valid_chunks(chunk_bytes: int = 24, compression: str = "none") -> list[pb.TensorChunk]:
    bundle = {"params": [torch.arange(12, dtype=torch.float32).reshape(3, 4), torch.tensor([1, -2, 3])],
              "h": [torch.ones(2, dtype=torch.float64)]}
    spec = codec.TransferSpec(chunk_bytes=chunk_bytes, compression=compression)
    return list(codec.encode_tensors(bundle, spec))


# ---- random bytes as messages --------------------------------------------------------------------------


@FUZZ
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=4))
def test_random_bytes_as_tensor_chunks(blobs: list[bytes]) -> None:
    chunks = [c for c in (parsed(pb.TensorChunk, b) for b in blobs) if c is not None]
    if (out := clear_or_ok(lambda: codec.decode_tensors(chunks))) is not None:
        as_header_says(out, chunks)


@FUZZ
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=4))
def test_random_bytes_as_update_parts(blobs: list[bytes]) -> None:
    parts = [p for p in (parsed(agg_pb.SubmitUpdateRequest, b) for b in blobs) if p is not None]
    if (got := clear_or_ok(lambda: mappers.update_from_parts(parts))) is not None:
        h, u = parts[0].header, got.update
        assert (u.cid, u.num_samples, got.meta.round) == (h.cid, h.num_samples, h.round) and u.num_samples >= 0
        chunks = [p.chunk for p in parts[1:]]
        if [g.name for g in chunks[0].header.groups][:1] == [codec.PARAMS_GROUP]:
            as_header_says({codec.PARAMS_GROUP: u.params, **u.tensors}, chunks)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_as_small_messages(data: bytes) -> None:
    if (m := parsed(agg_pb.Probe, data)) is not None:
        clear_or_ok(lambda: mappers.probe_from_msg(m))
    if (m := parsed(agg_pb.RoundPayload, data)) is not None:
        clear_or_ok(lambda: mappers.payload_from_msg(m))
    if (m := parsed(pb.TransferSettings, data)) is not None:
        clear_or_ok(lambda: mappers.transfer_from_msg(m))
    if (m := parsed(est_pb.SolveOnlineResponse, data)) is not None:
        clear_or_ok(lambda: mappers.estimate_from_reply(m))
    if (m := parsed(est_pb.OfflineJob, data)) is not None:
        clear_or_ok(lambda: mappers.offline_estimator_from_job(m))


# ---- mutations of valid streams -------------------------------------------------------------------------


@st.composite
def mutated_stream(draw: st.DrawFn) -> list[bytes]:
    chunks = [c.SerializeToString() for c in _valid_chunks(draw(st.sampled_from([8, 24, 4096])),
                                                            draw(st.sampled_from(["none", "zlib"])))]
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(chunks) - 1))
        b = bytearray(chunks[i])
        op = draw(st.sampled_from(["flip", "truncate", "insert", "drop", "swap", "dup"]))
        if op == "flip" and b:
            j = draw(st.integers(0, len(b) - 1))
            b[j] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            b = b[: draw(st.integers(0, len(b)))]
        elif op == "insert":
            j = draw(st.integers(0, len(b)))
            b[j:j] = draw(st.binary(min_size=1, max_size=8))
        elif op == "drop" and len(chunks) > 1:
            del chunks[i]
            continue
        elif op == "swap" and len(chunks) > 1:
            j = draw(st.integers(0, len(chunks) - 1))
            chunks[i], chunks[j] = chunks[j], chunks[i]
            continue
        elif op == "dup":
            chunks.insert(i, bytes(b))
        chunks[i] = bytes(b)
    return chunks


@FUZZ
@given(mutated_stream())
def test_mutated_tensor_streams(raw_chunks: list[bytes]) -> None:
    chunks = [c for c in (parsed(pb.TensorChunk, r) for r in raw_chunks) if c is not None]
    out = clear_or_ok(lambda: codec.decode_tensors(chunks))
    if out is None:
        return
    as_header_says(out, chunks)
    # what the checksums protect: a mutated stream that still decodes to the original layout decodes to the
    # original values (never to other bytes)
    original = codec.decode_tensors(_valid_chunks())
    same_layout = list(out) == list(original) and all(
        [(t.dtype, t.shape) for t in out[k]] == [(t.dtype, t.shape) for t in original[k]] for k in out)
    if same_layout:
        assert all(torch.equal(x, y) for k in out for x, y in zip(out[k], original[k], strict=True))


@FUZZ
@given(mutated_stream())
def test_mutated_oracle_answers_through_the_estimator_hub(raw_chunks: list[bytes]) -> None:
    """The service's reader of gradient answers fails the request (or the stream), never crashes."""
    from estimator.hub import OracleHub

    hub = OracleHub()
    conn = hub.attach(est_pb.OracleHello(worker_id="w", client_ids=[0]))
    futs = hub.submit(conn, [0], "p", 0, 1, 0, 0)
    msgs = [est_pb.OracleRequest(result=est_pb.OracleResultHeader(request_id=1, cid=0))]
    msgs += [est_pb.OracleRequest(chunk=c) for c in (parsed(pb.TensorChunk, r) for r in raw_chunks) if c is not None]
    hub.consume(conn, iter(msgs))  # returns when the stream ends, whatever it held
    assert futs[0].done()
    assert not conn.alive


# ---- structured random headers ---------------------------------------------------------------------------

DTYPES = [*codec.DTYPES.values(), pb.DTYPE_UNSPECIFIED, 11, 99]  # every known dtype, unset, unknown


@st.composite
def random_stream(draw: st.DrawFn) -> list[pb.TensorChunk]:
    n = draw(st.integers(0, 3))
    specs = [pb.TensorSpec(dtype=draw(st.sampled_from(DTYPES)),
                           shape=draw(st.lists(st.one_of(st.integers(-2, 6), st.just(2**40), st.just(2**62)),
                                               max_size=3)))
             for _ in range(n)]
    counts = draw(st.lists(st.integers(0, 4), max_size=3))
    groups = [pb.TensorGroup(name=draw(st.sampled_from(["params", "h", "grad", ""])), count=c) for c in counts]
    payload = draw(st.binary(max_size=64))
    compression = draw(st.sampled_from([0, pb.COMPRESSION_NONE, pb.COMPRESSION_ZLIB, 7]))
    if compression == pb.COMPRESSION_ZLIB and draw(st.booleans()):
        payload = zlib.compress(payload)
    raw_len = draw(st.one_of(st.just(len(payload)), st.integers(0, 2**63)))
    pieces = [payload[i : i + 16] for i in range(0, len(payload), 16)] or [b""]
    good_sum = draw(st.booleans())
    algo = draw(st.sampled_from(list(codec.CHECKSUMS)))
    algo_value = codec.CHECKSUMS[algo] if good_sum else draw(st.sampled_from([0, *codec.CHECKSUMS.values(), 5]))
    header = pb.TensorListHeader(
        tensors=specs, groups=groups, wire_dtype=draw(st.sampled_from([0, 1, 2, 3, 9])), compression=compression,
        raw_bytes=raw_len, wire_bytes=draw(st.one_of(st.just(len(payload)), st.integers(0, 2**63))),
        checksum_algorithm=algo_value, num_chunks=draw(st.one_of(st.just(len(pieces)), st.integers(0, 2**32 - 1))))
    chunks = [pb.TensorChunk(index=i, data=p,
                             checksum=codec.checksum(algo, p) if good_sum else draw(st.integers(0, 2**32 - 1)))
              for i, p in enumerate(pieces)]
    chunks[0].header.CopyFrom(header)
    return chunks


@FUZZ
@given(random_stream())
def test_random_headers_and_payloads(chunks: list[pb.TensorChunk]) -> None:
    if (out := clear_or_ok(lambda: codec.decode_tensors(chunks))) is not None:
        as_header_says(out, chunks)
        h = chunks[0].header
        payload = b"".join(c.data for c in chunks)
        raw = zlib.decompress(payload) if h.compression == pb.COMPRESSION_ZLIB else payload
        if h.wire_dtype == pb.WIRE_DTYPE_NATIVE and not any(t.dtype == torch.bool for ts in out.values() for t in ts):
            assert b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for ts in out.values()
                            for t in ts) == raw  # the tensors are the payload's bytes, in order


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers(-(2**60), 2**60) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)


@FUZZ
@given(st.dictionaries(st.text(max_size=10), JSON_LIKE, max_size=4), st.lists(st.floats(allow_nan=True), max_size=4),
       st.integers(0, 6), st.integers(0, 4))
def test_estimator_replies_with_odd_reports_and_trajectories(report: dict[str, Any], phi2: list[float], state: int,
                                                             stop: int) -> None:
    struct = struct_pb2.Struct()
    struct.update({k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in report.items()})
    reply = est_pb.SolveOnlineResponse(phi2_next=1.0, report=struct)
    clear_or_ok(lambda: mappers.estimate_from_reply(reply))
    job = est_pb.OfflineJob(job_id="j", state=state, stop_reason=stop, phi2=phi2, report=struct)  # type: ignore[arg-type]
    clear_or_ok(lambda: mappers.offline_estimator_from_job(job))


@FUZZ
@given(st.dictionaries(st.text(max_size=10), JSON_LIKE, max_size=4))
def test_structs_round_trip_json_like_dicts(d: dict[str, Any]) -> None:
    """What dict_to_struct sends, struct_to_dict gives back (ints as ints), or it refuses with a WireError."""
    try:
        s = mappers.dict_to_struct(d)
    except codec.WireError:
        return  # an int too large for a double
    back = mappers.struct_to_dict(s)

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, float) and math.isnan(x):
            return isinstance(y, float) and math.isnan(y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, list):
            return isinstance(y, list) and len(x) == len(y) and all(map(same, x, y))
        return bool(x == y) and (type(x) is type(y) or isinstance(x, float) and x.is_integer())

    assert same(d, back), (d, back)


def test_the_fuzz_oracle_itself_rejects_other_exceptions() -> None:
    """clear_or_ok lets only WireError through, so a decoder raising anything else fails these tests."""
    def boom() -> None:
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        clear_or_ok(boom)
    assert clear_or_ok(lambda: codec.decode_tensors(_valid_chunks()))["h"][0].dtype == torch.float64


# ---- FedEntOptions on the wire: one mapper pair (fedent_options_to_msg / _from_msg) carries the options whole,
# and the receiver's errors are structured (field, why), never re-parsed from a message ----------------------

# every field away from its default (a field added to FedEntOptions without a value here fails the test below)
NON_DEFAULT = {"beta": 0.5, "gamma": 0.25, "variant": "paper", "estimator": "offline", "eps1": 0.02, "eps2": 0.03,
               "max_sweeps": 7, "probe_batch_size": 16, "eta_max": 0.5, "phi2_rate": "star",
               "offline_clients": "population"}


def test_every_field_round_trips_unchanged_away_from_its_default() -> None:
    default = FedEntOptions()
    fields = {f.name for f in dataclasses.fields(FedEntOptions)}
    assert set(NON_DEFAULT) == fields, "give every FedEntOptions field a non-default value here"
    opts = FedEntOptions(**NON_DEFAULT)  # type: ignore[arg-type]
    for name in fields:
        assert getattr(opts, name) != getattr(default, name), name
    back = mappers.fedent_options_from_msg(est_pb.FedEntParams.FromString(
        mappers.fedent_options_to_msg(opts).SerializeToString()))
    assert back == opts


@pytest.mark.parametrize("nulls", [{"eta_max": None}, {"probe_batch_size": None},
                                   {"eta_max": None, "probe_batch_size": None}])
def test_null_options_travel_as_unset_fields(nulls: dict[str, None]) -> None:
    opts = FedEntOptions(**{**NON_DEFAULT, **nulls})  # type: ignore[arg-type]
    msg = mappers.fedent_options_to_msg(opts)
    for name in nulls:
        assert not msg.HasField(name)
    assert mappers.fedent_options_from_msg(msg) == opts


def test_the_enum_tables_cover_the_options_choices_exactly() -> None:
    hints = typing.get_type_hints(FedEntOptions)
    for name, table in (("variant", mappers.VARIANTS), ("phi2_rate", mappers.PHI2_RATES),
                        ("estimator", mappers.ESTIMATOR_MODES), ("offline_clients", mappers.OFFLINE_CLIENTS)):
        assert set(table) == set(typing.get_args(hints[name])), name
        assert 0 not in table.values(), f"{name}: UNSPECIFIED must not map to a choice"


@pytest.mark.parametrize("name", ["variant", "phi2_rate", "estimator", "offline_clients"])
@pytest.mark.parametrize("value", [0, 99])
def test_a_bad_enum_value_is_a_structured_error_naming_the_field(name: str, value: int) -> None:
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    setattr(msg, name, value)
    with pytest.raises(OptionError) as e:
        mappers.fedent_options_from_msg(msg)
    assert isinstance(e.value, ValueError)  # the service answers INVALID_ARGUMENT
    assert e.value.field == name and [f for f, _ in e.value.fields] == [name]
    assert ("UNSPECIFIED is not allowed" if value == 0 else "value 99 is not allowed") in e.value.why
    assert str(e.value).startswith(f"params.{name}: ")


def test_every_problem_is_reported_keyed_by_the_field() -> None:
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    msg.variant = 0  # type: ignore[assignment]
    msg.phi2_rate = 0  # type: ignore[assignment]
    with pytest.raises(OptionError) as e:
        mappers.fedent_options_from_msg(msg)
    assert [f for f, _ in e.value.fields] == ["variant", "phi2_rate"]
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    msg.beta, msg.max_sweeps = 1.5, 0
    with pytest.raises(OptionError) as e:
        mappers.fedent_options_from_msg(msg, prefix="request")
    assert e.value.fields == [("beta", "must be in (0, 1), got 1.5"), ("max_sweeps", "must be >= 1, got 0")]
    assert str(e.value) == "request.beta: must be in (0, 1), got 1.5; request.max_sweeps: must be >= 1, got 0"


def test_numbers_are_taken_as_sent_not_defaulted() -> None:
    """No second set of defaults: a number left at proto3's 0 is the value 0 (γ = 0 is valid, β = 0 is not)."""
    msg = mappers.fedent_options_to_msg(FedEntOptions())
    msg.gamma = 0.0
    assert mappers.fedent_options_from_msg(msg).gamma == 0.0
    msg.ClearField("beta")
    with pytest.raises(OptionError, match=r"params\.beta: must be in \(0, 1\), got 0\.0"):
        mappers.fedent_options_from_msg(msg)


def test_wire_errors_carry_field_and_why() -> None:
    with pytest.raises(codec.WireError) as e:
        mappers.phase_from_msg(0)
    assert e.value.field == "run status: phase" and e.value.why.startswith("RUN_PHASE_UNSPECIFIED is not allowed")
    assert str(e.value) == f"{e.value.field}: {e.value.why}"
    plain = codec.WireError("no field")
    assert plain.field is None and plain.why == "no field" and str(plain) == "no field"


def test_requests_carry_the_options_whole() -> None:
    opts = FedEntOptions(**NON_DEFAULT)  # type: ignore[arg-type]
    online = mappers.solve_online_request("r", 1, opts, c=1.0, thetas=[1.0], a=[0.1], b=[0.2])
    offline = mappers.start_offline_request("r", opts, init_blob="b", sizes=[3], rounds=2, seed=4, batch_size=8,
                                            base_lr=0.1)
    assert mappers.fedent_options_from_msg(online.params) == opts
    assert mappers.fedent_options_from_msg(offline.params) == opts


def test_a_masked_update_crosses_the_wire_bit_for_bit() -> None:
    """Secure aggregation: the uint64 ring vector travels as an int64 group and comes back unchanged, with no
    clear model; a malformed masked group is a WireError."""
    import numpy as np

    from fedent.strategies.base import ClientUpdate
    from fedentrpc.mappers import MASKED_GROUP, UpdateMeta, update_from_parts, update_to_parts

    ring = np.array([0, 1, 2 ** 63, 2 ** 64 - 1, 12345678901234567890], dtype=np.uint64)
    u = ClientUpdate(3, [], 12, 0.5, {}, {"eta": 0.1}, masked=ring)
    got = update_from_parts(list(update_to_parts(u, UpdateMeta("w", 1, 2)))).update
    assert got.params == [] and got.tensors == {} and got.scalars == {"eta": 0.1}
    assert got.masked is not None and got.masked.dtype == np.uint64 and np.array_equal(got.masked, ring)
    bad = ClientUpdate(3, [], 12, 0.5, {MASKED_GROUP: [torch.zeros(2)]})
    with pytest.raises(codec.WireError, match="secagg_masked"):
        list(update_to_parts(bad, UpdateMeta("w", 1, 2)))


def _encoded_upload(kind: str) -> tuple[list[torch.Tensor], Any]:
    from fedent import compress
    from fedent.strategies.base import ClientUpdate

    base = [torch.linspace(-1, 1, 50).reshape(5, 10), torch.ones(7)]
    delta = [torch.sin(torch.arange(50.0)).reshape(5, 10) * 0.1, torch.full((7,), -0.2)]
    codes, _ = compress.encode(delta, kind, seed=3, rnd=2, cid=4, fraction=0.2)
    return base, ClientUpdate(cid=4, params=compress.decode(base, codes), num_samples=9, train_loss=0.1, codes=codes)


@pytest.mark.parametrize("kind", ["int8", "topk"])
def test_an_encoded_upload_sends_its_codes_and_is_rebuilt_from_the_rounds_model(kind: str) -> None:
    """The worker sends the codes instead of params (fewer bytes); the receiver rebuilds exactly the client
    half's params from w(t); without w(t), or with a model it does not fit, it is refused."""
    base, u = _encoded_upload(kind)
    parts = list(mappers.update_to_parts(u, mappers.UpdateMeta("w", 1, 2)))
    asm = codec.TensorAssembler()
    for p in parts[1:]:
        asm.add(p.chunk)
    bundle = asm.finish()
    assert codec.PARAMS_GROUP not in bundle
    assert asm.wire_bytes < sum(t.numel() * 4 for t in base) / 2
    dec = mappers.update_from_bundle(parts[0].header, dict(bundle), asm.wire_bytes, lambda rnd: base)
    assert all(torch.equal(a, b) for a, b in zip(dec.update.params, u.params, strict=True))
    with pytest.raises(codec.WireError, match="cannot decode"):
        mappers.update_from_bundle(parts[0].header, dict(bundle), asm.wire_bytes)
    with pytest.raises(codec.WireError, match="upload codes"):
        mappers.update_from_bundle(parts[0].header, dict(bundle), asm.wire_bytes, lambda rnd: base[:1])


def test_delta_download_messages_round_trip_and_unknown_values_are_refused() -> None:
    from fedentrpc import model_delta

    assert {mappers.download_encoding_from_msg(mappers.download_encoding_to_msg(n))
            for n in model_delta.DOWNLOAD_ENCODINGS} == set(model_delta.DOWNLOAD_ENCODINGS)
    assert set(mappers.DOWNLOAD_ENCODINGS.values()) == set(agg_pb.DownloadEncoding.values()) - {0}
    with pytest.raises(codec.WireError, match="DOWNLOAD_ENCODING_UNSPECIFIED is not allowed"):
        mappers.download_encoding_from_msg(agg_pb.DOWNLOAD_ENCODING_UNSPECIFIED)
    ref = model_delta.HeldRef("r3-eval", bytes(range(32)))
    req = agg_pb.AggregatorServiceFetchBlobRequest(blob_id="r4-model", held=mappers.held_to_msg(ref))
    assert mappers.held_from_msg(req) == ref
    assert mappers.held_from_msg(agg_pb.AggregatorServiceFetchBlobRequest(blob_id="r4-model")) is None
    for bad in (agg_pb.HeldModel(blob_id="", digest=bytes(32)), agg_pb.HeldModel(blob_id="r3-eval", digest=b"x"),
                agg_pb.HeldModel(blob_id="r" * 201, digest=bytes(32))):
        with pytest.raises(codec.WireError, match="held"):
            mappers.held_from_msg(agg_pb.AggregatorServiceFetchBlobRequest(blob_id="r4-model", held=bad))
    info = model_delta.DeltaInfo("r3-eval", bytes(32), bytes(range(32)), "bfloat16")
    msg = agg_pb.AggregatorServiceFetchBlobResponse(delta=mappers.delta_to_msg(info))
    assert mappers.delta_from_msg(msg) == info
    assert mappers.delta_from_msg(agg_pb.AggregatorServiceFetchBlobResponse()) is None
    msg.delta.encoding = agg_pb.DELTA_ENCODING_UNSPECIFIED
    with pytest.raises(codec.WireError, match="delta.encoding"):
        mappers.delta_from_msg(msg)
    msg.delta.encoding, msg.delta.wire_dtype = agg_pb.DELTA_ENCODING_XOR_PLANES, 9
    with pytest.raises(codec.WireError, match="delta.wire_dtype"):
        mappers.delta_from_msg(msg)
