"""Tensor lists the service holds for streaming: w(0) uploaded by the aggregator, Algorithm 1's points.

Workers fetch the point φ1(t) once per request batch (FetchBlob); the aggregator uploads w(0) (PutBlob).
Blobs are kept encoded, so each fetch streams the same chunks without re-serialising. The store is
bounded by wire bytes: the oldest blobs go first, and a blob that a running job pins is never dropped.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

from fedentrpc import codec


class BlobNotFound(KeyError):
    """The blob id is unknown (never stored, or already dropped)."""

    def __str__(self) -> str:
        return f"unknown blob {self.args[0]!r} (never uploaded or already dropped)"


class BlobStore:
    """Thread-safe id -> encoded tensor list, evicting the oldest unpinned blobs above ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blobs: OrderedDict[str, codec.EncodedTensors] = OrderedDict()
        self._pinned: set[str] = set()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def put(self, enc: codec.EncodedTensors, prefix: str = "blob", pin: bool = False) -> str:
        with self._lock:
            blob_id = f"{prefix}-{next(self._ids)}"
            self._blobs[blob_id] = enc
            if pin:
                self._pinned.add(blob_id)
            self._evict()
            return blob_id

    def get(self, blob_id: str) -> codec.EncodedTensors:
        with self._lock:
            enc = self._blobs.get(blob_id)
            if enc is None:
                raise BlobNotFound(blob_id)
            return enc

    def decode(self, blob_id: str) -> codec.Bundle:
        return codec.decode_tensors(self.get(blob_id).chunks)

    def drop(self, blob_id: str) -> None:
        with self._lock:
            self._blobs.pop(blob_id, None)
            self._pinned.discard(blob_id)

    def unpin(self, blob_id: str) -> None:
        with self._lock:
            self._pinned.discard(blob_id)
            self._evict()

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(e.wire_bytes for e in self._blobs.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._blobs)

    def _evict(self) -> None:
        total = sum(e.wire_bytes for e in self._blobs.values())
        for blob_id in list(self._blobs)[:-1]:  # never the newest: its caller is about to use it
            if total <= self.max_bytes:
                return
            if blob_id in self._pinned:
                continue
            total -= self._blobs.pop(blob_id).wire_bytes
