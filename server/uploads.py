"""Uploads cut mid-stream, kept so that the worker resumes them from the last chunk the aggregator holds.

Why: on a real link an upload cut at 90% used to start again from zero, and over a 10 Mbit/s link a model
is seconds of bytes. A ``SubmitUpdate`` stream's verified chunks are kept here, keyed by (worker, task,
round, client), when its stream breaks or ends before its last chunk (a cancelled stream can end so on
the server instead of breaking); ``QueryUpload`` says how many are held; a new stream whose header
says ``resume_from_chunk = k`` (k ≤ held) continues the same assembler. Chunks the aggregator holds already
are dropped unread (a resumed stream may repeat some), so no byte is counted twice, and a key whose upload
was received whole is ``complete``: it is never taken again (no update is counted twice).

A cut stream's handler can still be blocked on its dead connection when the resumed one arrives: each
stream takes the partial over with a fresh owner token, and a chunk from a superseded stream is refused.
Partials of earlier rounds are dropped as soon as a later round's upload begins; at most ``MAX_PARTIALS`` are
kept per worker (each holds a receive buffer of up to the update limit), the worker's own oldest evicted first, so
one worker's uploads never evict another's. An upload is decoded under no lock (marked ``taken``, so no stream
can take it over meanwhile): a slow or hostile decode delays no other upload or query. No gRPC here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from fedentrpc.codec import DEFAULT_MAX_TENSORS, Bundle, TensorAssembler, WireError
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import tensor_pb2 as tpb
from server.work import ClusterError

Key = tuple[str, int, int, int]  # worker id, task id, round, client id
MAX_PARTIALS = 256


def key_of(h: pb.UpdateHeader | pb.QueryUploadRequest) -> Key:
    return (h.worker_id, int(h.task_id), int(h.round), int(h.cid))


def _bare(h: pb.UpdateHeader) -> bytes:
    """The header without its resume index: what a resumed stream's header must repeat exactly."""
    c = pb.UpdateHeader()
    c.CopyFrom(h)
    c.resume_from_chunk = 0
    return c.SerializeToString(deterministic=True)


@dataclass
class _Partial:
    header: bytes
    asm: TensorAssembler
    owner: object = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    taken: bool = False  # being decoded, or decoded: no stream may take it over any more


class Upload:
    """One stream's hold on a (possibly resumed) upload: ``add`` its chunks, then ``finish``."""

    def __init__(self, book: UploadBook, key: Key, partial: _Partial, resumed_at: tuple[int, int] | None) -> None:
        self.book, self.key, self._p = book, key, partial
        self._token = object()
        self.resumed_at = resumed_at  # (chunk, byte offset) a resumed stream continued from; None: a new one
        with partial.lock:
            if partial.taken:
                raise ClusterError("conflict", f"the upload of client {key[3]} for task {key[1]} was received whole "
                                               "and is being taken")
            partial.owner = self._token

    def add(self, chunk: tpb.TensorChunk) -> None:
        p = self._p
        with p.lock:
            if p.owner is not self._token:
                raise ClusterError("conflict", "this upload stream was superseded by a resumed one")
            if chunk.index < p.asm.chunks:
                return  # held already: a resumed stream may repeat chunks the aggregator has
            p.asm.add(chunk)

    def finish(self) -> tuple[Bundle, int]:
        """The decoded tensors and the upload's payload bytes; the key is complete once ``accepted`` says so
        (an upload refused after it arrived, e.g. a caller that does not own the client, blocks nothing).
        A stream that ended before its last chunk raises ``codec.TruncatedStream`` and keeps its chunks held."""
        p = self._p
        with p.lock:
            if p.owner is not self._token:
                raise ClusterError("conflict", "this upload stream was superseded by a resumed one")
            p.taken = True  # from here no stream can take it over, so it is decoded under no lock at all:
            wire_bytes = p.asm.wire_bytes  # decoding may take long, and nobody else waits for it
        try:
            bundle = p.asm.finish()  # a stream cut short raises TruncatedStream here, and stays held
        except BaseException:
            with p.lock:
                p.taken = False
            raise
        with self.book.lock:
            if self.book.partials.get(self.key) is p:  # a newer stream's partial under the same key stays
                del self.book.partials[self.key]
        return bundle, wire_bytes

    def accepted(self) -> None:
        """The update was taken: the key is complete from here on (never taken again)."""
        with self.book.lock:
            self.book.complete[self.key] = None
            while len(self.book.complete) > 64 * MAX_PARTIALS:
                self.book.complete.popitem(last=False)

    def discard(self) -> None:
        """A corrupt stream: its chunks are not kept (the worker sends it again from chunk 0)."""
        with self.book.lock, self._p.lock:
            if self._p.owner is self._token and self.book.partials.get(self.key) is self._p:
                del self.book.partials[self.key]


class UploadBook:
    """The aggregator's partial uploads (see the module doc); every method is thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.partials: OrderedDict[Key, _Partial] = OrderedDict()
        self.complete: OrderedDict[Key, None] = OrderedDict()
        self.latest_round = -1

    def state(self, key: Key) -> pb.QueryUploadResponse:
        with self.lock:
            if key in self.complete:
                return pb.QueryUploadResponse(state=pb.UPLOAD_STATE_COMPLETE)
            p = self.partials.get(key)
        if p is None:
            return pb.QueryUploadResponse(state=pb.UPLOAD_STATE_NONE)
        with p.lock:
            return pb.QueryUploadResponse(state=pb.UPLOAD_STATE_PARTIAL, next_chunk=p.asm.chunks,
                                          received_bytes=p.asm.wire_bytes)

    def begin(self, h: pb.UpdateHeader, max_bytes: int, max_tensors: int = DEFAULT_MAX_TENSORS) -> Upload:
        """A stream's hold on its upload: a new partial (``resume_from_chunk`` 0) or the held one, taken over.
        ``max_bytes`` and ``max_tensors`` bound what its header may declare."""
        key, k = key_of(h), int(h.resume_from_chunk)
        with self.lock:
            if key in self.complete:
                raise ClusterError("conflict", f"the upload of client {h.cid} for task {h.task_id} was already "
                                               "received whole")
            if h.round > self.latest_round:  # a later round began: earlier rounds' partials are of no use
                self.latest_round = int(h.round)
                for old in [x for x in self.partials if x[2] < h.round]:
                    del self.partials[old]
            p = self.partials.get(key)
            if k == 0:
                p = _Partial(_bare(h), TensorAssembler(max_bytes, max_tensors=max_tensors))
                self.partials[key] = p
                self.partials.move_to_end(key)
                mine = [x for x in self.partials if x[0] == key[0]]  # oldest first
                for old in mine[:max(0, len(mine) - MAX_PARTIALS)]:
                    del self.partials[old]
                return Upload(self, key, p, None)
            if p is None:
                raise ClusterError("precondition", f"no partial upload of client {h.cid} for task {h.task_id} "
                                                   f"to resume at chunk {k}: send it from chunk 0")
            if p.header != _bare(h):
                raise WireError("a resumed upload's header differs from the cut stream's")
            with p.lock:
                held, offset = p.asm.chunks, p.asm.wire_bytes
            if k > held:
                raise ClusterError("precondition", f"resume at chunk {k}, but the aggregator holds {held} chunks "
                                                   f"of client {h.cid}'s upload")
            return Upload(self, key, p, (held, offset))
