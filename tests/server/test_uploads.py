"""server.uploads: a cut upload's verified chunks are kept and a resumed stream continues them, chunks the
aggregator holds are dropped, an upload received whole is never taken again, and a superseded stream (its
handler still blocked on a dead connection) cannot add to the one that took over."""

from __future__ import annotations

import threading

import pytest
import torch

from fedentrpc import codec
from fedentrpc.v1 import aggregator_pb2 as pb
from server import uploads
from server.uploads import UploadBook
from server.work import ClusterError

SPEC = codec.TransferSpec(chunk_bytes=1000)
BUNDLE = {"params": [torch.arange(2000, dtype=torch.float32)]}  # 8000 bytes: 8 chunks


def _chunks(start: int = 0) -> list[codec.Chunk]:
    return list(codec.tensor_chunks(BUNDLE, SPEC, start=start))


def _msg(c: codec.Chunk) -> codec.pb.TensorChunk:
    m = codec.pb.TensorChunk()
    c.fill(m)
    return m


def _header(resume: int = 0, rnd: int = 0, samples: int = 5, worker: str = "w", cid: int = 1) -> pb.UpdateHeader:
    return pb.UpdateHeader(worker_id=worker, task_id=3, round=rnd, cid=cid, num_samples=samples,
                           resume_from_chunk=resume)


def test_a_cut_upload_resumes_from_the_held_chunks_and_completes_once() -> None:
    book = UploadBook()
    up = book.begin(_header(), 1 << 20)
    assert up.resumed_at is None
    for c in _chunks()[:3]:
        up.add(_msg(c))
    state = book.state(up.key)
    assert (state.state, state.next_chunk, state.received_bytes) == (pb.UPLOAD_STATE_PARTIAL, 3, 3000)
    again = book.begin(_header(resume=2), 1 << 20)  # asked from 2: chunk 2 is repeated and dropped
    assert again.resumed_at == (3, 3000)
    for c in _chunks(start=2):
        again.add(_msg(c))
    bundle, wire = again.finish()
    assert wire == 8000 and torch.equal(bundle["params"][0], BUNDLE["params"][0])
    # received whole but not yet taken (a caller that does not own the client is refused after this): the
    # rightful owner can still upload it from chunk 0
    assert book.state(up.key).state != pb.UPLOAD_STATE_COMPLETE
    again.accepted()
    assert book.state(up.key).state == pb.UPLOAD_STATE_COMPLETE
    with pytest.raises(ClusterError, match="already received whole") as e:
        book.begin(_header(), 1 << 20)
    assert e.value.code == "conflict"


def test_a_superseded_stream_cannot_add_or_finish() -> None:
    book = UploadBook()
    old = book.begin(_header(), 1 << 20)
    old.add(_msg(_chunks()[0]))
    book.begin(_header(resume=1), 1 << 20)
    with pytest.raises(ClusterError, match="superseded"):
        old.add(_msg(_chunks()[1]))
    with pytest.raises(ClusterError, match="superseded"):
        old.finish()
    assert book.state(old.key).next_chunk == 1


@pytest.mark.parametrize(("header", "error"), [
    (_header(resume=2), "holds 1 chunks"),          # asks to skip chunks the aggregator does not have
    (_header(resume=1, samples=6), "header differs"),  # not the same upload
])
def test_a_resume_that_does_not_match_the_held_partial_is_refused(header: pb.UpdateHeader, error: str) -> None:
    book = UploadBook()
    book.begin(_header(), 1 << 20).add(_msg(_chunks()[0]))
    with pytest.raises((ClusterError, codec.WireError), match=error):
        book.begin(header, 1 << 20)


def test_nothing_to_resume_and_a_later_round_drops_earlier_partials() -> None:
    book = UploadBook()
    with pytest.raises(ClusterError, match="send it from chunk 0"):
        book.begin(_header(resume=1), 1 << 20)
    old = book.begin(_header(), 1 << 20)
    old.add(_msg(_chunks()[0]))
    book.begin(_header(rnd=1), 1 << 20)
    assert book.state(old.key).state == pb.UPLOAD_STATE_NONE


def test_a_corrupt_stream_is_discarded() -> None:
    book = UploadBook()
    up = book.begin(_header(), 1 << 20)
    bad = _msg(_chunks()[0])
    bad.checksum ^= 1
    with pytest.raises(codec.WireError, match="checksum"):
        up.add(bad)
    up.discard()
    assert book.state(up.key).state == pb.UPLOAD_STATE_NONE


