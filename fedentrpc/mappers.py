"""Message mappers: the core's types <-> their protobuf messages, one small explicit function each.

Why it exists: the core (``fedent``) knows no protobuf, and the services should not build messages field
by field; this is the one place where ``Probe``, ``RoundPayload``, ``ClientUpdate``, the estimator's
requests and answers, and the transfer settings meet their messages. Tensors inside them travel through
``codec`` (an update's chunks in the ``UpdatePart.chunk`` oneof, a gradient answer's in
``OracleMessage.chunk``). Decoding validates and raises ``codec.WireError`` with a one-line message.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from fedent.meanfield.estimator import OfflinePhi2Estimator, Phi2Estimate
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload
from fedentrpc.codec import (
    COMPRESSIONS,
    DEFAULT_MAX_STREAM_BYTES,
    MAX_CHUNK_BYTES,
    PARAMS_GROUP,
    WIRE_DTYPES,
    Bundle,
    Chunk,
    TensorAssembler,
    TransferSpec,
    WireError,
    tensor_chunks,
)
from fedentrpc.v1 import aggregator_pb2 as agg_pb
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import tensor_pb2 as pb


def _scalars(m: Mapping[str, float]) -> dict[str, float]:
    return {str(k): float(v) for k, v in m.items()}


# ---- transfer settings -------------------------------------------------------------------------------


def transfer_to_msg(spec: TransferSpec) -> pb.TransferSettings:
    return pb.TransferSettings(wire_dtype=WIRE_DTYPES[spec.wire_dtype], compression=COMPRESSIONS[spec.compression],
                               chunk_bytes=spec.chunk_bytes)


def transfer_from_msg(msg: pb.TransferSettings) -> TransferSpec:
    wire = {v: k for k, v in WIRE_DTYPES.items()}.get(msg.wire_dtype)
    comp = {v: k for k, v in COMPRESSIONS.items()}.get(msg.compression)
    if wire is None or comp is None:
        raise WireError("transfer settings: unknown wire dtype or compression")
    chunk = int(msg.chunk_bytes) or MAX_CHUNK_BYTES
    if chunk > MAX_CHUNK_BYTES:
        raise WireError(f"transfer settings: chunk_bytes {chunk} exceeds {MAX_CHUNK_BYTES}")
    return TransferSpec(wire_dtype=wire, compression=comp, chunk_bytes=chunk)


# ---- probes --------------------------------------------------------------------------------------------


def probe_to_msg(p: Probe) -> agg_pb.ProbeMsg:
    return agg_pb.ProbeMsg(cid=p.cid, num_samples=p.num_samples, scalars=_scalars(p.scalars))


def probe_from_msg(m: agg_pb.ProbeMsg) -> Probe:
    if m.num_samples < 0:
        raise WireError(f"probe of client {m.cid}: negative sample count")
    return Probe(cid=int(m.cid), num_samples=int(m.num_samples), scalars=_scalars(m.scalars))


# ---- round payload -------------------------------------------------------------------------------------


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


# ---- client updates ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UpdateMeta:
    """Routing fields of an upload that are not part of the core ``ClientUpdate``."""

    worker_id: str
    task_id: int
    round: int
    train_s: float = 0.0
    wire_bytes: int = 0


def _update_chunk(c: Chunk) -> agg_pb.UpdatePart:
    part = agg_pb.UpdatePart()
    c.fill(part.chunk)  # written in place: the chunk's bytes are not copied again
    return part


def update_to_parts(u: ClientUpdate, meta: UpdateMeta, spec: TransferSpec | None = None) -> Iterator[agg_pb.UpdatePart]:
    """An upload as ``UpdatePart`` messages: the header, then the tensors' chunks (group "params" =
    w_i(t+1), then the update's extra groups), each chunk cut as it is sent."""
    if PARAMS_GROUP in u.tensors:
        raise WireError(f"update extra tensors may not be named {PARAMS_GROUP!r}")
    bundle: dict[str, Sequence[Tensor]] = {PARAMS_GROUP: u.params, **u.tensors}
    chunks = tensor_chunks(bundle, spec)
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
    return itertools.chain([header], map(_update_chunk, chunks))


@dataclass
class DecodedUpdate:
    meta: UpdateMeta
    update: ClientUpdate
    extra: dict[str, float] = field(default_factory=dict)


def update_from_parts(parts: Iterable[agg_pb.UpdatePart], max_bytes: int = DEFAULT_MAX_STREAM_BYTES) -> DecodedUpdate:
    it = iter(parts)
    first = next(it, None)
    if first is None or first.WhichOneof("part") != "header":
        raise WireError("an update stream must start with its header")
    h = first.header
    asm = TensorAssembler(max_bytes)
    for part in it:
        if part.WhichOneof("part") != "chunk":
            raise WireError("an update stream carries one header, then tensor chunks only")
        asm.add(part.chunk)
    bundle = asm.finish()
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


# ---- estimator service ---------------------------------------------------------------------------------


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


def _report(text: str, what: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        loaded = json.loads(text)
    except ValueError:
        raise WireError(f"{what}: report_json is not JSON") from None
    if not isinstance(loaded, dict):
        raise WireError(f"{what}: report_json must be a JSON object")
    return loaded


def estimate_from_reply(reply: est_pb.SolveOnlineReply) -> Phi2Estimate:
    report = _report(reply.report_json, "estimator reply")
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


def _oracle_chunk(c: Chunk) -> est_pb.OracleMessage:
    msg = est_pb.OracleMessage()
    c.fill(msg.chunk)
    return msg


def oracle_result_messages(request_id: int, cid: int, num_samples: int, grads: Sequence[Tensor],
                           spec: TransferSpec | None = None) -> Iterator[est_pb.OracleMessage]:
    """One gradient answer on the Oracle stream: a header message, then its tensor chunks."""
    chunks = tensor_chunks({"grad": list(grads)}, spec)  # bad input raises here, before anything is sent
    yield est_pb.OracleMessage(result=est_pb.OracleResultHeader(request_id=request_id, cid=cid,
                                                                num_samples=num_samples))
    yield from map(_oracle_chunk, chunks)
