"""Algorithm 1's gradient oracle over RPC: g_i at φ1(t) from the worker that hosts client i.

``RpcGradientOracle`` implements ``fedent.meanfield.fixed_point.GradientOracle`` by asking the workers
that host each client (over their Oracle streams, see ``estimator.hub``) for g_i at φ1(t): the point is
stored once as a blob that the workers fetch, up to ``prefetch`` clients are asked at once, every call
has a deadline and is retried (possibly on a reconnected worker) before the job fails. The jobs that drive
it are ``estimator.offline_jobs``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from estimator.blobs import BlobStore
from estimator.hub import Gradient, OracleCallError, OracleHub
from fedent.params import Params
from fedentrpc import codec
from fedentrpc.v1 import estimator_pb2 as est_pb

log = logging.getLogger("fedent.estimator")


class OracleFailure(RuntimeError):
    """A gradient could not be obtained within the deadline and retries; fails the offline job."""


class JobCancelled(RuntimeError):
    """The service is shutting down."""


@dataclass(frozen=True)
class OracleSettings:
    timeout_s: float
    retries: int
    prefetch: int
    seed: int
    batch_size: int


class RpcGradientOracle:
    """g_i(φ1(t)) from the worker hosting client i (Algorithm 1, Step 2: clients compute, the service never
    sees data). Answers are checked against the point's shapes and dtypes."""

    def __init__(self, hub: OracleHub, blobs: BlobStore, run_id: str, client_order: Sequence[int],
                 settings: OracleSettings, on_sweep: Callable[[int], None] | None = None,
                 cancelled: threading.Event | None = None,
                 schedule: Sequence[Sequence[int]] | None = None) -> None:
        self.hub = hub
        self.blobs = blobs
        self.run_id = run_id
        self.order = [int(c) for c in client_order]
        # the clients Algorithm 1 asks at step t, in order (what to prefetch next): round t's sample or all
        rounds = [list(map(int, r)) for r in schedule] if schedule is not None else None
        self._orders = rounds
        self._next_all = {c: self.order[i + 1 :] for i, c in enumerate(self.order)}
        self._next_t = [{c: r[i + 1 :] for i, c in enumerate(r)} for r in rounds] if rounds is not None else None
        self._first = rounds[0][0] if rounds else self.order[0]
        self.settings = settings
        self.on_sweep = on_sweep
        self.cancelled = cancelled or threading.Event()
        self.sweep = 0
        self.calls = 0
        self.retries_used = 0
        self._point: Sequence[Tensor] | None = None
        self._point_blob = ""
        self._t = -1
        self._cache: dict[int, Future[Gradient]] = {}

    # ---- GradientOracle ----------------------------------------------------------------------------
    def gradient(self, t: int, cid: int, point: Sequence[Tensor]) -> Params:
        if self.cancelled.is_set():
            raise JobCancelled("the estimator service is shutting down")
        if t == 0 and cid == self._first:  # every sweep starts at φ1(0) = w(0) with the first client
            self.sweep += 1
            if self.on_sweep is not None:
                self.on_sweep(self.sweep)
        self._move_to(t, point)
        self.calls += 1
        if cid not in self._cache:
            following = self._next_t[t].get(cid, []) if self._next_t is not None and t < len(self._next_t) \
                else self._next_all.get(cid, [])
            self._ask([cid, *[c for c in following if c not in self._cache]][: self.settings.prefetch])
        fut = self._cache.pop(cid)
        attempts = 1 + self.settings.retries
        last = ""
        for attempt in range(attempts):
            if attempt > 0:
                self.retries_used += 1
                log.warning("retrying the gradient of client %d at t=%d (attempt %d of %d): %s",
                            cid, t, attempt + 1, attempts, last)
                fut = self._ask([cid])[cid]
                self._cache.pop(cid, None)
            try:
                grads = self._wait(fut)
            except OracleCallError as e:
                last = str(e)
                continue
            except FutureTimeout:
                self.hub.cancel([fut])
                last = f"no answer within {self.settings.timeout_s:g}s"
                continue
            try:
                codec.check_shapes(grads, point, f"gradient of client {cid}")
            except codec.WireError as e:
                raise OracleFailure(str(e)) from None
            return [g.to(p.device) for g, p in zip(grads, point, strict=True)]
        raise OracleFailure(f"gradient of client {cid} at t={t} (sweep {self.sweep}) failed after "
                            f"{attempts} attempt(s): {last}")

    # ---- helpers -----------------------------------------------------------------------------------
    def _wait(self, fut: Future[Gradient]) -> Gradient:
        deadline = time.monotonic() + self.settings.timeout_s
        while True:  # in short slices, so a shutdown does not wait out a long deadline
            if self.cancelled.is_set():
                self.hub.cancel([fut])
                raise JobCancelled("the estimator service is shutting down")
            left = deadline - time.monotonic()
            if left <= 0:
                raise FutureTimeout()
            try:
                return fut.result(timeout=min(left, 0.5))
            except FutureTimeout:
                continue

    def _move_to(self, t: int, point: Sequence[Tensor]) -> None:
        """A new φ1(t): store it once as a blob the workers fetch; forget the previous point's answers."""
        if point is self._point and t == self._t:
            return
        self.close()
        enc = codec.encode_tensors({codec.PARAMS_GROUP: [p.detach().cpu() for p in point]},
                                   carrier=est_pb.EstimatorServiceFetchBlobResponse)  # as FetchBlob serves it
        self._point_blob = self.blobs.put(enc, prefix=f"point-s{self.sweep}-t{t}", pin=True)
        self._point, self._t = point, t

    def _ask(self, cids: list[int]) -> dict[int, Future[Gradient]]:
        """One OracleRequest per hosting worker for ``cids``; a client without a worker waits for one."""
        by_conn: dict[int, tuple[Any, list[int]]] = {}
        out: dict[int, Future[Gradient]] = {}
        waited = False  # wait for a (re)connecting worker at most once per batch
        for cid in cids:
            conn = self.hub.host_of(cid, self.run_id)
            if conn is None and not waited:
                waited = True
                missing = self.hub.wait_hosts([cid], self.run_id, self.settings.timeout_s)
                conn = None if missing else self.hub.host_of(cid, self.run_id)
            if conn is None:
                fut: Future[Gradient] = Future()
                fut.set_exception(OracleCallError(f"no worker hosts client {cid} (waited "
                                                  f"{self.settings.timeout_s:g}s for one)"))
                out[cid] = fut
                continue
            by_conn.setdefault(conn.serial, (conn, []))[1].append(cid)
        for conn, group in by_conn.values():
            out.update(self.hub.submit(conn, group, self._point_blob, self._t, self.sweep, self.settings.seed,
                                       self.settings.batch_size))
        self._cache.update(out)
        return out

    def close(self) -> None:
        """Drop outstanding requests and the current point's blob."""
        if self._cache:
            self.hub.cancel(self._cache.values())
            self._cache.clear()
        if self._point_blob:
            self.blobs.drop(self._point_blob)
            self._point_blob = ""
        self._point = None
