"""Uploads and downloads that survive a cut link: resumed from the last chunk the other side holds.

Why: across a real network a link drops mid-stream (a cable, a Wi-Fi hand-over, a NAT rebinding), and a stream
that only stalls looks alive to TCP for minutes. Each transfer here is watched: a stream that moves no chunk
for ``stall_s`` seconds is cancelled, and a broken one is resumed instead of restarted. An upload asks the
aggregator how many of its chunks it holds (``QueryUpload``) and sends the rest (``resume_from_chunk``); a
download asks for the blob from its next chunk on (``start_chunk``) and keeps the chunks it has in its
assembler. The encoding is deterministic, so chunk i is the same bytes on every attempt, and every chunk
carries its CRC. The aggregator drops chunks it holds already and refuses an upload it received whole, so
no update is counted twice. A stream the server refuses for now (RESOURCE_EXHAUSTED: its stream limits,
``fedentrpc.stream_limit``) is tried again after a full-jitter backoff, never past the transfer's time. A delta
download (``--download-encoding delta``) resumes like any other: the worker names the same held model again, and
the aggregator serves the delta it encoded once for that base.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from fedentrpc import codec, mappers, model_delta
from fedentrpc.backoff import backoff_delay
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

log = logging.getLogger("fedent.worker")

# a stream ending with one of these was cut (or cancelled by the stall watch), not refused: resume it
# (ABORTED: the aggregator saw the stream end before its last chunk and kept what arrived)
CUT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                 grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED})
# the server refused the stream for now (its stream threads or this worker's stream limit are taken,
# fedentrpc.stream_limit): nothing was sent; wait (full-jitter backoff) and try again
BUSY = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED})
BUSY_BACKOFF_S = (0.2, 5.0)  # base, cap
MAX_CUTS = 100  # a link that breaks this often within one transfer is not one to keep trying


class TransferError(RuntimeError):
    """A transfer that could not be completed within its time (the link stayed down)."""


class StallWatch:
    """Cancels ``call`` when no chunk moved for ``stall_s`` seconds (``touch`` marks each one)."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.last = time.monotonic()
        self.stalled = False
        self._done = threading.Event()

    def touch(self) -> None:
        self.last = time.monotonic()

    def watch(self, call: Any) -> None:
        def loop() -> None:
            while not self._done.wait(min(0.2, self.stall_s / 4)):
                if time.monotonic() - self.last > self.stall_s:
                    self.stalled = True
                    call.cancel()
                    return

        threading.Thread(target=loop, name="stall-watch", daemon=True).start()

    def stop(self) -> None:
        self._done.set()

    def pulled(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items``, touching the watch as gRPC takes each one to send."""
        for x in items:
            self.touch()
            yield x
        self.touch()  # all handed over: the answer is due within stall_s


@dataclass
class Sent:
    """How an upload went: ``resumed``: the (chunk, byte offset) of each resumption."""

    resumed: list[tuple[int, int]]


def _query(stub: pb_grpc.AggregatorServiceStub, req: pb.QueryUploadRequest, end: float,
           stall_s: float) -> pb.QueryUploadResponse:
    """How much of the upload the aggregator holds, asked until it answers or ``end`` passes."""
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TransferError(f"the upload of client {req.cid} could not be resumed in time: the aggregator "
                                "did not answer")
        try:
            return stub.QueryUpload(req, timeout=min(left, max(stall_s, 5.0)), wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() not in CUT | {grpc.StatusCode.DEADLINE_EXCEEDED}:
                raise
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def _wait_busy(what: str, e: grpc.RpcError, attempt: int, end: float) -> None:
    """Sleep before retrying a stream the server refused for now (never past ``end``)."""
    delay = min(backoff_delay(attempt, *BUSY_BACKOFF_S, random.Random()), max(0.0, end - time.monotonic()))
    log.warning("%s refused for now (%s: %s); retrying in %.1fs", what, e.code().name, e.details(), delay)
    time.sleep(delay)


def upload(stub: pb_grpc.AggregatorServiceStub, update: Any, meta: mappers.UpdateMeta, spec: codec.TransferSpec,
           stall_s: float, timeout_s: float) -> Sent:
    """Send ``update``; a cut stream is resumed from the aggregator's chunk count. A refusal (invalid update,
    closed round) raises the ``grpc.RpcError``; a link down past ``timeout_s`` raises ``TransferError``."""
    end = time.monotonic() + timeout_s
    start, sent = 0, Sent([])
    req = pb.QueryUploadRequest(worker_id=meta.worker_id, task_id=meta.task_id, round=meta.round, cid=update.cid)
    busy = 0
    refused = False  # the last stream was a resumption the aggregator refused: the next one starts at chunk 0
    for _ in range(MAX_CUTS):
        left = end - time.monotonic()
        if left <= 0:
            break
        watch = StallWatch(stall_s)
        call = stub.SubmitUpdate.future(watch.pulled(mappers.update_to_parts(update, meta, spec, resume_from=start)),
                                        timeout=left)
        watch.watch(call)
        try:
            call.result()
            return sent
        except grpc.FutureCancelledError:  # the stall watch cancelled it
            why, refused = "stalled", False  # a refusal concerned only the stream after it
        except grpc.RpcError as e:
            code = e.code()
            if code in BUSY:
                _wait_busy(f"upload of client {update.cid}", e, busy, end)
                busy += 1
                continue
            if code not in CUT and start == 0:
                raise
            # a resumption refused (its round closed, its chunks dropped, its header no longer theirs): once more
            # from chunk 0, unless the aggregator has it whole; a refusal at chunk 0 is final
            refused = code not in CUT
            why = "stalled" if watch.stalled else f"{code.name}: {e.details()}"
        finally:
            watch.stop()
        state = _query(stub, req, end, stall_s)
        if state.state == pb.UPLOAD_STATE_COMPLETE:
            return sent
        start = int(state.next_chunk) if state.state == pb.UPLOAD_STATE_PARTIAL and not refused else 0
        offset = int(state.received_bytes) if start else 0
        sent.resumed.append((start, offset))
        log.warning("upload of client %d cut (%s); resuming at chunk %d, byte offset %d", update.cid, why, start,
                    offset)
    raise TransferError(f"the upload of client {update.cid} did not complete within {timeout_s:.0f}s")


@dataclass
class Fetched:
    """A finished download: its tensors, and what its first message said it is (``delta``: None for the blob
    itself, else the delta's base and digests, ``fedentrpc.model_delta``)."""

    bundle: codec.Bundle
    delta: model_delta.DeltaInfo | None = None


def fetch(stub: pb_grpc.AggregatorServiceStub, blob_id: str, worker_id: str, stall_s: float,
          timeout_s: float, held: model_delta.HeldRef | None = None) -> Fetched:
    """A blob, its download resumed at the next chunk when the stream is cut. ``held``: the model this worker
    holds, offered as the base of a delta download; the aggregator answers with the blob or a delta from it, and
    a resumed download asks for the same stream again (the held model for a delta, none for the blob)."""
    end = time.monotonic() + timeout_s
    asm = codec.TensorAssembler()
    delta: model_delta.DeltaInfo | None = None
    busy = 0
    for _ in range(MAX_CUTS):
        left = end - time.monotonic()
        if left <= 0:
            break
        watch = StallWatch(stall_s)
        offer = held if asm.chunks == 0 or delta is not None else None
        call = stub.FetchBlob(pb.AggregatorServiceFetchBlobRequest(blob_id=blob_id, worker_id=worker_id,
                                                                   start_chunk=asm.chunks,
                                                                   held=mappers.held_to_msg(offer)), timeout=left)
        watch.watch(call)
        try:
            for m in call:
                watch.touch()
                if asm.chunks == 0:
                    delta = mappers.delta_from_msg(m)
                    if delta is not None and held is None:
                        raise codec.WireError("a delta download that was not asked for")
                asm.add(codec.chunk_of(m))
            return Fetched(asm.finish(), delta)
        except grpc.RpcError as e:
            if e.code() in BUSY:
                _wait_busy(f"download of {blob_id}", e, busy, end)
                busy += 1
                continue
            if e.code() not in CUT:
                raise
            why = "stalled" if watch.stalled else f"{e.code().name}: {e.details()}"
            log.warning("download of %s cut (%s); resuming at chunk %d, byte offset %d", blob_id, why, asm.chunks,
                        asm.wire_bytes)
        finally:
            watch.stop()
    raise TransferError(f"the download of {blob_id} did not complete within {timeout_s:.0f}s")
