"""ClientStateStore: atomic versioned per-client state, torn temp files, resume-safe version choice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedent.checkpoint import encode_payload
from fedent.client_store import ClientStateStore, ClientStoreError
from fedent.strategies.base import ClientState


def _state(v: float) -> ClientState:
    return ClientState(tensors={"h": [torch.full((2, 2), v), torch.full((3,), -v)], "c": [torch.ones(1) * v]},
                       scalars={"eta": v / 10})


def _same(a: ClientState, b: ClientState) -> bool:
    if a.scalars != b.scalars or set(a.tensors) != set(b.tensors):
        return False
    return all(torch.equal(x, y) for k in a.tensors for x, y in zip(a.tensors[k], b.tensors[k], strict=True))


def test_save_load_round_trip_and_missing(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    assert store.load(5) is None
    store.save(5, _state(1.0), rnd=0)
    got = store.load(5)
    assert got is not None and _same(got, _state(1.0))
    # a fresh store object (a restarted worker) sees the same state
    again = ClientStateStore(tmp_path).load(5)
    assert again is not None and _same(again, _state(1.0))


def test_empty_state_round_trips(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    store.save(0, ClientState(), rnd=2)
    got = store.load(0)
    assert got is not None and got.tensors == {} and got.scalars == {}


def test_saved_state_does_not_alias_live_tensors(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    st = _state(1.0)
    store.save(1, st, rnd=0)
    st.tensors["h"][0].add_(5)
    got = store.load(1)
    assert got is not None and torch.equal(got.tensors["h"][0], torch.full((2, 2), 1.0))


def test_all_and_cids(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    for cid in (3, 1, 7):
        store.save(cid, _state(float(cid)), rnd=cid)
    assert store.cids() == [1, 3, 7]
    every = store.all()
    assert sorted(every) == [1, 3, 7] and all(_same(every[c], _state(float(c))) for c in every)
    store.delete(3)
    assert store.cids() == [1, 7]


def test_versions_are_kept_and_pruned(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path, keep=2)
    for r in (1, 4, 6, 9):
        store.save(0, _state(float(r)), rnd=r)
    assert store.versions(0) == [9, 6]


def test_before_round_picks_state_for_a_replayed_round(tmp_path: Path) -> None:
    """The aggregator resumed from its round-4 checkpoint and re-runs round 5, already fitted here."""
    store = ClientStateStore(tmp_path)
    store.save(2, _state(3.0), rnd=3)
    store.save(2, _state(5.0), rnd=5)
    got = store.load(2, before_round=5)
    assert got is not None and _same(got, _state(3.0))
    assert store.load(2, before_round=3) is None  # never participated before round 3
    latest = store.load(2)
    assert latest is not None and _same(latest, _state(5.0))
    assert sorted(store.all(before_round=4)) == [2]


def test_torn_temp_file_from_a_killed_save_is_ignored(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    store.save(4, _state(1.0), rnd=0)
    # what a SIGKILL during the next save leaves behind: half of the new file under a temp name
    full = encode_payload({"kind": "client_state", "cid": 4, "round": 1, "tensors": {}, "scalars": {}})
    torn = tmp_path / ".c000004-r00000001.state.x1y2.tmp"
    torn.write_bytes(full[: len(full) // 2])
    got = store.load(4)
    assert got is not None and _same(got, _state(1.0))
    reopened = ClientStateStore(tmp_path)  # a restarted worker cleans the leftovers
    assert not torn.exists()
    got2 = reopened.load(4)
    assert got2 is not None and _same(got2, _state(1.0))


def test_corrupt_final_file_is_a_clear_error(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    path = store.save(6, _state(2.0), rnd=1)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(ClientStoreError, match="truncated") as ei:
        store.load(6)
    assert "\n" not in str(ei.value)


def test_file_of_another_client_is_refused(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    src = store.save(1, _state(1.0), rnd=0)
    src.rename(store.path(2, 0))
    with pytest.raises(ClientStoreError, match="expected 2"):
        store.load(2)


def test_bad_inputs(tmp_path: Path) -> None:
    store = ClientStateStore(tmp_path)
    with pytest.raises(TypeError):
        store.save(0, ClientState(tensors={"h": [1.0]}), rnd=0)  # type: ignore[list-item]
    with pytest.raises(ValueError):
        store.save(-1, ClientState(), rnd=0)
    with pytest.raises(ValueError):
        ClientStateStore(tmp_path, keep=0)


def test_a_save_for_an_earlier_round_supersedes_later_versions_and_survives(tmp_path: Path) -> None:
    """A worker whose aggregator started over (or resumed from an older checkpoint) saves round 0 beside
    rounds 7-9 of the abandoned run: the new state is kept and the later ones dropped (keep-newest-3 by
    round deleted the state just saved, and the next load read the old run's)."""
    store = ClientStateStore(tmp_path, keep=3)
    for r in (7, 8, 9):
        store.save(4, _state(float(r)), rnd=r)
    store.save(4, _state(0.5), rnd=0)
    assert store.versions(4) == [0]
    got = store.load(4, before_round=1)
    assert got is not None and _same(got, _state(0.5))


def test_retention_keeps_the_state_a_resume_from_the_oldest_checkpoint_needs(tmp_path: Path) -> None:
    """keep=3 against the aggregator's 2 checkpoints: after fits of rounds 3, 4 and 5 (round 5 not yet
    checkpointed, newest checkpoint 4 torn), a resume from checkpoint 3 replays round 4 from the state
    saved before it."""
    store = ClientStateStore(tmp_path, keep=3)
    for r in range(6):
        store.save(1, _state(float(r)), rnd=r)
    got = store.load(1, before_round=4)
    assert got is not None and _same(got, _state(3.0))


def test_a_background_store_reads_its_own_writes_and_keeps_the_same_versions(tmp_path: Path) -> None:
    """background=True: saves return at once, reads wait for the writes before them; after the same saves the
    files on disk are the synchronous store's, and the state is copied when saved (changed after, not on disk)."""
    sync, bg = ClientStateStore(tmp_path / "sync", keep=2), ClientStateStore(tmp_path / "bg", keep=2, background=True)
    for rnd in range(5):
        for cid in (0, 3):
            state = _state(float(rnd + cid))
            sync.save(cid, state, rnd)
            bg.save(cid, state, rnd)
            state.tensors["h"][0].add_(100.0)  # the caller changes its tensors after saving
            got = bg.load(cid)
            assert got is not None and _same(got, _state(float(rnd + cid)))
    assert bg.versions(0) == sync.versions(0) == [4, 3]
    assert sorted(p.name for p in (tmp_path / "bg").iterdir()) == sorted(p.name for p in (tmp_path / "sync").iterdir())
    bg.close()
    bg.save(1, _state(2.0), 0)  # closed: written synchronously
    assert bg.versions(1) == [0]


def test_a_failed_background_write_fails_the_next_flush_and_writes_nothing_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import fedent.client_store as cs

    store = ClientStateStore(tmp_path, background=True)
    real = cs.atomic_write_bytes
    queued = threading.Event()  # client 2's write fails only once client 3's state is queued: else the writer
    # thread may fail first and save(3) raise it (as designed), which failed a fresh-clone CI run here under load

    def full_disk(path: Path, data: bytes, mode: int | None = None) -> None:
        if "c000002" in Path(path).name:
            assert queued.wait(timeout=60)
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(cs, "atomic_write_bytes", full_disk)
    store.save(1, _state(1.0), 0)
    store.save(2, _state(2.0), 0)
    store.save(3, _state(3.0), 0)
    queued.set()
    with pytest.raises(ClientStoreError, match="client 2's state of round 0 .*No space left on device"):
        store.flush()
    with pytest.raises(ClientStoreError, match="No space left"):
        store.save(4, _state(4.0), 0)
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert names == ["c000001-r00000000.state"]  # client 3's state, saved after the failure, was not written
    store.close()  # at the end of a run, however it ended: no second error
