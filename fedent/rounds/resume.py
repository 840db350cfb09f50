"""Checkpoint and resume of a run: the glue between ``fedent.rounds.engine.RoundEngine`` and ``fedent.checkpoint``.

With ``RoundPolicy.checkpoint_keep`` (the aggregator's default) the engine saves a checkpoint under
``runs/<id>/checkpoint/`` after every completed round; started again on the same run directory (same
config, checked by fingerprint) it continues from the next round.
Sampling and batch order are derived from (seed, round), so the resumed run computes exactly what an
uninterrupted one would — provided the workers restore their client state as of before the replayed
round (``fedent.client_store.ClientStateStore.load(cid, before_round=...)``).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from fedent import provenance, runlog
from fedent.checkpoint import (
    Checkpoint,
    config_fingerprint,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
)
from fedent.rounds.rundir import no_intact_checkpoint

if TYPE_CHECKING:
    from fedent.rounds.engine import RoundEngine

log = logging.getLogger("fedent.rounds")

# Per-client counters that survive a restart (worker/device/state come from the new registrations).
_CLIENT_COUNTERS = ("participation", "bytes", "eta", "eta_star", "last_round")


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_device(v, device) for v in obj]
    return obj


def save(run: RoundEngine, rnd: int, keep: int = 3) -> None:
    """Checkpoint ``run`` after round ``rnd`` completed."""
    rows = run.clients.snapshot()
    save_checkpoint(run.paths.checkpoint, Checkpoint(
        round=rnd,
        global_params=list(run.global_params),
        config_fingerprint=config_fingerprint(run.cfg),
        seed=int(run.seed),
        server_state=run.strategy.server_state(),
        estimator={"trajectory": json.loads(json.dumps(runlog.jsonable(run.trajectory))),
                   "round_base": runlog.ROUND_BASE},
        clients={"rows": json.loads(json.dumps(runlog.jsonable(rows)))},
        extra={"elapsed_s": time.perf_counter() - run.t_start, "run_id": run.paths.run_id,
               "provenance": run.provenance},
    ), keep=keep)


def _keep_rounds(run: RoundEngine, last: int) -> None:
    """Cut metrics.jsonl back to the loop's rounds <= ``last`` (logged as 1..last+1): the rounds after it are
    run, and logged, again. The lines kept are rewritten numbered as runlog writes them now."""
    kept = [r for r in runlog.read_metrics(run.paths.metrics) if isinstance(r.get("round"), int)
            and r["round"] <= last + 1]
    if kept or run.paths.metrics.exists():
        runlog.atomic_write_text(run.paths.metrics, "".join(
            json.dumps(runlog.jsonable(r), allow_nan=False, separators=(",", ":")) + "\n" for r in kept))
    run.records = kept


def resume(run: RoundEngine) -> int:
    """Restore ``run`` from its newest intact checkpoint; returns the first round to execute (0: fresh).

    Call after ``run.prepare()`` (the strategy's own setup runs first, then its saved state replaces it).
    metrics.jsonl is cut back to the checkpointed rounds, so a round that finished but was not yet
    checkpointed when the aggregator died is not logged twice.
    """
    ckpt = load_latest_checkpoint(run.paths.checkpoint, expect_fingerprint=config_fingerprint(run.cfg))
    if ckpt is None:
        found = list_checkpoints(run.paths.checkpoint)
        if found:  # never a silent restart at round 0 over a run that got further (rounds.rundir)
            raise no_intact_checkpoint(run.paths, [p.name for _, p in found])
        _keep_rounds(run, -1)  # a crash before the first checkpoint: round 0 is run (and logged) again
        return 0
    if ckpt.seed != run.seed:
        raise ValueError(f"checkpoint seed {ckpt.seed} differs from the run's {run.seed}")
    if ckpt.next_round > run.rounds:
        raise ValueError(f"checkpoint is past round {ckpt.round + 1} but the run has {run.rounds} rounds")
    shapes = [tuple(p.shape) for p in run.global_params]
    if [tuple(p.shape) for p in ckpt.global_params] != shapes:
        raise ValueError("checkpoint model shapes differ from the configured model")
    run.global_params = [p.to(run.device) for p in ckpt.global_params]
    run.strategy.load_server_state(_to_device(ckpt.server_state, run.device))
    run.trajectory = list(ckpt.estimator.get("trajectory", []))
    if ckpt.estimator.get("round_base") != runlog.ROUND_BASE:  # a checkpoint from before: points counted 0..
        run.trajectory = [runlog.one_based(p) if isinstance(p, dict) else p for p in run.trajectory]
    saved = {int(r["cid"]): r for r in ckpt.clients.get("rows", []) if isinstance(r, dict) and "cid" in r}
    with run.clients.lock:
        for row in run.clients.rows:
            old = saved.get(int(row["cid"]))
            if old:
                row.update({k: old[k] for k in _CLIENT_COUNTERS if k in old})
    _keep_rounds(run, ckpt.round)
    before = ckpt.extra.get("provenance")
    try:  # the previous process's, for a checkpoint older than provenance in checkpoints; never fatal
        last = runlog.read_json(run.paths.provenance, default=None)
    except (OSError, ValueError):
        last = None
    run.provenance = provenance.resumed(before if isinstance(before, dict) else None, run.provenance, ckpt.round + 1,
                                        fallback=last if isinstance(last, dict) else None)
    run.t_start = time.perf_counter() - float(ckpt.extra.get("elapsed_s", 0.0))
    if run.trajectory:
        old = runlog.read_json(run.paths.estimator, default={})
        report = old.get("report", {}) if isinstance(old, dict) else {}
        runlog.atomic_write_json(run.paths.estimator, {"algorithm": run.strategy.name, "report": report,
                                                       "round_base": runlog.ROUND_BASE,
                                                       "trajectory": run.trajectory})
    log.info("resumed %s from the checkpoint of round %d", run.paths.run_id, ckpt.round + 1)
    return ckpt.next_round
