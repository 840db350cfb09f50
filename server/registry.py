"""The aggregator's worker registry: who hosts which clients, who is alive, and who may act for whom.

Register, Ready (with the worker-local data it reports), the Work stream's attach and detach, heartbeats
and their expiry: every change happens under one lock and wakes whoever waits on ``changed`` (the engine
waiting for its workers, a retry waiting for live clients). One ownership check (``own``) answers every
submission: with authentication a worker acts only for itself and its own clients. With a client map
(``settings.clients_file``, fedentrpc.security.client_map) a client may only ever be registered by the
identity mapped to it; without one, by the first identity to register it while that worker is live.
A worker that goes away tells the remote executor (``on_gone``), which fails its clients in the phase
waiting on them. No gRPC here.

Why ~400 lines in one module: register, ready, heartbeats and retirement read and write the same three
tables (workers, owners, reported client data) under one lock; apart they would need that lock shared.
"""

from __future__ import annotations

import hmac
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fedent.rounds.clients import ClientBook
from fedent.rounds.retry import retry_order
from fedentrpc.security.client_map import load_client_map
from server.settings import AggregatorSettings
from server.work import ClusterError, Registration, Task, WorkerHandle

security_log = logging.getLogger("fedent.security")

RPC_THREADS_SPARE = 4  # server threads kept free for unary calls while every Work stream holds one