def test_a_stream_that_ends_before_its_last_chunk_keeps_its_chunks() -> None:
    book = UploadBook()
    up = book.begin(_header(), 1 << 20)
    for c in _chunks()[:5]:
        up.add(_msg(c))
    with pytest.raises(codec.TruncatedStream, match="5 of 8 chunks"):
        up.finish()
    state = book.state(up.key)
    assert (state.state, state.next_chunk, state.received_bytes) == (pb.UPLOAD_STATE_PARTIAL, 5, 5000)
    empty = book.begin(_header(resume=5), 1 << 20)  # a resumption cut before its first chunk: still held
    with pytest.raises(codec.TruncatedStream):
        empty.finish()
    assert book.state(up.key).next_chunk == 5
    again = book.begin(_header(resume=5), 1 << 20)
    for c in _chunks(start=5):
        again.add(_msg(c))
    bundle, wire = again.finish()
    assert wire == 8000 and torch.equal(bundle["params"][0], BUNDLE["params"][0])
    assert book.state(up.key).state == pb.UPLOAD_STATE_NONE  # taken: nothing held any more


def test_one_workers_uploads_evict_only_its_own_kept_partials(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker with many clients (or a hostile one) starting more uploads than the cap evicts its own oldest
    partials, never another worker's kept chunks."""
    monkeypatch.setattr(uploads, "MAX_PARTIALS", 4)
    book = UploadBook()
    honest = book.begin(_header(worker="a"), 1 << 20)
    for c in _chunks()[:3]:
        honest.add(_msg(c))
    flood = [book.begin(_header(worker="b", cid=10 + i), 1 << 20) for i in range(6)]
    for up in flood:
        up.add(_msg(_chunks()[0]))
    assert book.state(honest.key).next_chunk == 3  # still held for its owner
    held = [book.state(up.key).state for up in flood]
    assert held == [pb.UPLOAD_STATE_NONE] * 2 + [pb.UPLOAD_STATE_PARTIAL] * 4  # b's two oldest went


def test_a_header_declaring_more_tensors_than_the_bound_is_refused_before_anything_is_kept() -> None:
    book = UploadBook()
    up = book.begin(_header(), 1 << 20, max_tensors=1)
    two = {"params": [torch.zeros(10), torch.zeros(10)]}
    first = next(iter(codec.tensor_chunks(two, SPEC)))
    with pytest.raises(codec.WireError, match="declares 2 tensors; this receiver takes at most 1"):
        up.add(_msg(first))
    one = book.begin(_header(), 1 << 20, max_tensors=1)  # the bound admits what it should
    for c in _chunks():
        one.add(_msg(c))
    assert torch.equal(one.finish()[0]["params"][0], BUNDLE["params"][0])


def test_a_decode_holds_neither_the_book_nor_other_uploads_and_a_decoded_partial_cannot_be_taken_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding an upload (zlib, a header of many tensors) may take long: other workers' queries and uploads
    go on meanwhile, and no stream can resume the upload being decoded."""
    book = UploadBook()
    slow = book.begin(_header(worker="a"), 1 << 20)
    for c in _chunks():
        slow.add(_msg(c))
    entered, release = threading.Event(), threading.Event()
    real_finish = codec.TensorAssembler.finish

    def blocking_finish(self: codec.TensorAssembler) -> codec.Bundle:
        entered.set()
        assert release.wait(10)
        return real_finish(self)

    monkeypatch.setattr(codec.TensorAssembler, "finish", blocking_finish)
    result: list[tuple[codec.Bundle, int]] = []
    t = threading.Thread(target=lambda: result.append(slow.finish()))
    t.start()
    try:
        assert entered.wait(10)
        other = book.begin(_header(worker="b", cid=2), 1 << 20)  # would wait for the decode under the book's lock
        other.add(_msg(_chunks()[0]))
        assert book.state(other.key).next_chunk == 1
        with pytest.raises(ClusterError, match="received whole"):  # a resumption of the one being decoded
            book.begin(_header(worker="a", resume=8), 1 << 20)
    finally:
        release.set()
        t.join(10)
    assert result and torch.equal(result[0][0]["params"][0], BUNDLE["params"][0])
    assert book.state(slow.key).state == pb.UPLOAD_STATE_NONE and book.state(other.key).next_chunk == 1
