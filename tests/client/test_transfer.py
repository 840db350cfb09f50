"""client.transfer against an in-process aggregator stand-in whose streams break: an upload cut after three
chunks resumes at chunk 3 (byte 3000), not 0, and arrives whole; a stalled stream is cancelled by the stall
watch and resumed; a download cut after two chunks asks for chunk 2 on and decodes the whole blob; a refusal
is not retried. A cut delta download asks again from the same held model and rebuilds the new one; a cut full
download resumes without offering a base; a delta the worker did not ask for is refused."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import torch

from client import transfer
from fedent.strategies.base import ClientUpdate
from fedentrpc import codec, mappers, model_delta
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from server.downloads import DeltaDownloads
from server.uploads import UploadBook, key_of

SPEC = codec.TransferSpec(chunk_bytes=1000)
PARAMS = [torch.arange(2000, dtype=torch.float32)]  # 8000 bytes: 8 chunks


class _Flaky(pb_grpc.AggregatorServiceServicer):
    """Breaks the first upload stream after ``cut_after`` chunks (``stall``: stops reading instead), and the
    first download after two chunks."""

    def __init__(self, cut_after: int = 3, stall: bool = False, refuse: bool = False,
                 cut_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, refuse_resume: bool = False) -> None:
        self.book = UploadBook()
        self.cut_after, self.stall, self.refuse, self.cut_code = cut_after, stall, refuse, cut_code
        self.refuse_resume = refuse_resume
        self.streams = 0
        self.got: codec.Bundle | None = None
        self.fetches: list[int] = []

    def SubmitUpdate(self, request_iterator: Iterator[pb.SubmitUpdateRequest],
                     context: grpc.ServicerContext) -> pb.SubmitUpdateResponse:
        self.streams += 1
        it = iter(request_iterator)
        h = mappers.update_header(next(it))
        if self.refuse:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad update")
        if self.refuse_resume and h.resume_from_chunk:  # its chunks stay held, as when a round closed
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no open fit task")
        up = self.book.begin(h, 1 << 20)
        first = self.streams == 1
        try:
            for n, part in enumerate(it):
                if first and n == self.cut_after:
                    if self.stall:  # reads nothing more until the worker's stall watch cancels the call
                        while context.is_active():
                            time.sleep(0.02)
                        return pb.SubmitUpdateResponse()
                    context.abort(self.cut_code, "link down")
                up.add(mappers.update_chunk(part))
            self.got, _ = up.finish()
        except grpc.RpcError:
            pass
        return pb.SubmitUpdateResponse()

    def QueryUpload(self, request: pb.QueryUploadRequest, context: grpc.ServicerContext) -> pb.QueryUploadResponse:
        return self.book.state(key_of(request))

    def FetchBlob(self, request: pb.AggregatorServiceFetchBlobRequest,
                  context: grpc.ServicerContext) -> Iterator[pb.AggregatorServiceFetchBlobResponse]:
        self.fetches.append(request.start_chunk)
        msgs = codec.encode_tensors({"params": PARAMS}, SPEC).as_messages(pb.AggregatorServiceFetchBlobResponse)
        for n, m in enumerate(msgs[request.start_chunk:]):
            if len(self.fetches) == 1 and n == 2:
                context.abort(grpc.StatusCode.UNAVAILABLE, "link down")
            yield m


@contextlib.contextmanager
def _serving(servicer: pb_grpc.AggregatorServiceServicer) -> Iterator[pb_grpc.AggregatorServiceStub]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_AggregatorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.AggregatorServiceStub(channel)
    finally:
        channel.close()
        server.stop(0)


def _update() -> ClientUpdate:
    return ClientUpdate(cid=1, params=PARAMS, num_samples=5, train_loss=0.5)


@pytest.mark.parametrize(("stall", "code"), [(False, grpc.StatusCode.UNAVAILABLE), (True, None),
                                             (False, grpc.StatusCode.ABORTED)])  # ABORTED: ended early, kept
def test_a_cut_upload_resumes_at_the_held_chunk(stall: bool, code: grpc.StatusCode | None) -> None:
    agg = _Flaky(stall=stall, cut_code=code or grpc.StatusCode.UNAVAILABLE)
    with _serving(agg) as stub:
        sent = transfer.upload(stub, _update(), mappers.UpdateMeta("w", 3, 0), SPEC, stall_s=0.5, timeout_s=20)
    assert sent.resumed == [(3, 3000)]
    assert agg.streams == 2
    assert agg.got is not None and torch.equal(agg.got["params"][0], PARAMS[0])


def test_a_refused_resumption_is_sent_whole_once_instead_of_resumed_again() -> None:
    agg = _Flaky(refuse_resume=True)  # the held chunks stay PARTIAL, but every resumption is refused
    with _serving(agg) as stub:
        sent = transfer.upload(stub, _update(), mappers.UpdateMeta("w", 3, 0), SPEC, stall_s=0.5, timeout_s=20)
    assert sent.resumed == [(3, 3000), (0, 0)]
    assert agg.streams == 3
    assert agg.got is not None and torch.equal(agg.got["params"][0], PARAMS[0])


class _RefusedThenStalled(_Flaky):
    """Stream 1 breaks after 3 chunks, its resumption (stream 2) is refused, stream 3 (from chunk 0) stalls
    after 5 chunks, and from then on every stream goes through."""

    def SubmitUpdate(self, request_iterator: Iterator[pb.SubmitUpdateRequest],
                     context: grpc.ServicerContext) -> pb.SubmitUpdateResponse:
        self.streams += 1
        it = iter(request_iterator)
        h = mappers.update_header(next(it))
        if self.streams == 2:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no open fit task")
        up = self.book.begin(h, 1 << 20)
        for n, part in enumerate(it):
            if self.streams == 1 and n == 3:
                context.abort(grpc.StatusCode.UNAVAILABLE, "link down")
            if self.streams == 3 and n == 5:
                while context.is_active():
                    time.sleep(0.02)
                return pb.SubmitUpdateResponse()
            up.add(mappers.update_chunk(part))
        self.got, _ = up.finish()
        return pb.SubmitUpdateResponse()


def test_after_a_refused_resumption_a_later_cut_resumes_at_the_held_chunk_again() -> None:
    agg = _RefusedThenStalled()
    with _serving(agg) as stub:
        sent = transfer.upload(stub, _update(), mappers.UpdateMeta("w", 3, 0), SPEC, stall_s=0.5, timeout_s=20)
    assert sent.resumed == [(3, 3000), (0, 0), (5, 5000)]  # the refusal sent it whole once, not every time after
    assert agg.streams == 4
    assert agg.got is not None and torch.equal(agg.got["params"][0], PARAMS[0])


def test_a_refused_upload_is_not_retried() -> None:
    agg = _Flaky(refuse=True)
    with _serving(agg) as stub, pytest.raises(grpc.RpcError) as e:
        transfer.upload(stub, _update(), mappers.UpdateMeta("w", 3, 0), SPEC, stall_s=5, timeout_s=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and agg.streams == 1


def test_a_cut_download_resumes_at_the_next_chunk() -> None:
    agg = _Flaky()
    with _serving(agg) as stub:
        got = transfer.fetch(stub, "r0-model", "w", stall_s=5, timeout_s=30)
    assert agg.fetches == [0, 2]
    assert got.delta is None and torch.equal(got.bundle["params"][0], PARAMS[0])


W0 = [torch.linspace(-1, 1, 3000)]
W1 = [W0[0] + 1e-4 * torch.sin(torch.arange(3000, dtype=torch.float32))]
DELTA_SPEC = codec.TransferSpec(chunk_bytes=500)


class _DeltaServer(pb_grpc.AggregatorServiceServicer):
    """Serves r1-model (W1) whole, or as a delta from r0-model (W0) to a caller holding it (server.downloads);
    the first stream breaks after two chunks."""

    def __init__(self) -> None:
        self.deltas = DeltaDownloads(DELTA_SPEC, history=1)
        self.deltas.publish(0, "r0-model", W0)
        self.deltas.publish(1, "r1-model", W1)
        self.full = codec.encode_tensors({"params": W1}, DELTA_SPEC, pb.AggregatorServiceFetchBlobResponse)
        self.requests: list[tuple[int, str | None]] = []

    def FetchBlob(self, request: pb.AggregatorServiceFetchBlobRequest,
                  context: grpc.ServicerContext) -> Iterator[pb.AggregatorServiceFetchBlobResponse]:
        held = mappers.held_from_msg(request)
        self.requests.append((request.start_chunk, held.blob_id if held else None))
        enc = self.deltas.serve(request.blob_id, held, self.full.wire_bytes) if held else None
        for n, m in enumerate((enc or self.full).as_messages(pb.AggregatorServiceFetchBlobResponse)
                              [request.start_chunk:]):
            if len(self.requests) == 1 and n == 2:
                context.abort(grpc.StatusCode.UNAVAILABLE, "link down")
            yield m


def test_a_cut_delta_download_resumes_from_the_same_base() -> None:
    agg = _DeltaServer()
    held = model_delta.Held.of("r0-model", W0, "native")
    with _serving(agg) as stub:
        got = transfer.fetch(stub, "r1-model", "w", stall_s=5, timeout_s=30, held=held.ref)
    assert agg.requests == [(0, "r0-model"), (2, "r0-model")]
    assert got.delta is not None and got.delta.base_blob == "r0-model"
    delta_bytes = sum(len(c.data) for c in agg.deltas.serve("r1-model", held.ref, 1 << 30) or [])
    assert 0 < delta_bytes < agg.full.wire_bytes
    assert torch.equal(held.rebuild(got.delta, got.bundle[model_delta.DELTA_GROUP])[0], W1[0])


def test_a_cut_full_download_resumes_without_offering_the_base() -> None:
    agg = _DeltaServer()
    stale = model_delta.Held.of("r0-model", W1, "native")  # the right id, another model: the blob itself comes
    with _serving(agg) as stub:
        got = transfer.fetch(stub, "r1-model", "w", stall_s=5, timeout_s=30, held=stale.ref)
    assert agg.requests == [(0, "r0-model"), (2, None)]
    assert got.delta is None and torch.equal(got.bundle["params"][0], W1[0])


def test_a_delta_that_was_not_asked_for_is_refused() -> None:
    agg = _DeltaServer()
    delta = agg.deltas.serve("r1-model", model_delta.Held.of("r0-model", W0, "native").ref, 1 << 30)
    assert delta is not None
    agg.full = delta  # served to a caller that holds nothing
    with _serving(agg) as stub, pytest.raises(codec.WireError, match="not asked for"):
        transfer.fetch(stub, "r1-model", "w", stall_s=5, timeout_s=30)


def test_an_upload_cut_by_the_servers_idle_limit_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aggregator's stream deadline (fedentrpc.stream_deadline) cancels an upload that pauses longer than
    its idle limit; the honest worker takes that as a cut link and resumes at the chunks the server kept."""
    from fedentrpc.security.flags import ServerSecurity
    from fedentrpc.serving import create_server
    from fedentrpc.stream_limit import StreamLimits

    parts = mappers.update_to_parts
    attempts: list[int] = []

    def pausing(*args: object, **kwargs: object) -> Iterator[pb.SubmitUpdateRequest]:
        attempts.append(int(kwargs.get("resume_from", 0)))  # type: ignore[call-overload]
        for n, part in enumerate(parts(*args, **kwargs)):  # type: ignore[arg-type]
            if len(attempts) == 1 and n == 4:  # the header and 3 chunks sent, then a pause of 4 idle limits
                time.sleep(2.0)
            yield part

    monkeypatch.setattr(mappers, "update_to_parts", pausing)
    agg = _Flaky(cut_after=99)  # the servicer itself never cuts
    server = create_server(ServerSecurity(insecure=True), 8, StreamLimits(idle_s=0.5))
    pb_grpc.add_AggregatorServiceServicer_to_server(agg, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            sent = transfer.upload(pb_grpc.AggregatorServiceStub(ch), _update(), mappers.UpdateMeta("w", 3, 0), SPEC,
                                   stall_s=5, timeout_s=20)  # the worker's own stall watch would wait 5 s
    finally:
        server.stop(0)
    assert attempts == [0, 3] and sent.resumed == [(3, 3000)] and agg.streams == 2
    assert agg.got is not None and torch.equal(agg.got["params"][0], PARAMS[0])


def test_an_upload_refused_while_the_servers_stream_threads_are_taken_waits_and_goes_through() -> None:
    """RESOURCE_EXHAUSTED (fedentrpc.stream_limit: the stream budget of a 5-thread server is 1) is "not now":
    the worker backs off and tries again instead of dropping its update."""
    import threading

    from fedentrpc.security.flags import ServerSecurity
    from fedentrpc.serving import create_server
    from fedentrpc.stream_limit import StreamLimits

    agg = _Flaky(cut_after=99)
    server = create_server(ServerSecurity(insecure=True), 5, StreamLimits())
    pb_grpc.add_AggregatorServiceServicer_to_server(agg, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    gate = threading.Event()

    def holder() -> Iterator[pb.SubmitUpdateRequest]:
        gate.wait(20)  # holds the one stream slot, sending nothing
        return
        yield

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.AggregatorServiceStub(ch)
            held = stub.SubmitUpdate.future(holder(), timeout=20)
            while agg.streams == 0:
                time.sleep(0.01)
            threading.Timer(1.0, gate.set).start()  # the slot comes back after a second
            sent = transfer.upload(stub, _update(), mappers.UpdateMeta("w", 3, 0), SPEC, stall_s=5, timeout_s=20)
            assert held.exception(timeout=10) is not None  # the holder ended (no header: not an update)
    finally:
        gate.set()
        server.stop(0)
    assert sent.resumed == [] and agg.streams == 2  # the holder's stream and one whole upload; refusals never ran
    assert agg.got is not None and torch.equal(agg.got["params"][0], PARAMS[0])