class WorkerRegistry:
    """The workers of one run and the clients they host; its methods are called from RPC threads."""

    book: ClientBook  # clients.json, and the run's stop flag: the engine's, given by ``bind``
    stop: threading.Event

    def __init__(self, settings: AggregatorSettings, sizes: list[int], md5: str, local_data: bool, num_classes: int,
                 seed: int, run_key: str, worker_config: Mapping[str, Any]) -> None:
        self.settings, self.sizes, self.md5, self.local_data = settings, sizes, md5, local_data
        self.num_classes, self.seed = num_classes, seed
        self.run_key, self.worker_config = run_key, worker_config
        self.reported: dict[int, dict[str, Any]] = {}  # cid -> label_counts, data_source, num_test_samples
        self.workers: dict[str, WorkerHandle] = {}
        self.owner: dict[int, str] = {}  # cid -> worker id
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.finished = threading.Event()  # the run is over: registrations are refused
        self.error: str | None = None
        self.on_gone: Callable[[WorkerHandle, str], None] = lambda w, why: None  # the executor fails its tasks
        self.on_waiting: Callable[[int, int], None] = lambda hosted, total: None  # status while waiting
        # cid -> the only identity that may host it (the aggregator's client map), None: first come
        self.client_map: dict[int, str] | None = (load_client_map(settings.clients_file, len(sizes))
                                                  if settings.clients_file else None)
        self.done: Callable[[], bool] = lambda: False  # the rounds are over (clients show finished, not gone)

    def bind(self, book: ClientBook, stop: threading.Event) -> None:
        self.book, self.stop = book, stop

    def live_workers(self) -> int:
        with self.lock:
            return sum(1 for w in self.workers.values() if not w.gone)

    def close(self, error: str | None) -> None:
        """The run ended (``error`` says why it failed): refuse registrations and end every Work stream."""
        self.error = error
        self.finished.set()
        with self.lock:
            for w in self.workers.values():
                w.tasks.put(None)

    @staticmethod
    def deny(action: str, identity: str, claimed: str, why: str) -> ClusterError:
        """A PERMISSION_DENIED error, logged with the call, the caller's identity and what it claimed."""
        security_log.warning("denied %s by worker %s (claimed %s): %s", action, identity, claimed, why)
        return ClusterError("permission", f"worker {identity} may not act for {claimed}: {why}")

    def register(self, name: str, token: str, cids: Sequence[int], device: str, hostname: str,
                 identity: str | None = None) -> Registration:
        """``identity``: the worker the call's credentials name (None without authentication). With one, the
        registration's name is that identity: a request naming a worker registered under another identity is
        denied, any other requested name (a display label such as ``host-pid-c0``) is replaced by it. Clients
        held by a live worker of another identity are denied instead of being a conflict, and a
        re-registration retires only the caller's own old registration."""
        if identity is not None:
            if name and name != identity:
                with self.lock:
                    claimed = any(w.identity == name or w.name == name for w in self.workers.values())
                if claimed:
                    raise self.deny("Register", identity, name, "that worker is registered by other credentials")
                security_log.info("worker %s registers as itself, not as %r (the name is its credentials')",
                                  identity, name)
            name = identity
        if self.settings.token and not hmac.compare_digest(token.encode(), self.settings.token.encode()):
            raise ClusterError("unauthenticated", "bad or missing registration token")
        if self.finished.is_set():
            raise ClusterError("precondition", f"the run is over ({self.error or 'finished'}); nothing to do")
        wanted = tuple(sorted(int(c) for c in cids))
        if not wanted:
            raise ClusterError("invalid", "a worker must host at least one client")
        if len(set(wanted)) != len(wanted):
            raise ClusterError("invalid", "duplicate client ids")
        bad = [c for c in wanted if not 0 <= c < len(self.sizes)]
        if bad:
            raise ClusterError("invalid", f"client ids {bad[:5]} out of range [0, {len(self.sizes)})")
        self._check_map(wanted, identity)
        with self.lock:
            live = sum(1 for w in self.workers.values() if not w.gone)
            if live + RPC_THREADS_SPARE >= self.settings.max_workers:
                raise ClusterError("exhausted", f"{live} workers already hold the aggregator's "
                                                f"{self.settings.max_workers} RPC threads; raise max_workers")
            stale = {self.owner[c] for c in wanted if c in self.owner and not self.workers[self.owner[c]].gone}
            for wid in stale:  # a worker reconnecting before its old stream was noticed to be dead
                old = self.workers[wid]
                if name and old.name == name and old.cids == wanted and old.identity == identity:
                    self.retire(old, "disconnected", "worker re-registered")
            taken = [c for c in wanted if c in self.owner and not self.workers[self.owner[c]].gone]
            foreign = [c for c in taken if identity is not None and self.workers[self.owner[c]].identity != identity]
            if foreign:
                raise self.deny("Register", identity or "?", f"clients {foreign[:5]}",
                                 "they are hosted by another worker")
            if taken:
                raise ClusterError("conflict", f"clients {taken[:5]} are already hosted by a live worker")
            wid = f"w-{uuid.uuid4().hex[:10]}"
            self.workers[wid] = WorkerHandle(wid, name or wid, wanted, device, hostname, identity)
            for c in wanted:
                self.owner[c] = wid
                self.book.update([c], worker=name or wid, device=device, state="registered")
        self.book.write()
        return Registration(wid, self.run_key, self.worker_config, self.md5, self.settings.transfer(),
                            self.settings.heartbeat_s, self.settings.download_encoding)

    def _check_map(self, wanted: Sequence[int], identity: str | None) -> None:
        """With a client map, every wanted client must be mapped to the caller's identity (PERMISSION_DENIED)."""
        if self.client_map is None:
            return
        if identity is None:
            raise self.deny("Register", "?", f"clients {list(wanted)[:5]}", "the aggregator's client map needs "
                            "worker authentication (tokens or mutual TLS) to tell whose clients these are")
        foreign: dict[str, list[int]] = {}
        for c in wanted:
            if self.client_map[c] != identity:
                foreign.setdefault(self.client_map[c], []).append(c)
        if foreign:
            owner, cids = next(iter(foreign.items()))
            raise self.deny("Register", identity, f"clients {cids[:5]}", f"clients {cids[:5]} are mapped to {owner} "
                            "by the aggregator's client map")

    def bound_identities(self) -> dict[int, str]:
        """cid -> the worker identity bound to it: the client map when there is one, else the identity of the
        live worker that registered it (clients without an authenticated host are left out). The estimator
        gets this with the offline job, so an Oracle stream only receives its own clients' gradient tasks."""
        if self.client_map is not None:
            return dict(self.client_map)
        with self.lock:
            out: dict[int, str] = {}
            for cid, wid in self.owner.items():
                w = self.workers[wid]
                if w.identity is not None and not w.gone:
                    out[cid] = w.identity
            return out

    def worker(self, worker_id: str, identity: str | None = None, action: str = "call") -> WorkerHandle:
        """The live registration ``worker_id``; with an ``identity``, only if that identity registered it."""
        with self.lock:
            w = self.workers.get(worker_id)
        if identity is not None and w is not None and w.identity != identity:
            raise self.deny(action, identity, worker_id, f"registered by {w.identity or 'an unauthenticated worker'}")
        if w is None or w.gone:
            raise ClusterError("not_found", f"unknown worker {worker_id!r}; register first")
        w.last_seen = time.time()
        return w

    def mark_ready(self, worker_id: str, md5: str, sizes: dict[int, int], identity: str | None = None,
                   details: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        w = self.worker(worker_id, identity, "Ready")
        if self.local_data:
            self._accept_local(w, sizes, details or {})
        elif md5 != self.md5:
            raise ClusterError("precondition", f"partition md5 {md5} differs from the aggregator's {self.md5}; "
                                               "same data, config and seed are needed")
        for cid in ([] if self.local_data else w.cids):
            if sizes.get(cid) != self.sizes[cid]:
                raise ClusterError("precondition", f"client {cid} has {sizes.get(cid)} samples, expected "
                                                   f"{self.sizes[cid]}")
        with self.changed:
            w.ready = True
            for c in w.cids:
                self.book.update([c], state="idle", last_heartbeat=time.time())
            self.changed.notify_all()
        self.book.write()

    def _accept_local(self, w: WorkerHandle, sizes: dict[int, int], details: Mapping[int, Mapping[str, Any]]) -> None:
        """Worker-local data: the reported sample counts become the clients' sizes (every sample-weighted rule
        uses them), with the label histogram and data source for the dashboard. An empty client, a count for a
        client the worker does not host or a histogram that does not add up is refused."""
        num_classes = int(self.num_classes or 0)
        for cid in w.cids:
            n = sizes.get(cid)
            if n is None or n <= 0:
                raise ClusterError("invalid", f"client {cid}: {n or 0} samples reported; a client needs at least one")
            d = details.get(cid, {})
            counts = [int(v) for v in d.get("label_counts") or []]
            if counts and (sum(counts) != n or (num_classes and len(counts) != num_classes) or min(counts) < 0):
                raise ClusterError("invalid", f"client {cid}: label histogram {counts[:12]} does not match "
                                              f"{n} samples over {num_classes} classes")
        extra = sorted(set(sizes) - set(w.cids))
        if extra:
            raise ClusterError("invalid", f"sizes reported for clients {extra[:5]} this worker does not host")
        with self.lock:
            for cid in w.cids:
                self.sizes[cid] = int(sizes[cid])
                d = details.get(cid, {})
                self.reported[cid] = {"label_counts": [int(v) for v in d.get("label_counts") or []],
                                      "data_source": str(d.get("data_source", "")),
                                      "num_test_samples": int(d.get("num_test_samples", 0))}
                self.book.update([cid], samples=int(sizes[cid]), data_source=self.reported[cid]["data_source"]
                                 or "worker", label_counts=self.reported[cid]["label_counts"] or None)

    def attach(self, worker_id: str, identity: str | None = None) -> WorkerHandle:
        w = self.worker(worker_id, identity, "Work")
        with self.lock:
            if w.streaming:
                raise ClusterError("conflict", f"worker {worker_id} already has an open work stream")
            w.streaming = True
        return w

    def detach(self, w: WorkerHandle) -> None:
        """A worker's Work stream ended: it is gone, and its outstanding clients fail now, not at the deadline."""
        with self.changed:
            w.streaming = False
            if w.gone:  # already retired (missed heartbeats, replaced by its re-registration)
                return
            w.gone = True
            self.changed.notify_all()
            for c in w.cids:
                self.book.update([c], state="finished" if self.finished.is_set() or self.done()
                                 else "disconnected")
        self.on_gone(w, "worker disconnected")
        self.book.write()

    def retire(self, w: WorkerHandle, state: str, why: str) -> None:
        """Mark ``w`` gone (clients ``state`` in clients.json), fail its open tasks now and end its Work stream."""
        with self.changed:
            if w.gone:
                return
            w.gone = True
            self.changed.notify_all()
            for c in w.cids:
                self.book.update([c], state=state)
        self.on_gone(w, why)
        w.tasks.put(None)

    def expire_silent_workers(self, now: float | None = None) -> list[str]:
        """Workers silent for ``heartbeat_misses`` heartbeat periods are dead: their clients go ``down`` and
        the round stops waiting for them (a hung but connected worker never closes its stream).

        Registered but never Ready workers expire by the same limit (their last sign of life is the Register,
        or the heartbeats a worker sends while it loads its data): one killed between Register and Ready has
        no Work stream whose end would retire it, and would otherwise hold its clients until the register
        timeout fails the run, refusing its own restart (``conflict``)."""
        if self.settings.heartbeat_misses <= 0:
            return []
        limit = self.settings.heartbeat_misses * self.settings.heartbeat_s
        now = time.time() if now is None else now
        with self.lock:
            silent = [w for w in self.workers.values() if not w.gone and now - w.last_seen > limit]
        for w in silent:
            self.retire(w, "down", f"missed heartbeats for {now - w.last_seen:.1f}s")
        if silent:
            self.book.write()
        return [w.worker_id for w in silent]

    def watch_heartbeats(self) -> None:
        period = max(0.05, min(1.0, self.settings.heartbeat_s / 2))
        while not self.finished.wait(period):
            self.expire_silent_workers()

    def heartbeat(self, worker_id: str, identity: str | None = None) -> bool:
        with self.lock:
            w = self.workers.get(worker_id)
        if identity is not None and w is not None and w.identity != identity:
            raise self.deny("Heartbeat", identity, worker_id,
                             f"registered by {w.identity or 'an unauthenticated worker'}")
        if w is None or w.gone:
            return False
        w.last_seen = time.time()
        self.book.update(w.cids, last_heartbeat=w.last_seen)
        return True

    def own(self, worker_id: str, cids: Iterable[int], identity: str | None = None,
            action: str = "call") -> WorkerHandle:
        """The one ownership check of a submission, before anything else is looked at: ``worker_id`` is a live
        registration (of ``identity``, with authentication) hosting every one of ``cids``."""
        w = self.worker(worker_id, identity, action)
        foreign = [c for c in cids if c not in w.cids]
        if foreign and identity is not None:
            raise self.deny(action, identity, f"client {foreign[0]}", f"not hosted by its worker {worker_id}")
        if foreign:
            raise ClusterError("precondition", f"client {foreign[0]} is not hosted by worker {worker_id}")
        return w

    def wait_for_workers(self) -> None:
        """Block (event-driven) until every client is hosted by a ready worker; status.json shows the count."""
        deadline = time.monotonic() + self.settings.register_timeout_s
        shown = -1
        with self.changed:
            while not self.stop.is_set():
                missing = [c for c in range(len(self.sizes)) if not self.hosted(c)]
                if not missing:
                    return
                if len(missing) != shown:
                    shown = len(missing)
                    self.on_waiting(len(self.sizes) - shown, len(self.sizes))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{len(missing)} clients (e.g. {missing[:5]}) have no ready worker after "
                                       f"{self.settings.register_timeout_s:.0f}s")
                self.changed.wait(timeout=left)
        raise RuntimeError("stopped")

    def hosted(self, cid: int) -> bool:
        wid = self.owner.get(cid)
        return wid is not None and self.workers[wid].ready and not self.workers[wid].gone

    def retry_clients(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        """Fresh participants for retry ``attempt`` of round ``rnd``: the first ``k`` clients hosted by a live
        worker in the core's retry stream (fedent.rounds.retry, the simulator's too). Waits (event-driven, up
        to one round deadline) until enough clients for a quorum are hosted, so a worker that is reconnecting
        can rejoin. The stream is deterministic; which clients are live is not (that is the fault handled)."""
        order = retry_order(self.seed, rnd, attempt, len(self.sizes), exclude)
        need = max(1, math.ceil(self.settings.quorum * k))
        deadline = time.monotonic() + self.settings.round_deadline_s
        with self.changed:
            while True:
                live = [c for c in order if self.hosted(c)]
                left = deadline - time.monotonic()
                if len(live) >= need or left <= 0 or self.stop.is_set():
                    return sorted(live[:k])
                self.changed.wait(timeout=left)

    def shutdown_workers(self, reason: str, failed: bool) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.tasks.put(Task("shutdown", 0, -1, (), reason=reason, failed=failed))

    def reported_partition(self) -> dict[str, Any]:
        """partition.json's fields from what the workers reported (label histograms where every client sent one)."""
        with self.lock:
            rows = [self.reported.get(c, {}) for c in range(len(self.sizes))]
        counts = [r.get("label_counts") or [] for r in rows]
        info: dict[str, Any] = {"sources": [r.get("data_source", "") for r in rows],
                                "test_sizes": [int(r.get("num_test_samples", 0)) for r in rows]}
        if all(counts):
            info["label_counts"] = counts
        return info
