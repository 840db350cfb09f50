"""Turn a run-directory ``Snapshot`` into the API's response models.

Pure functions of a snapshot and the current time, so they are unit-testable without a server. Raw JSON
values go through the coercion helpers of ``records`` (bad values become null, never a 500).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fedent.runlog import PHASES, ROUND_BASE, one_based, redact
from server.dashboard.models import (
    ClientOut,
    ClientsOut,
    ConfigOut,
    EstimatorOut,
    PartitionOut,
    RoundOut,
    RoundsPage,
    StatusOut,
    TrajectoryPoint,
)
from server.dashboard.records import free_json, integer, mapping, num, round_row, round_rows, text, timestamp
from server.dashboard.rundir import Snapshot

__all__ = ["free_json", "integer", "mapping", "num", "round_row", "round_rows", "text", "timestamp"]  # re-exported

ACTIVE_PHASES = ("starting", "estimating", "training", "aggregating", "evaluating")
DOWN_STATES = ("failed", "lost", "dead", "error", "disconnected", "evicted")
UNATTACHED_STATES = ("waiting", "pending", "unassigned")
# Client health once the run is over, by the run's phase (a client that is down stays down).
ENDED_HEALTH = {"done": "finished", "failed": "stopped", "stopped": "stopped"}
HEALTHS = ("ok", "stale", "down", "unknown", "finished", "stopped")
REDACTED = "***"
# Wider than fedent.runlog's writer-side list: the dashboard also hides any key that names key material.
_SECRET_KEY = re.compile(r"token|secret|passw|key|credential|cert_?pem|auth", re.IGNORECASE)


# ---- rounds ---------------------------------------------------------------------------------------------

def build_rounds(snap: Snapshot, offset: int, limit: int) -> RoundsPage:
    rows = snap.rounds
    return RoundsPage(total=len(rows), offset=offset, limit=limit, items=rows[offset:offset + limit])


# ---- status ---------------------------------------------------------------------------------------------

def _round_durations(rows: list[RoundOut]) -> list[float]:
    walls = [r.wall_s for r in rows if r.wall_s is not None]
    if walls:
        return walls
    elapsed = [r.elapsed_s for r in rows if r.elapsed_s is not None]
    return [b - a for a, b in zip([0.0, *elapsed], elapsed, strict=False) if b >= a]


def _configured_rounds(snap: Snapshot) -> int | None:
    rounds = integer(mapping(snap.status).get("rounds"))
    if rounds is None:
        rounds = integer(mapping(mapping(snap.config).get("train")).get("rounds"))
    return rounds


def _phase(st: Mapping[str, Any], rounds: int | None, completed: int) -> str:
    phase = text(st.get("phase"))
    if phase in PHASES:
        return phase
    return "done" if rounds is not None and completed >= rounds > 0 else "unknown"


def build_phase(snap: Snapshot) -> str:
    """The run's phase as /api/status reports it (status.json's, else inferred from config and metrics)."""
    return _phase(mapping(snap.status), _configured_rounds(snap), len(snap.rounds))


def build_status(snap: Snapshot, now: float) -> StatusOut:
    st = one_based(dict(mapping(snap.status)))  # round 1..R, also for a status.json from before the marker
    cfg = mapping(snap.config)
    rows = snap.rounds
    completed = len(rows)
    rounds = _configured_rounds(snap)
    algorithm = text(st.get("algorithm")) or text(mapping(cfg.get("algorithm")).get("name"))
    if algorithm is None and rows:
        algorithm = rows[-1].algorithm
    phase = _phase(st, rounds, completed)
    cur = integer(st.get("round"))
    started, updated = timestamp(st.get("started_at")), timestamp(st.get("updated_at"))
    elapsed: float | None = None
    if started is not None:
        end = updated if phase in ("done", "failed", "stopped") and updated is not None else now
        elapsed = max(0.0, end - started)
    elif rows and rows[-1].elapsed_s is not None:
        elapsed = rows[-1].elapsed_s
    eta: float | None = None
    if phase == "done":
        eta = 0.0
    elif phase not in ("failed", "stopped") and rounds is not None:
        durations = _round_durations(rows)
        if durations:
            eta = max(0, rounds - completed) * (sum(durations) / len(durations))
    progress = min(1.0, completed / rounds) if rounds else (1.0 if phase == "done" else 0.0)
    state = mapping(st.get("state"))
    error = text(state.get("error")) if phase == "failed" else text(state.get("reason")) if phase == "stopped" else None
    train, data = mapping(cfg.get("train")), mapping(cfg.get("data"))
    return StatusOut(
        run_id=text(st.get("run_id")) or snap.run_id, algorithm=algorithm, phase=phase, round=cur, rounds=rounds,
        rounds_completed=completed, progress=progress, started_at=started, updated_at=updated,
        elapsed_s=elapsed, eta_s=eta, error=error,
        evaluation=text(state.get("evaluation")) or text(train.get("evaluation")) or ("server" if cfg else None),
        data_placement=text(data.get("placement")) or ("central" if cfg else None),
    )


# ---- clients --------------------------------------------------------------------------------------------

def _client_rows(raw: Any) -> list[Mapping[str, Any]]:
    """clients.json as rows: accepts {"clients": [...]}, a bare list, or a {cid: row} object."""
    if isinstance(raw, Mapping):
        inner = raw.get("clients")
        if isinstance(inner, list):
            raw = inner
        elif isinstance(inner, Mapping):
            raw = [{"cid": k, **mapping(v)} for k, v in inner.items()]
        else:
            return []
    if not isinstance(raw, list):
        return []
    return [r for r in raw if isinstance(r, Mapping)]


def _bytes(row: Mapping[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(sent, received, total): clients.json's "bytes" may be a total or a {sent, received} object.

    One row never contradicts itself: with both directions known the total *is* sent + received (a writer's
    differing "total" is ignored); with one direction known the other is unknown (null), not 0.
    """
    b = row.get("bytes")
    sent, recv = integer(row.get("bytes_sent")), integer(row.get("bytes_received"))
    total = integer(b)
    if isinstance(b, Mapping):
        sent = sent if sent is not None else integer(b.get("sent"))
        recv = recv if recv is not None else integer(b.get("received", b.get("recv")))
        total = integer(b.get("total"))
    elif isinstance(b, list) and len(b) == 2:
        sent, recv = integer(b[0]), integer(b[1])
    sent = None if sent is None or sent < 0 else sent
    recv = None if recv is None or recv < 0 else recv
    total = None if total is None or total < 0 else total
    if sent is not None and recv is not None:
        total = sent + recv
    elif total is None and (sent is not None or recv is not None):
        total = sent if sent is not None else recv
    return sent, recv, total


