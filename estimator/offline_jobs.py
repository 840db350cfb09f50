"""FedEnt offline mode on the service: Algorithm 1 (fedent.meanfield.fixed_point) with remote gradients.

``OfflineJobs`` runs each StartOffline request in a background thread and answers long polls; the gradients
Algorithm 1 needs come from the workers through ``estimator.rpc_oracle.RpcGradientOracle``.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from estimator.blobs import BlobStore
from estimator.hub import OracleHub
from estimator.rpc_oracle import JobCancelled, OracleFailure, OracleSettings, RpcGradientOracle
from fedent import runlog
from fedent.meanfield.fixed_point import solve_fixed_point
from fedent.params import Params
from fedent.strategies.options import FedEntOptions
from fedentrpc import codec, mappers
from fedentrpc.v1 import estimator_pb2 as est_pb

log = logging.getLogger("fedent.estimator")


@dataclass(frozen=True)
class OfflineSpec:
    """A validated StartOffline request."""

    run_id: str
    w0: Params
    client_ids: tuple[int, ...]
    thetas: tuple[float, ...]
    rounds: int
    options: FedEntOptions  # beta, gamma, variant, eta_max, phi2_rate and Algorithm 1's eps1, eps2, max_sweeps
    schedule: tuple[tuple[int, ...], ...] | None  # round t's sampled clients (spec §5 "one θ"); None: all
    base_lr: float  # η_i(−1)
    seed: int
    batch_size: int
    wait_workers_s: float
    owners: dict[int, str] = field(default_factory=dict)  # cid -> the only worker identity that may host it


def spec_from_request(req: est_pb.StartOfflineRequest, blobs: BlobStore, default_wait_s: float) -> OfflineSpec:
    """Validate a StartOffline request (ValueError with a one-line message on bad input)."""
    if not req.init_blob:
        raise ValueError("init_blob is empty: upload w(0) with PutBlob first")
    bundle = blobs.decode(req.init_blob)
    w0 = bundle.get(codec.PARAMS_GROUP)
    if not w0:
        raise ValueError(f"blob {req.init_blob!r} carries no {codec.PARAMS_GROUP!r} tensors")
    if not all(t.is_floating_point() for t in w0):
        raise ValueError("w(0) must hold floating-point tensors")
    if not all(bool(torch.isfinite(t).all()) for t in w0):
        raise ValueError("w(0) holds non-finite values")
    if not req.clients:
        raise ValueError("no clients given")
    cids = [int(c.cid) for c in req.clients]
    if len(set(cids)) != len(cids):
        raise ValueError("duplicate client ids")
    if any(c < 0 for c in cids):
        raise ValueError("client ids must be >= 0")
    sizes = [int(c.num_samples) for c in req.clients]
    if any(n < 0 for n in sizes):
        raise ValueError("num_samples must be >= 0")
    total = float(sum(sizes))
    if total <= 0:
        raise ValueError("the clients hold no samples")
    # θ ∝ D_i (renormalised over each round's schedule when one is sent, spec §5); clients without samples
    # take no part, as in FedEnt.prepare.
    kept = [(c, n / total) for c, n in zip(cids, sizes, strict=True) if n > 0]
    options = mappers.fedent_options_from_msg(req.params)  # the run's FedEntOptions, whole
    if req.rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {req.rounds}")
    if req.batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {req.batch_size}")
    if req.wait_workers_s < 0 or req.wait_workers_s != req.wait_workers_s:
        raise ValueError("wait_workers_s must be >= 0")
    schedule = None
    if req.schedule:  # spec §5: round t simulates its sampled clients, θ over them (those holding samples)
        if len(req.schedule) < req.rounds:
            raise ValueError(f"schedule names {len(req.schedule)} rounds, need {req.rounds}")
        known, held = set(cids), {c for c, _ in kept}
        for t, r in enumerate(req.schedule[: req.rounds]):
            unknown = sorted(set(r.cids) - known)
            if unknown:
                raise ValueError(f"schedule round {t} names unknown client(s) {unknown[:10]}")
        schedule = tuple(tuple(c for c in r.cids if c in held) for r in req.schedule[: req.rounds])
        if any(not r for r in schedule):
            raise ValueError("every round of the schedule needs a client that holds samples")
    if not (math.isfinite(req.base_lr) and req.base_lr >= 0):
        raise ValueError(f"base_lr must be >= 0, got {req.base_lr}")
    if options.phi2_rate == "used" and req.base_lr <= 0:
        raise ValueError("phi2_rate used needs base_lr (η_i(−1), the run's base rate) > 0")
    return OfflineSpec(
        run_id=req.run_id, w0=list(w0),
        client_ids=tuple(c for c, _ in kept), thetas=tuple(th for _, th in kept), rounds=int(req.rounds),
        options=options, schedule=schedule, base_lr=float(req.base_lr),
        seed=int(req.seed), batch_size=int(options.probe_batch_size or req.batch_size),
        wait_workers_s=float(req.wait_workers_s or default_wait_s),
        owners={int(c.cid): c.owner for c in req.clients if c.owner},
    )


@dataclass
class OfflineJob:
    job_id: str
    run_id: str
    state: str = "pending"  # pending | running | done | failed
    sweep: int = 0
    message: str = ""
    phi2: list[float] = field(default_factory=list)
    stop_reason: str = ""
    report: dict[str, Any] = field(default_factory=dict)

    def to_msg(self) -> est_pb.OfflineJob:
        return est_pb.OfflineJob(job_id=self.job_id, state=mappers.job_state_to_msg(self.state), sweep=self.sweep,
                                 message=self.message, phi2=self.phi2,
                                 stop_reason=mappers.stop_reason_to_msg(self.stop_reason),
                                 report=mappers.dict_to_struct(runlog.jsonable(self.report), "report"))

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "run_id": self.run_id, "state": self.state, "sweep": self.sweep,
                "message": self.message, "phi2": self.phi2, "stop_reason": self.stop_reason, "report": self.report}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OfflineJob:
        return cls(job_id=str(d["job_id"]), run_id=str(d.get("run_id", "")), state=str(d["state"]),
                   sweep=int(d.get("sweep", 0)), message=str(d.get("message", "")),
                   phi2=[float(v) for v in d.get("phi2", [])], stop_reason=str(d.get("stop_reason", "")),
                   report=dict(d.get("report") or {}))


class JobNotFound(KeyError):
    def __str__(self) -> str:
        return f"unknown offline job {self.args[0]!r}"


def _stop_reason(core_reason: str) -> str:
    """The proto's vocabulary: Algorithm 1 stops when both tests pass ("both") or after max_sweeps."""
    return "both" if core_reason == "converged" else core_reason


