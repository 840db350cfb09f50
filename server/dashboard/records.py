"""Untrusted run-file JSON -> typed values: coercion helpers and metrics.jsonl records as ``RoundOut`` rows.

Any JSON value may be missing, null, NaN or of the wrong type (a writer bug, a torn file, a hand edit), so
each value goes through a small helper and bad values become null instead of a 500.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from fedent.runlog import jsonable, one_based
from server.dashboard.models import FedentClientDiag, FedentRound, PrivacyRound, RoundOut


def num(x: Any) -> float | None:
    """A finite float, or None (bools, strings, NaN and inf are not numbers here)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def integer(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and math.isfinite(x) and x.is_integer():
        return int(x)
    return None


def text(x: Any) -> str | None:
    if isinstance(x, str):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return str(x)
    return None


def timestamp(x: Any) -> float | None:
    """Unix epoch seconds from a number or an ISO-8601 string (writers should use numbers)."""
    f = num(x)
    if f is not None:
        return f
    if isinstance(x, str):
        try:
            dt = datetime.fromisoformat(x.replace("Z", "+00:00"))
        except ValueError:
            return None
        return dt.timestamp()
    return None


def mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def free_json(x: Any) -> dict[str, Any]:
    """A free-form JSON object made safe to serve (NaN -> null); anything else -> {}."""
    if not isinstance(x, Mapping):
        return {}
    try:
        out = jsonable(x)
    except TypeError:
        return {}
    return out if isinstance(out, dict) else {}


# ---- metrics.jsonl records ------------------------------------------------------------------------------

def _fedent_round(raw: Any) -> FedentRound | None:
    if not isinstance(raw, Mapping):
        return None
    diags = []
    for c in raw.get("clients") or []:
        c = mapping(c)
        cid = integer(c.get("client"))
        if cid is None:
            continue
        nums = ("theta", "a", "b", "c", "phi2_next", "beta", "gamma", "eta_max", "eta_prev", "eta_star", "eta")
        diags.append(FedentClientDiag.model_validate({
            "client": cid, "variant": text(c.get("variant")), "phi2_rate": text(c.get("phi2_rate")),
            **{k: num(c.get(k)) for k in nums},
        }))
    return FedentRound(
        phi2_pred=num(raw.get("phi2_pred")), phi2_actual=num(raw.get("phi2_actual")),
        entropy=num(raw.get("entropy")), guards=integer(raw.get("guards")), eta_max=num(raw.get("eta_max")),
        phi2_rate=text(raw.get("phi2_rate")), clients=diags,
    )


def _privacy_round(raw: Any) -> PrivacyRound | None:
    if not isinstance(raw, Mapping):
        return None
    return PrivacyRound(dp=text(raw.get("dp")), epsilon=num(raw.get("epsilon")), delta=num(raw.get("delta")),
                        accountant=text(raw.get("accountant")), clip_norm=num(raw.get("clip_norm")))


def round_row(rec: Mapping[str, Any]) -> RoundOut | None:
    """One metrics.jsonl record as a typed row (None when it has no usable round number); rounds 1..R, a line
    from before the numbering was fixed is shifted (fedent.runlog.one_based)."""
    rec = one_based(dict(rec))
    r = integer(rec.get("round"))
    if r is None:
        return None
    clients = rec.get("clients")
    cids = [c for c in (integer(v) for v in clients) if c is not None] if isinstance(clients, list) else []
    return RoundOut(
        round=r, algorithm=text(rec.get("algorithm")),
        test_acc=num(rec.get("test_acc")), test_loss=num(rec.get("test_loss")), train_loss=num(rec.get("train_loss")),
        clients=cids, num_clients=integer(rec.get("num_clients")),
        wall_s=num(rec.get("wall_s")), elapsed_s=num(rec.get("elapsed_s")),
        fedent=_fedent_round(rec.get("fedent")), diagnostics=free_json(rec.get("diagnostics")),
        privacy=_privacy_round(rec.get("privacy")),
    )


def round_rows(metrics: list[dict[str, Any]]) -> list[RoundOut]:
    return [row for row in (round_row(m) for m in metrics) if row is not None]