def _health(state: str | None, age: float | None, run_phase: str | None, stale_after_s: float, listed: bool) -> str:
    """ok, stale, down or unknown while the run is live; once it ended, a client not down is finished (the
    run completed) or stopped (the run failed): nobody is connected to a run that is over."""
    if state is not None and state.lower() in DOWN_STATES:
        return "down"
    if run_phase in ENDED_HEALTH:
        return ENDED_HEALTH[run_phase]
    run_active = run_phase in ACTIVE_PHASES
    if state is not None and state.lower() in UNATTACHED_STATES:
        return "unknown"  # listed, but no worker has claimed it yet
    if age is not None and run_active and age > stale_after_s:
        return "stale"
    return "ok" if listed else "unknown"


def build_clients(snap: Snapshot, now: float, stale_after_s: float = 30.0) -> ClientsOut:
    """clients.json rows, with participation and η filled in from metrics.jsonl where the file lacks them."""
    rows = snap.rounds
    participation: dict[int, int] = {}
    last_eta: dict[int, tuple[float | None, float | None]] = {}
    for r in rows:
        for cid in r.clients:
            participation[cid] = participation.get(cid, 0) + 1
        if r.fedent is not None:
            for d in r.fedent.clients:
                last_eta[d.client] = (d.eta, d.eta_star)
    part = mapping(snap.partition)
    raw_sizes = part.get("sizes")
    sizes: list[Any] = raw_sizes if isinstance(raw_sizes, list) else []
    listed: dict[int, Mapping[str, Any]] = {}
    for listed_row in _client_rows(snap.clients):
        key = integer(listed_row.get("cid", listed_row.get("client", listed_row.get("id"))))
        if key is not None:
            listed[key] = listed_row
    n_part = integer(part.get("num_clients")) or len(sizes)
    cids = sorted(set(listed) | set(participation) | set(last_eta) | set(range(n_part or 0)))
    run_phase = build_phase(snap)
    out = []
    for cid in cids:
        row: Mapping[str, Any] = listed.get(cid, {})
        state = text(row.get("state"))
        hb = timestamp(row.get("last_heartbeat"))
        age = max(0.0, now - hb) if hb is not None else None
        sent, recv, total = _bytes(row)
        m_eta, m_eta_star = last_eta.get(cid, (None, None))
        eta, eta_star = num(row.get("eta")), num(row.get("eta_star"))
        samples = integer(row.get("samples"))
        if samples is None and 0 <= cid < len(sizes):
            samples = integer(sizes[cid])
        out.append(ClientOut(
            cid=cid, worker=text(row.get("worker")), state=state,
            health=_health(state, age, run_phase, stale_after_s, cid in listed), device=text(row.get("device")),
            samples=samples, participation=integer(row.get("participation")) or participation.get(cid, 0),
            bytes_sent=sent, bytes_received=recv, bytes_total=total,
            eta=eta if eta is not None else m_eta, eta_star=eta_star if eta_star is not None else m_eta_star,
            last_heartbeat=hb, heartbeat_age_s=age, data_source=text(row.get("data_source")),
            last_failure=text(row.get("last_failure")),
        ))
    source = "clients.json" if listed else ("metrics.jsonl" if out else "none")
    return ClientsOut(source=source, clients=out)


