"""The workers' side of Algorithm 1: open Oracle streams and the gradient requests in flight on them.

Workers only dial out, so the service cannot call them: each worker opens ``EstimatorService.Oracle``, says
which clients it hosts (OracleHello), and then answers every GradientTask pushed down the stream (in an
OracleResponse) with, per client, a result header followed by the gradient's tensor chunks (or an
OracleError), each in an OracleRequest: the message names follow the call, which the worker makes. The hub keeps
the open streams, hands out request ids, and turns answers into futures the gradient oracle waits on.
A stream that ends fails every request still pending on it at once, so the oracle can retry elsewhere.

Identity (issue 25): each stream records the identity its credentials name (``WorkerConn.identity``), and an
offline job brings the aggregator's binding client -> identity (``bind_owners``). A stream may claim only its
own clients: a hello naming a client bound to another identity is refused (``ClaimRefused``), and routing
never picks a stream whose identity is not the client's owner (a stream that attached before the job brought
the binding is skipped, not trusted). A client without an owner keeps the old rule: the latest stream wins.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from torch import Tensor

from fedentrpc import codec
from fedentrpc.v1 import estimator_pb2 as est_pb

log = logging.getLogger("fedent.estimator")

Gradient = list[Tensor]  # one tensor per model parameter


class ClaimRefused(PermissionError):
    """A stream named a client bound to another worker identity (PERMISSION_DENIED on the wire)."""


class OracleCallError(RuntimeError):
    """One gradient request failed: the worker reported an error, sent garbage, or went away."""


@dataclass(eq=False)
class WorkerConn:
    """One open Oracle stream; ``outbox`` feeds the stream (None closes it)."""

    serial: int
    worker_id: str
    run_id: str
    client_ids: frozenset[int]
    identity: str | None = None  # what the stream's credentials name; None when the service authenticates none
    outbox: queue.Queue[est_pb.GradientTask | None] = field(default_factory=queue.Queue)
    alive: bool = True
    pending: set[tuple[int, int]] = field(default_factory=set)


class OracleHub:
    """Thread-safe registry of Oracle streams and of pending (request id, client) futures."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._conns: dict[int, WorkerConn] = {}
        self._futures: dict[tuple[int, int], tuple[WorkerConn, Future[Gradient]]] = {}
        self._serials = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._owners: dict[str, dict[int, str]] = {}  # run id -> {cid: the only identity that may host it}

    def bind_owners(self, run_id: str, owners: dict[int, str]) -> None:
        """The aggregator's client -> identity binding for ``run_id`` (clients left out stay unbound)."""
        with self._lock:
            self._owners[run_id] = {int(c): o for c, o in owners.items() if o}
            self._lock.notify_all()

    def _owner(self, cid: int, run_id: str) -> str | None:
        """The identity ``cid`` is bound to for ``run_id`` (any run's binding when ``run_id`` is empty)."""
        if run_id:
            return self._owners.get(run_id, {}).get(cid)
        for owners in self._owners.values():
            if cid in owners:
                return owners[cid]
        return None

    # ---- streams ---------------------------------------------------------------------------------
    def attach(self, hello: est_pb.OracleHello, identity: str | None = None) -> WorkerConn:
        """Register a stream for the clients its hello names; ``identity``: what its credentials name.
        ClaimRefused when a named client is bound to another identity."""
        cids = frozenset(int(c) for c in hello.client_ids)
        if not cids:
            raise ValueError("oracle hello names no clients")
        if any(c < 0 for c in cids):
            raise ValueError("oracle hello: client ids must be >= 0")
        with self._lock:
            foreign = sorted(c for c in cids if (o := self._owner(c, hello.run_id)) is not None and o != identity)
            if foreign:
                raise ClaimRefused(f"client(s) {foreign[:5]} are bound to another worker identity, not "
                                   f"{identity or 'an unauthenticated caller'}")
            conn = WorkerConn(next(self._serials), hello.worker_id or "?", hello.run_id, cids, identity)
            self._conns[conn.serial] = conn
            self._lock.notify_all()
        log.info("oracle stream from worker %s (%d clients)", conn.worker_id, len(cids))
        return conn

    def detach(self, conn: WorkerConn, reason: str = "disconnected") -> None:
        with self._lock:
            if not conn.alive:
                return
            conn.alive = False
            self._conns.pop(conn.serial, None)
            lost = [self._futures.pop(k) for k in list(conn.pending) if k in self._futures]
            conn.pending.clear()
            self._lock.notify_all()
        conn.outbox.put(None)
        for _, fut in lost:
            _fail(fut, OracleCallError(f"worker {conn.worker_id} {reason}"))
        log.info("oracle stream from worker %s closed (%s)", conn.worker_id, reason)

    def close_all(self) -> None:
        with self._lock:
            conns = list(self._conns.values())
        for c in conns:
            self.detach(c, "closed by the service")

    @property
    def connections(self) -> list[WorkerConn]:
        with self._lock:
            return list(self._conns.values())

    def host_of(self, cid: int, run_id: str) -> WorkerConn | None:
        """The most recently connected live stream hosting ``cid`` for this run (or for any run)."""
        with self._lock:
            return self._host_of(cid, run_id)

    def _host_of(self, cid: int, run_id: str) -> WorkerConn | None:
        best = None
        owner = self._owner(cid, run_id)
        for c in self._conns.values():
            if owner is not None and c.identity != owner:
                continue  # only the client's own identity may receive its tasks
            if cid in c.client_ids and (not run_id or not c.run_id or c.run_id == run_id):
                if best is None or c.serial > best.serial:
                    best = c
        return best

    def wait_hosts(self, cids: Sequence[int], run_id: str, timeout_s: float) -> list[int]:
        """Block until every client has a live stream or the timeout passes; returns the clients missing."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                missing = [c for c in cids if self._host_of(c, run_id) is None]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._lock.wait(min(left, 1.0))

    # ---- requests --------------------------------------------------------------------------------
    def submit(self, conn: WorkerConn, cids: Sequence[int], point_blob: str, t: int, sweep: int, seed: int,
               batch_size: int) -> dict[int, Future[Gradient]]:
        """Push one GradientTask for ``cids`` (all hosted by ``conn``); a future per client."""
        out: dict[int, Future[Gradient]] = {}
        with self._lock:
            rid = next(self._request_ids)
            for cid in cids:
                fut: Future[Gradient] = Future()
                if conn.alive:
                    self._futures[(rid, cid)] = (conn, fut)
                    conn.pending.add((rid, cid))
                else:
                    _fail(fut, OracleCallError(f"worker {conn.worker_id} disconnected"))
                out[cid] = fut
            alive = conn.alive
        if alive:
            conn.outbox.put(est_pb.GradientTask(request_id=rid, sweep=sweep, t=t, client_ids=list(cids),
                                                 point_blob=point_blob, seed=seed, batch_size=batch_size))
        return out

    def cancel(self, futures: Iterable[Future[Gradient]]) -> None:
        """Forget requests nobody waits for any more (their late answers are dropped)."""
        drop = set(map(id, futures))
        with self._lock:
            for key, (conn, fut) in list(self._futures.items()):
                if id(fut) in drop:
                    del self._futures[key]
                    conn.pending.discard(key)
                    fut.cancel()

    def _resolve(self, conn: WorkerConn, rid: int, cid: int, value: Gradient | None, error: str = "") -> None:
        with self._lock:
            entry = self._futures.get((rid, cid))
            if entry is None or entry[0] is not conn:
                return  # a late answer to a cancelled or retried request
            del self._futures[(rid, cid)]
            conn.pending.discard((rid, cid))
        fut = entry[1]
        if value is None:
            _fail(fut, OracleCallError(f"worker {conn.worker_id}, client {cid}: {error}"))
        elif not fut.done():
            fut.set_result(value)

    def consume(self, conn: WorkerConn, messages: Iterable[est_pb.OracleRequest]) -> None:
        """Read a stream's answers until it ends: result header, its chunks, ... (runs in its own thread)."""
        current: tuple[int, int] | None = None
        asm: codec.TensorAssembler | None = None
        got = 0  # chunks of the current answer
        try:
            for m in messages:
                kind = m.WhichOneof("kind")
                if kind == "result":
                    if current is not None:
                        self._resolve(conn, *current, None, "answer ended before its tensor chunks did")
                    current, asm = (int(m.result.request_id), int(m.result.cid)), codec.TensorAssembler()
                    got = 0
                elif kind == "chunk":
                    if current is None or asm is None:
                        raise codec.WireError("tensor chunk without a result header")
                    rid, cid = current
                    try:
                        asm.add(m.chunk)
                        got += 1
                        if asm.header is not None and got >= max(asm.header.num_chunks, 1):
                            grads = asm.finish().get("grad")
                            if grads is None:
                                raise codec.WireError("gradient answer carries no 'grad' tensor group")
                            self._resolve(conn, rid, cid, list(grads))
                            current, asm = None, None
                    except codec.WireError as e:
                        self._resolve(conn, rid, cid, None, str(e))
                        current, asm = None, None
                elif kind == "error":
                    self._resolve(conn, int(m.error.request_id), int(m.error.cid), None,
                                  m.error.message or "error without a message")
                elif kind == "hello":
                    raise codec.WireError("a second hello on the same oracle stream")
            self.detach(conn, "closed its stream")
        except codec.WireError as e:
            self.detach(conn, f"sent a malformed stream ({e})")
        except Exception as e:  # the transport ended (cancelled, reset): fail its requests, keep serving
            self.detach(conn, f"stream ended ({type(e).__name__})")


def _fail(fut: Future[Gradient], err: BaseException) -> None:
    if not fut.done():
        fut.set_exception(err)
