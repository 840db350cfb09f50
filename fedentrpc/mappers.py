"""Message mappers: the core's types <-> their protobuf messages, one small explicit function each.

Why it exists: the core (``fedent``) knows no protobuf, and the services should not build messages field
by field; this is the one place where ``Probe``, ``RoundPayload``, ``ClientUpdate``, the estimator's
requests and answers, the transfer settings and the delta downloads' ``HeldModel`` / ``ModelDelta`` meet their
messages. Tensors inside them travel through ``codec`` (an update's chunks in the ``SubmitUpdateRequest.chunk``
oneof, a gradient answer's in ``OracleRequest.chunk``). Decoding validates and raises ``codec.WireError`` with a
one-line message.

Enums: each proto enum has one table here (Python value <-> enum value; the tensor-level ones are in
``codec``). A value outside its table (``*_UNSPECIFIED``, or one from newer protos) is a WireError, which a
servicer answers with INVALID_ARGUMENT. Free-form dicts (the worker's config, the estimator's reports)
travel as ``google.protobuf.Struct``: ``dict_to_struct`` / ``struct_to_dict``.

Why ~560 lines in one module: it is the one place named above, a flat list of small to/from pairs that share
the enum lookup and the Struct helpers; split by service, no part would be simpler and the helpers would cross
modules.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from google.protobuf import struct_pb2
from torch import Tensor

from fedent import compress
from fedent.config import OptionError
from fedent.meanfield.estimator import OfflinePhi2Estimator, Phi2Estimate
from fedent.rounds.evaluation import ClientEval
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload
from fedent.strategies.options import FedEntOptions
from fedentrpc import model_delta
from fedentrpc.codec import (
    COMPRESSIONS,
    DEFAULT_MAX_STREAM_BYTES,
    MAX_CHUNK_BYTES,
    PARAMS_GROUP,
    WIRE_DTYPES,
    Bundle,
    TensorAssembler,
    TransferSpec,
    WireError,
    tensor_chunks,
    wrap_chunks,
)
from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import tensor_pb2 as pb


def _scalars(m: Mapping[str, float]) -> dict[str, float]:
    return {str(k): float(v) for k, v in m.items()}


def _enum_name(enum: Any, value: int) -> str:
    try:
        return str(enum.Name(value))
    except ValueError:
        return f"value {value}"


def _lookup(table: Mapping[Any, Any], value: Any, what: str, enum: Any) -> Any:
    """``table[value]`` for a received enum value; WireError naming the field and the allowed values."""
    try:
        return table[value]
    except KeyError:
        allowed = ", ".join(_enum_name(enum, v) for v in sorted(set(table)))
        raise WireError(field=what, why=f"{_enum_name(enum, value)} is not allowed; send one of {allowed}") from None


UPLOAD_PREFIX = "upload."  # tensor groups of an encoded upload's codes (fedent.compress)
_CODE_SETS = [set(g) for g in compress.GROUPS.values()]

# ---- google.protobuf.Struct <-> dict ------------------------------------------------------------------

MAX_EXACT_INT = 2**53  # a Struct holds numbers as doubles: larger ints would come back changed


def _plain(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (bool, str, float)):
        return v
    if isinstance(v, int):
        if abs(v) > MAX_EXACT_INT:
            raise WireError(f"{where}: the integer {v} is too large to travel exactly in a Struct")
        return float(v)
    if isinstance(v, Mapping):
        return {str(k): _plain(x, f"{where}.{k}") for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x, f"{where}[{i}]") for i, x in enumerate(v)]
    for conv in ("tolist", "item"):  # numpy / torch scalars and arrays
        fn = getattr(v, conv, None)
        if callable(fn):
            return _plain(fn(), where)
    raise WireError(f"{where}: cannot send a {type(v).__name__} in a Struct")


def dict_to_struct(d: Mapping[str, Any], what: str = "struct") -> struct_pb2.Struct:
    """A JSON-like dict as a Struct (ints up to 2**53 travel exactly; NaN and inf travel as they are)."""
    out = struct_pb2.Struct()
    out.update(_plain(d, what))
    return out


def _from_value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "number_value":
        x = v.number_value
        # integral doubles come back as ints: the config's int fields (seed, rounds, batch sizes) need them,
        # and its float fields accept ints
        return int(x) if math.isfinite(x) and x == int(x) and abs(x) <= MAX_EXACT_INT else x
    if kind == "struct_value":
        return struct_to_dict(v.struct_value)
    if kind == "list_value":
        return [_from_value(x) for x in v.list_value.values]
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    return None  # null_value, or unset


def struct_to_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    """The dict a Struct holds, integral numbers as ints (``dict_to_struct``'s inverse for JSON-like dicts)."""
    return {k: _from_value(v) for k, v in s.fields.items()}


# ---- transfer settings -------------------------------------------------------------------------------


def transfer_to_msg(spec: TransferSpec) -> pb.TransferSettings:
    return pb.TransferSettings(wire_dtype=WIRE_DTYPES[spec.wire_dtype], compression=COMPRESSIONS[spec.compression],
                               chunk_bytes=spec.chunk_bytes)


DOWNLOAD_ENCODINGS = {"full": agg_pb.DOWNLOAD_ENCODING_FULL, "delta": agg_pb.DOWNLOAD_ENCODING_DELTA}


def download_encoding_to_msg(name: str) -> agg_pb.DownloadEncoding:
    return DOWNLOAD_ENCODINGS[name]


def download_encoding_from_msg(value: int) -> str:
    return str(_lookup({v: k for k, v in DOWNLOAD_ENCODINGS.items()}, value, "download_encoding",
                       agg_pb.DownloadEncoding))


def held_to_msg(held: model_delta.HeldRef | None) -> agg_pb.HeldModel | None:
    return None if held is None else agg_pb.HeldModel(blob_id=held.blob_id, digest=held.digest)


def held_from_msg(req: agg_pb.AggregatorServiceFetchBlobRequest) -> model_delta.HeldRef | None:
    """The model a FetchBlob caller holds, or None (no ``held``); WireError for a malformed one."""
    if not req.HasField("held"):
        return None
    h = req.held
    if not h.blob_id or len(h.blob_id) > 200 or len(h.digest) != model_delta.DIGEST_BYTES:
        raise WireError(field="held", why=f"a blob id (≤ 200 characters) and a {model_delta.DIGEST_BYTES}-byte "
                                          "digest are needed")
    return model_delta.HeldRef(h.blob_id, bytes(h.digest))


def delta_to_msg(info: model_delta.DeltaInfo) -> agg_pb.ModelDelta:
    return agg_pb.ModelDelta(encoding=agg_pb.DELTA_ENCODING_XOR_PLANES, base_blob=info.base_blob,
                             base_digest=info.base_digest, digest=info.digest,
                             wire_dtype=WIRE_DTYPES[info.wire_dtype])


def delta_from_msg(m: agg_pb.AggregatorServiceFetchBlobResponse) -> model_delta.DeltaInfo | None:
    """What the first message of a FetchBlob stream says it carries: None for the blob itself, else the delta's
    base and digests; WireError for an unknown delta encoding or wire dtype."""
    if not m.HasField("delta"):
        return None
    d = m.delta
    _lookup({agg_pb.DELTA_ENCODING_XOR_PLANES: "xor"}, d.encoding, "delta.encoding", agg_pb.DeltaEncoding)
    wire = _lookup({v: k for k, v in WIRE_DTYPES.items()}, d.wire_dtype, "delta.wire_dtype", pb.WireDtype)
    return model_delta.DeltaInfo(d.base_blob, bytes(d.base_digest), bytes(d.digest), wire)


def transfer_from_msg(msg: pb.TransferSettings) -> TransferSpec:
    wire = _lookup({v: k for k, v in WIRE_DTYPES.items()}, msg.wire_dtype, "transfer settings: wire_dtype",
                   pb.WireDtype)
    comp = _lookup({v: k for k, v in COMPRESSIONS.items()}, msg.compression, "transfer settings: compression",
                   pb.Compression)
    chunk = int(msg.chunk_bytes) or MAX_CHUNK_BYTES
    if chunk > MAX_CHUNK_BYTES:
        raise WireError(f"transfer settings: chunk_bytes {chunk} exceeds {MAX_CHUNK_BYTES}")
    return TransferSpec(wire_dtype=wire, compression=comp, chunk_bytes=chunk)


# ---- probes --------------------------------------------------------------------------------------------


def probe_to_msg(p: Probe) -> agg_pb.Probe:
    return agg_pb.Probe(cid=p.cid, num_samples=p.num_samples, scalars=_scalars(p.scalars))


def probe_from_msg(m: agg_pb.Probe) -> Probe:
    if m.num_samples < 0:
        raise WireError(f"probe of client {m.cid}: negative sample count")
    return Probe(cid=int(m.cid), num_samples=int(m.num_samples), scalars=_scalars(m.scalars))


def evaluation_to_msg(e: ClientEval) -> agg_pb.ClientEvaluation:
    return agg_pb.ClientEvaluation(cid=e.cid, num_samples=e.num_samples, loss=e.loss, accuracy=e.accuracy)


def evaluation_from_msg(m: agg_pb.ClientEvaluation) -> ClientEval:
    """A client's federated evaluation; its plausibility (finite, accuracy in [0, 1]) is the aggregator's check."""
    return ClientEval(int(m.cid), int(m.num_samples), float(m.loss), float(m.accuracy))


def client_info_to_msg(cid: int, num_samples: int, label_counts: Sequence[int] = (), data_source: str = "",
                       num_test_samples: int = 0) -> agg_pb.ClientInfo:
    return agg_pb.ClientInfo(cid=cid, num_samples=num_samples, label_counts=list(label_counts),
                             data_source=data_source, num_test_samples=num_test_samples)


def client_info_from_msgs(infos: Iterable[agg_pb.ClientInfo]) -> tuple[dict[int, int], dict[int, dict[str, Any]]]:
    """Ready's per-client sample counts, and what worker-local data adds (label histogram, source, test size)."""
    infos = list(infos)
    sizes = {int(c.cid): int(c.num_samples) for c in infos}
    details = {int(c.cid): {"label_counts": [int(v) for v in c.label_counts], "data_source": c.data_source,
                            "num_test_samples": int(c.num_test_samples)} for c in infos}
    return sizes, details


# ---- round payload -------------------------------------------------------------------------------------


def payload_to_msg(p: RoundPayload, tensors_blob: str = "") -> agg_pb.RoundPayload:
    """The payload's tensors travel separately as a blob (``payload_bundle``); this carries the rest."""
    return agg_pb.RoundPayload(
        round=p.round,
        scalars=_scalars(p.scalars),
        per_client={int(c): pb.ScalarMap(values=_scalars(v)) for c, v in p.per_client.items()},
        tensors_blob=tensors_blob,
    )


def payload_bundle(p: RoundPayload) -> Bundle:
    return {k: list(v) for k, v in p.tensors.items()}


def payload_from_msg(m: agg_pb.RoundPayload, tensors: Bundle | None = None) -> RoundPayload:
    return RoundPayload(
        round=int(m.round),
        tensors=dict(tensors or {}),
        scalars=_scalars(m.scalars),
        per_client={int(c): _scalars(v.values) for c, v in m.per_client.items()},
    )


# ---- client updates ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpdateMeta:
    """Routing fields of an upload that are not part of the core ``ClientUpdate`` (``wire_bytes``: set by
    the receiver, the upload's size as it arrived)."""

    worker_id: str
    task_id: int
    round: int
    wire_bytes: int = 0


MASKED_GROUP = "secagg_masked"  # the tensor group of a masked update (secure aggregation, fedent.secagg)


def update_to_parts(u: ClientUpdate, meta: UpdateMeta, spec: TransferSpec | None = None,
                    resume_from: int = 0) -> Iterator[agg_pb.SubmitUpdateRequest]:
    """An upload as ``SubmitUpdateRequest`` messages: the header, then the tensors' chunks (group "params" =
    w_i(t+1), then the update's extra groups), each chunk cut as it is sent. ``resume_from`` k > 0: a cut
    upload resumed, chunks k.. only (the aggregator holds 0..k-1; ``QueryUpload``)."""
    if PARAMS_GROUP in u.tensors or MASKED_GROUP in u.tensors or any(k.startswith(UPLOAD_PREFIX) for k in u.tensors):
        raise WireError(f"update extra tensors may not be named {PARAMS_GROUP!r} or {MASKED_GROUP!r} or start with "
                        f"{UPLOAD_PREFIX!r}")
    # an encoded upload (train.upload_encoding) sends its codes in place of params
    bundle: dict[str, Sequence[Tensor]] = {**(u.codes or {PARAMS_GROUP: u.params}), **u.tensors}
    if u.masked is not None:  # secure aggregation: the ring vector (uint64) travels as int64, bits unchanged
        bundle[MASKED_GROUP] = [torch.from_numpy(np.ascontiguousarray(u.masked, dtype=np.uint64).view(np.int64))]
    chunks = tensor_chunks(bundle, spec, start=resume_from)
    header = agg_pb.SubmitUpdateRequest(
        header=agg_pb.UpdateHeader(
            worker_id=meta.worker_id,
            task_id=meta.task_id,
            round=meta.round,
            cid=u.cid,
            num_samples=u.num_samples,
            train_loss=float(u.train_loss),
            scalars=_scalars(u.scalars),
            resume_from_chunk=resume_from,
        )
    )
    # each chunk is written in place into its message's oneof: its bytes are not copied again
    return itertools.chain([header], wrap_chunks(chunks, agg_pb.SubmitUpdateRequest))


@dataclass
class DecodedUpdate:
    meta: UpdateMeta
    update: ClientUpdate


def update_header(first: agg_pb.SubmitUpdateRequest | None) -> agg_pb.UpdateHeader:
    """The header an update stream must open with."""
    if first is None or first.WhichOneof("part") != "header":
        raise WireError("an update stream must start with its header")
    return first.header


def update_chunk(part: agg_pb.SubmitUpdateRequest) -> pb.TensorChunk:
    """A message after the header: a tensor chunk, nothing else."""
    if part.WhichOneof("part") != "chunk":
        raise WireError("an update stream carries one header, then tensor chunks only")
    return part.chunk


def update_from_parts(parts: Iterable[agg_pb.SubmitUpdateRequest],
                      max_bytes: int = DEFAULT_MAX_STREAM_BYTES) -> DecodedUpdate:
    it = iter(parts)
    h = update_header(next(it, None))
    asm = TensorAssembler(max_bytes)
    for part in it:
        asm.add(update_chunk(part))
    return update_from_bundle(h, asm.finish(), asm.wire_bytes)


def update_from_bundle(h: agg_pb.UpdateHeader, bundle: Bundle, wire_bytes: int,
                       base: Callable[[int], Sequence[Tensor]] | None = None) -> DecodedUpdate:
    """The update a header and its decoded tensors describe (the stream may have come in several pieces).
    An upload encoded by ``train.upload_encoding`` carries codes instead of params: they are rebuilt as
    w(t) + decode(codes), w(t) being ``base(round)`` (the aggregator's model of that round)."""
    codes = {k: bundle.pop(k) for k in [k for k in bundle if k.startswith(UPLOAD_PREFIX)]}
    if PARAMS_GROUP in bundle and not codes:
        params = bundle.pop(PARAMS_GROUP)
    elif codes and PARAMS_GROUP not in bundle and base is not None and set(codes) in _CODE_SETS:
        like = base(int(h.round))
        try:
            compress.check_codes(codes, like)
        except ValueError as e:
            raise WireError(str(e)) from None
        params = compress.decode(like, codes)
    elif codes:
        raise WireError(f"update carries upload codes {sorted(codes)} this receiver cannot decode")
    else:
        raise WireError("update carries no 'params' tensor group")
    masked = None
    if MASKED_GROUP in bundle:
        ring = bundle.pop(MASKED_GROUP)
        if len(ring) != 1 or ring[0].dtype != torch.int64 or ring[0].dim() != 1:
            raise WireError(f"update of client {h.cid}: the masked vector must be one 1-D int64 tensor")
        masked = ring[0].numpy().view(np.uint64)
    if h.num_samples < 0:
        raise WireError(f"update of client {h.cid}: negative sample count")
    update = ClientUpdate(
        cid=int(h.cid),
        params=params,
        num_samples=int(h.num_samples),
        train_loss=float(h.train_loss),
        tensors=bundle,
        scalars=_scalars(h.scalars),
        masked=masked,
    )
    meta = UpdateMeta(h.worker_id, int(h.task_id), int(h.round), wire_bytes)
    return DecodedUpdate(meta, update)


# ---- run status ----------------------------------------------------------------------------------------

RUN_PHASES = {
    "starting": agg_pb.RUN_PHASE_STARTING, "estimating": agg_pb.RUN_PHASE_ESTIMATING,
    "training": agg_pb.RUN_PHASE_TRAINING, "aggregating": agg_pb.RUN_PHASE_AGGREGATING,
    "evaluating": agg_pb.RUN_PHASE_EVALUATING, "done": agg_pb.RUN_PHASE_DONE, "failed": agg_pb.RUN_PHASE_FAILED,
}


def phase_to_msg(phase: str) -> agg_pb.RunPhase:
    """The engine's phase (``fedent.rounds`` names) as the enum; UNSPECIFIED for one this table lacks."""
    return RUN_PHASES.get(phase, agg_pb.RUN_PHASE_UNSPECIFIED)


def phase_from_msg(value: int) -> str:
    return str(_lookup({v: k for k, v in RUN_PHASES.items()}, value, "run status: phase", agg_pb.RunPhase))


# ---- worker config --------------------------------------------------------------------------------------


def config_to_struct(config: Mapping[str, Any]) -> struct_pb2.Struct:
    """The resolved config (``ExperimentConfig.to_dict()``, secrets already redacted) for RegisterResponse."""
    return dict_to_struct(config, "config")


def config_from_struct(s: struct_pb2.Struct) -> dict[str, Any]:
    """RegisterResponse.config as the dict ``config_from_dict`` takes (ints as ints)."""
    if not s.fields:
        raise WireError("register response carries no config")
    return struct_to_dict(s)


# ---- estimator service ---------------------------------------------------------------------------------

# FedEntOptions' Literal choices <-> their enums (a test checks each table covers its Literal exactly)
VARIANTS = {"exact": est_pb.FEDENT_VARIANT_EXACT, "paper": est_pb.FEDENT_VARIANT_PAPER}
PHI2_RATES = {"used": est_pb.PHI2_RATE_USED, "star": est_pb.PHI2_RATE_STAR}
ESTIMATOR_MODES = {"online": est_pb.ESTIMATOR_MODE_ONLINE, "offline": est_pb.ESTIMATOR_MODE_OFFLINE}
OFFLINE_CLIENTS = {"participants": est_pb.OFFLINE_CLIENTS_PARTICIPANTS,
                   "population": est_pb.OFFLINE_CLIENTS_POPULATION}
JOB_STATES = {"pending": est_pb.OFFLINE_JOB_STATE_PENDING, "running": est_pb.OFFLINE_JOB_STATE_RUNNING,
              "done": est_pb.OFFLINE_JOB_STATE_DONE, "failed": est_pb.OFFLINE_JOB_STATE_FAILED}
# the estimator's job vocabulary: "both" = Algorithm 1's two tests (eps1, eps2) passed, "" = not finished
STOP_REASONS = {"both": est_pb.OFFLINE_STOP_REASON_CONVERGED, "max_sweeps": est_pb.OFFLINE_STOP_REASON_MAX_SWEEPS,
                "": est_pb.OFFLINE_STOP_REASON_UNSPECIFIED}

# FedEntOptions field -> (its enum table, the proto enum); the other fields are numbers sent as they are
_OPTION_ENUMS: dict[str, tuple[Mapping[str, int], Any]] = {
    "variant": (VARIANTS, est_pb.FedentVariant),
    "phi2_rate": (PHI2_RATES, est_pb.Phi2Rate),
    "estimator": (ESTIMATOR_MODES, est_pb.EstimatorMode),
    "offline_clients": (OFFLINE_CLIENTS, est_pb.OfflineClients),
}
_OPTION_NULLABLE = ("eta_max", "probe_batch_size")  # proto3 optional: unset = null


def fedent_options_to_msg(o: FedEntOptions) -> est_pb.FedEntParams:
    """The run's FedEntOptions, whole, as ``FedEntParams`` (``fedent_options_from_msg`` is the inverse)."""
    msg = est_pb.FedEntParams()
    for f in dataclasses.fields(o):
        value = getattr(o, f.name)
        if f.name in _OPTION_ENUMS:
            table, enum = _OPTION_ENUMS[f.name]
            value = _lookup(table, value, f"params.{f.name}", enum)
        elif value is None:
            continue  # eta_max / probe_batch_size null: left unset
        setattr(msg, f.name, value)
    return msg


def fedent_options_from_msg(msg: est_pb.FedEntParams, prefix: str = "params") -> FedEntOptions:
    """``FedEntParams`` as the FedEntOptions the run sent, checked by the class itself (its ranges, no defaults
    here). Every problem is reported at once, keyed ``<prefix>.<field>``: an enum outside its table (UNSPECIFIED
    included) is a ``WireError``'s ``field``/``why``, a value out of range an ``OptionError``'s."""
    raw: dict[str, Any] = {}
    bad: list[tuple[str, str]] = []
    for f in dataclasses.fields(FedEntOptions):
        if f.name in _OPTION_ENUMS:
            table, enum = _OPTION_ENUMS[f.name]
            try:
                raw[f.name] = _lookup({v: k for k, v in table.items()}, getattr(msg, f.name), f.name, enum)
            except WireError as e:
                bad.append((f.name, e.why))
        elif f.name in _OPTION_NULLABLE:
            raw[f.name] = getattr(msg, f.name) if msg.HasField(f.name) else None
        else:
            raw[f.name] = getattr(msg, f.name)
    if bad:
        raise OptionError(prefix, *bad[0], more=bad[1:])
    return FedEntOptions.from_mapping(raw, prefix)


def job_state_to_msg(state: str) -> est_pb.OfflineJobState:
    return _lookup(JOB_STATES, state, "offline job state", est_pb.OfflineJobState)  # type: ignore[no-any-return]


def job_state_from_msg(value: int) -> str:
    return str(_lookup({v: k for k, v in JOB_STATES.items()}, value, "offline job: state",
                       est_pb.OfflineJobState))


def stop_reason_to_msg(reason: str) -> est_pb.OfflineStopReason:
    return STOP_REASONS.get(reason, est_pb.OFFLINE_STOP_REASON_UNSPECIFIED)


def stop_reason_from_msg(value: int) -> str:
    return str(_lookup({v: k for k, v in STOP_REASONS.items()}, value, "offline job: stop_reason",
                       est_pb.OfflineStopReason))


def solve_online_request(run_id: str, rnd: int, options: FedEntOptions, *, c: float, thetas: Sequence[float],
                         a: Sequence[float], b: Sequence[float], eta_prev: Sequence[float] | None = None,
                         cids: Sequence[int] | None = None) -> est_pb.SolveOnlineRequest:
    """The Phi2Estimator.estimate arguments as a SolveOnline request, with the run's FedEntOptions whole
    (clients numbered by position unless ``cids``; ``eta_prev``: η_i(t−1), which phi2_rate used needs)."""
    if not len(thetas) == len(a) == len(b):
        raise WireError("thetas, a and b must have one entry per participant")
    if eta_prev is not None and len(eta_prev) != len(thetas):
        raise WireError("eta_prev must have one entry per participant")
    ids = list(range(len(thetas))) if cids is None else [int(x) for x in cids]
    clients = []
    for i, (cid, th, ai, bi) in enumerate(zip(ids, thetas, a, b, strict=True)):
        msg = est_pb.ClientScalars(cid=cid, a=float(ai), b=float(bi), theta=float(th))
        if eta_prev is not None:
            msg.eta_prev = float(eta_prev[i])
        clients.append(msg)
    return est_pb.SolveOnlineRequest(run_id=run_id, round=rnd, c=float(c), clients=clients,
                                     params=fedent_options_to_msg(options))


def estimate_from_reply(reply: est_pb.SolveOnlineResponse) -> Phi2Estimate:
    report = struct_to_dict(reply.report)
    report.setdefault("iterations", int(reply.iterations))
    report.setdefault("converged", bool(reply.converged))
    return Phi2Estimate(float(reply.phi2_next), report)


def start_offline_request(run_id: str, options: FedEntOptions, *, init_blob: str, sizes: Sequence[int],
                          rounds: int, seed: int, batch_size: int, base_lr: float,
                          schedule: Sequence[Sequence[int]] | None = None,
                          owners: Mapping[int, str] | None = None) -> est_pb.StartOfflineRequest:
    """Algorithm 1's inputs: the run's FedEntOptions whole, w(0) (a blob already uploaded), every client's
    D_i, T, the run's seed, batch size (``options.probe_batch_size`` wins when set) and base rate η_i(−1), and
    each round's sampled clients (``schedule``; None: every client every round), and ``owners``: client id ->
    the worker identity bound to it (the estimator routes a client's gradient tasks only to that identity)."""
    own = owners or {}
    return est_pb.StartOfflineRequest(
        run_id=run_id, init_blob=init_blob,
        clients=[est_pb.OfflineClient(cid=i, num_samples=int(n), owner=own.get(i, "")) for i, n in enumerate(sizes)],
        rounds=int(rounds), params=fedent_options_to_msg(options), seed=int(seed), batch_size=int(batch_size),
        schedule=[est_pb.RoundClients(cids=[int(c) for c in r]) for r in (schedule or [])],
        base_lr=float(base_lr),
    )


def job_finished(job: est_pb.OfflineJob) -> bool:
    return job.state in (est_pb.OFFLINE_JOB_STATE_DONE, est_pb.OFFLINE_JOB_STATE_FAILED)


def offline_estimator_from_job(job: est_pb.OfflineJob,
                               schedule: Sequence[Sequence[int]] | None = None) -> OfflinePhi2Estimator:
    """A finished Algorithm 1 job as the in-process OfflinePhi2Estimator FedEnt reads φ2(t+1) from
    (``schedule``: the rounds' sampled clients the job simulated, for the changed-sample diagnostics)."""
    state = job_state_from_msg(job.state)
    if state != "done":
        raise WireError(f"offline job {job.job_id} is {state}: {job.message}")
    report = struct_to_dict(job.report)
    report.setdefault("stop_reason", stop_reason_from_msg(job.stop_reason))
    report.setdefault("sweeps", int(job.sweep))
    try:
        return OfflinePhi2Estimator(list(job.phi2), report, schedule)
    except ValueError as e:
        raise WireError(f"offline job: {e}") from None


def oracle_request_cids(task: est_pb.GradientTask) -> list[int]:
    return [int(c) for c in task.client_ids]


def oracle_result_messages(request_id: int, cid: int, num_samples: int, grads: Sequence[Tensor],
                           spec: TransferSpec | None = None) -> Iterator[est_pb.OracleRequest]:
    """One gradient answer on the Oracle stream: a header message, then its tensor chunks."""
    chunks = tensor_chunks({"grad": list(grads)}, spec)  # bad input raises here, before anything is sent
    yield est_pb.OracleRequest(result=est_pb.OracleResultHeader(request_id=request_id, cid=cid,
                                                                num_samples=num_samples))
    yield from wrap_chunks(chunks, est_pb.OracleRequest)