class OfflineJobs:
    """Runs Algorithm 1 jobs in background threads; finished jobs are persisted under ``run_dir``."""

    def __init__(self, hub: OracleHub, blobs: BlobStore, oracle_timeout_s: float, oracle_retries: int,
                 prefetch: int, run_dir: str | None = None) -> None:
        self.hub = hub
        self.blobs = blobs
        self.timeout_s = oracle_timeout_s
        self.retries = oracle_retries
        self.prefetch = prefetch
        self.dir = Path(run_dir) / "estimator-jobs" if run_dir else None
        self._jobs: dict[str, OfflineJob] = {}
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._cancel = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, spec: OfflineSpec) -> OfflineJob:
        self.hub.bind_owners(spec.run_id, spec.owners)  # before any routing: only owners get their clients' tasks
        with self._cond:
            job = OfflineJob(f"job-{int(time.time())}-{next(self._ids)}", spec.run_id)
            self._jobs[job.job_id] = job
        th = threading.Thread(target=self._run, args=(job, spec), name=f"offline-{job.job_id}", daemon=True)
        self._threads.append(th)
        th.start()
        return self.snapshot(job.job_id)

    def snapshot(self, job_id: str) -> OfflineJob:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None:
                job = self._load(job_id)
            return OfflineJob(**{**job.__dict__, "phi2": list(job.phi2), "report": dict(job.report)})

    def wait(self, job_id: str, wait_s: float) -> OfflineJob:
        """Long poll: the job once it is done or failed, or its state after ``wait_s`` seconds."""
        deadline = time.monotonic() + max(0.0, wait_s)
        with self._cond:
            while True:
                job = self._jobs.get(job_id)
                if job is None or job.state in ("done", "failed"):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        return self.snapshot(job_id)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        self._cancel.set()
        for th in self._threads:
            th.join(timeout_s)

    # ---- internals ---------------------------------------------------------------------------------
    def _update(self, job: OfflineJob, **changes: Any) -> None:
        with self._cond:
            for k, v in changes.items():
                setattr(job, k, v)
            self._cond.notify_all()

    def _run(self, job: OfflineJob, spec: OfflineSpec) -> None:
        oracle = RpcGradientOracle(
            self.hub, self.blobs, spec.run_id, spec.client_ids,
            OracleSettings(self.timeout_s, self.retries, self.prefetch, spec.seed, spec.batch_size),
            on_sweep=lambda k: self._update(job, sweep=k), cancelled=self._cancel, schedule=spec.schedule)
        try:
            self._update(job, state="running", message="waiting for the workers' oracle streams")
            missing = self.hub.wait_hosts(spec.client_ids, spec.run_id, spec.wait_workers_s)
            if missing:
                shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
                raise OracleFailure(f"no worker opened an oracle stream for client(s) {shown} within "
                                    f"{spec.wait_workers_s:g}s")
            self._update(job, message="sweeping")
            t0 = time.perf_counter()
            o = spec.options
            res = solve_fixed_point(oracle, spec.w0, spec.client_ids, spec.thetas, spec.rounds, o.beta, o.variant,
                                    o.eps1, o.eps2, o.max_sweeps, schedule=spec.schedule, eta_max=o.eta_max,
                                    phi2_rate=o.phi2_rate, gamma=o.gamma, base_lr=spec.base_lr)
            report = {"phi2": [float(v) for v in res.phi2], **res.report.to_dict(), "mode": "offline",
                      "offline_clients": "population" if spec.schedule is None else "participants",
                      "phi2_rate": o.phi2_rate, "eta_max": o.eta_max,
                      "wall_s": time.perf_counter() - t0, "oracle_retries": oracle.retries_used,
                      "clients": len(spec.client_ids)}
            self._update(job, state="done", sweep=res.report.sweeps, phi2=[float(v) for v in res.phi2],
                         stop_reason=_stop_reason(res.report.stop_reason), report=report,
                         message=f"{res.report.stop_reason} after {res.report.sweeps} sweep(s)")
            log.info("offline job %s done: %s", job.job_id, job.message)
        except (OracleFailure, JobCancelled, ValueError) as e:
            self._update(job, state="failed", message=str(e))
            log.error("offline job %s failed: %s", job.job_id, e)
        except Exception as e:  # a bug must fail the job visibly, not hang the aggregator's long poll
            log.exception("offline job %s crashed", job.job_id)
            self._update(job, state="failed", message=f"{type(e).__name__}: {e}")
        finally:
            oracle.close()
            self._save(job)

    def _save(self, job: OfflineJob) -> None:
        if self.dir is None:
            return
        try:
            runlog.atomic_write_json(self.dir / f"{job.job_id}.json", self.snapshot(job.job_id).to_dict())
        except OSError as e:
            log.warning("cannot persist offline job %s: %s", job.job_id, e)

    def _load(self, job_id: str) -> OfflineJob:
        """A finished job from an earlier process (``run_dir``), else JobNotFound."""
        safe = job_id.replace("/", "").replace("\\", "").replace("..", "")
        if self.dir is not None and safe == job_id and job_id:
            raw = runlog.read_json(self.dir / f"{job_id}.json")
            if isinstance(raw, dict):
                try:
                    job = OfflineJob.from_dict(raw)
                except (KeyError, TypeError, ValueError):
                    raise JobNotFound(job_id) from None
                self._jobs[job_id] = job
                return job
        raise JobNotFound(job_id)
