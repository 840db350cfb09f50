"""Delta downloads (``--download-encoding delta``): recent models kept as bases, each delta encoded once.

Why: a worker that took part in the last round holds w(t−1) (or w(t) itself, from a federated evaluation), so
sending it w(t) whole repeats most of the bytes it has. The aggregator keeps the models it published in the last
``delta_history`` rounds in wire form with their digests; a FetchBlob that names one of them (``HeldModel``) with
the right digest gets the requested model as an XOR delta from it (``fedentrpc.model_delta``: exact, byte planes,
zlib), encoded once per (model, base) and shared by every worker holding that base, so a resumed download gets
the same chunks. Anything else (no base, an older or unknown one, a wrong digest, a payload blob) gets the blob
itself, as does a delta that would not be smaller than it. No gRPC here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from torch import Tensor

from fedentrpc import codec, mappers, model_delta
from fedentrpc.v1.aggregator_pb2 import AggregatorServiceFetchBlobResponse as BlobMessage


@dataclass(frozen=True)
class Version:
    """A published model: the round it belongs to, its tensors in wire form, their digest."""

    round: int
    wire: tuple[Tensor, ...]
    digest: bytes


class DeltaDownloads:
    """The models of the last ``history`` rounds (in ``spec``'s wire dtype) and the deltas served from them."""

    def __init__(self, spec: codec.TransferSpec, history: int) -> None:
        self.spec = spec
        self.delta_spec = replace(spec, compression="zlib")  # a dense delta is the model's size uncompressed
        self.history = history
        self.versions: dict[str, Version] = {}
        self._deltas: dict[tuple[str, str], codec.EncodedTensors | None] = {}  # None: the full blob is smaller
        self._lock = threading.Lock()
        self._encode = threading.Lock()  # one delta encoded at a time: concurrent fetches of it wait for it

    def publish(self, rnd: int, blob_id: str, params: Sequence[Tensor]) -> None:
        """Keep ``params`` (a copy, in wire form) as ``blob_id`` of round ``rnd``; forget rounds before
        ``rnd − history`` and the deltas from or to them."""
        wire = tuple(t.clone() for t in model_delta.wire_form(params, self.spec.wire_dtype))
        with self._lock:
            self.versions[blob_id] = Version(rnd, wire, model_delta.digest(wire))
            self.versions = {k: v for k, v in self.versions.items() if v.round >= rnd - self.history}
            self._deltas = {k: v for k, v in self._deltas.items()
                            if k[0] in self.versions and k[1] in self.versions}

    def digest_of(self, blob_id: str) -> bytes | None:
        with self._lock:
            v = self.versions.get(blob_id)
        return None if v is None else v.digest

    def serve(self, blob_id: str, held: model_delta.HeldRef, full_bytes: int) -> codec.EncodedTensors | None:
        """The delta stream of ``blob_id`` from the held model, or None (send the blob itself): the base is not
        kept, its digest differs, or the delta would be no smaller than the ``full_bytes`` of the blob."""
        with self._lock:
            target, base = self.versions.get(blob_id), self.versions.get(held.blob_id)
        if target is None or base is None or base.digest != held.digest:
            return None
        key = (blob_id, held.blob_id)
        with self._encode:
            with self._lock:
                if key in self._deltas:
                    return self._deltas[key]
            planes = model_delta.encode(base.wire, target.wire)
            enc: codec.EncodedTensors | None = codec.encode_tensors({model_delta.DELTA_GROUP: planes},
                                                                    self.delta_spec, BlobMessage)
            assert enc is not None
            if enc.wire_bytes >= full_bytes:
                enc = None
            else:
                info = model_delta.DeltaInfo(held.blob_id, base.digest, target.digest, self.spec.wire_dtype)
                enc.as_messages(BlobMessage)[0].delta.CopyFrom(mappers.delta_to_msg(info))
            with self._lock:
                if blob_id in self.versions and held.blob_id in self.versions:  # not pruned meanwhile
                    self._deltas[key] = enc
        return enc
