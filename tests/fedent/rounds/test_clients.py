"""ClientBook: clients.json written by several threads never goes back to an older snapshot."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fedent import runlog
from fedent.rounds.clients import ClientBook


def test_an_earlier_snapshot_never_lands_over_a_later_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = ClientBook(tmp_path / "clients.json", [5, 5])
    real = runlog.write_clients
    slow_disk = threading.Event()
    first = threading.Event()

    def write_clients(path: Path, rows: list[dict[str, object]]) -> None:
        if not first.is_set():  # the first writer snapshotted, then its disk stalls
            first.set()
            assert slow_disk.wait(10)
        real(path, rows)

    monkeypatch.setattr(runlog, "write_clients", write_clients)
    a = threading.Thread(target=book.write)  # e.g. the rounds thread, writing the rows as they were
    a.start()
    assert first.wait(10)

    def ready() -> None:  # e.g. a worker's Ready on a servicer thread: newer rows, written after
        book.update([0], data_source="/d/c0", label_counts=[5])
        book.write()

    b = threading.Thread(target=ready)
    b.start()
    b.join(0.5)  # the second writer either waits for the first (correct) or has already written
    slow_disk.set()
    a.join(10)
    b.join(10)
    rows = runlog.read_clients(tmp_path / "clients.json")
    assert (rows[0]["data_source"], rows[0]["label_counts"]) == ("/d/c0", [5])