# ---- estimator ------------------------------------------------------------------------------------------

def _pick(d: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


def build_estimator(snap: Snapshot) -> EstimatorOut:
    """estimator.json's trajectory overlaid with what each round actually recorded in metrics.jsonl."""
    est = mapping(snap.estimator)
    points: dict[int, TrajectoryPoint] = {}
    traj = est.get("trajectory")
    shift = 0 if est.get("round_base") == ROUND_BASE else 1  # an estimator.json from before: rounds from 0
    if isinstance(traj, list):
        for i, p in enumerate(traj):
            p = mapping(p)
            r = integer(_pick(p, "round", "t"))
            r = i + shift if r is None else r + shift
            points[r] = TrajectoryPoint(
                round=r, phi2_pred=num(_pick(p, "phi2_pred", "predicted", "phi2")),
                phi2_actual=num(_pick(p, "phi2_actual", "actual")), entropy=num(p.get("entropy")),
                guards=integer(p.get("guards")),
            )
    for row in snap.rounds:
        f = row.fedent
        if f is None:
            continue
        old = points.get(row.round, TrajectoryPoint(round=row.round))
        points[row.round] = TrajectoryPoint(
            round=row.round,
            phi2_pred=f.phi2_pred if f.phi2_pred is not None else old.phi2_pred,
            phi2_actual=f.phi2_actual if f.phi2_actual is not None else old.phi2_actual,
            entropy=f.entropy if f.entropy is not None else old.entropy,
            guards=f.guards if f.guards is not None else old.guards,
        )
    report = free_json({k: v for k, v in est.items() if k not in ("trajectory", "round_base")})
    inner = report.pop("report", None)
    if isinstance(inner, dict):
        report = {**report, **inner}
    mode = text(report.get("mode")) or text(mapping(mapping(snap.config).get("algorithm")).get("estimator"))
    return EstimatorOut(
        available=bool(points) or bool(report), mode=mode,
        trajectory=[points[k] for k in sorted(points)], report=report,
    )


# ---- config and partition ---------------------------------------------------------------------------------

def redact_config(obj: Any, prefix: str = "") -> tuple[Any, list[str]]:
    """Hide values under secret-looking keys and any PEM block; return the copy and the dotted keys hidden."""
    hidden: list[str] = []
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if _SECRET_KEY.search(str(k)) and v is not None and not isinstance(v, (Mapping, bool)):
                out[str(k)] = REDACTED
                hidden.append(path)
            else:
                out[str(k)], sub = redact_config(v, path)
                hidden += sub
        return out, hidden
    if isinstance(obj, list):
        items = []
        for i, v in enumerate(obj):
            red, sub = redact_config(v, f"{prefix}[{i}]")
            items.append(red)
            hidden += sub
        return items, hidden
    if isinstance(obj, str) and "-----BEGIN" in obj:
        return REDACTED, [prefix]
    return obj, hidden


def build_config(snap: Snapshot) -> ConfigOut:
    if not isinstance(snap.config, Mapping):
        return ConfigOut(available=False, config={})
    cleaned, hidden = redact_config(redact(free_json(snap.config)))
    return ConfigOut(available=True, config=cleaned, redacted=hidden)


def build_partition(snap: Snapshot) -> PartitionOut:
    p = mapping(snap.partition)
    counts_raw = p.get("label_counts")
    counts: list[list[int]] = []
    if isinstance(counts_raw, list):
        for row in counts_raw:
            if not isinstance(row, list):
                counts = []
                break
            counts.append([max(0, integer(v) or 0) for v in row])
    if counts and len({len(r) for r in counts}) != 1:
        counts = []  # ragged: not a matrix, do not draw a lie
    sizes_raw = p.get("sizes")
    sizes = [max(0, integer(v) or 0) for v in sizes_raw] if isinstance(sizes_raw, list) else []
    if not sizes and counts:
        sizes = [sum(r) for r in counts]
    num_classes = integer(p.get("num_classes")) or (len(counts[0]) if counts else 0)
    return PartitionOut(
        available=bool(p), scheme=text(p.get("scheme")), seed=integer(p.get("seed")),
        num_clients=integer(p.get("num_clients")) or len(counts) or len(sizes), num_classes=num_classes,
        md5=text(p.get("md5")), sizes=sizes, label_counts=counts,
    )
