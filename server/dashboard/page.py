"""The live page, rendered with the run's state already in it, so its first paint shows data.

Without this the page painted dashes until its first ``fetch`` came back (a headless screenshot taken at
load showed none of the run). Now ``/`` carries:

* the header's numbers (run id, algorithm, rounds done, phase, elapsed, ETA, test accuracy, progress),
  rendered here as text, so even a client without JavaScript sees them;
* the same JSON the API would return (status, the first rounds page, clients, estimator, partition) in a
  ``<script type="application/json" id="initial-data">`` block: a data block is never executed, so the page's
  ``default-src 'self'`` policy still holds, and the page's script (``static/main.js`` and the ES modules it
  imports) draws the charts and the table from it before its first fetch.

With a token configured the page stays as open as before and so carries no run data: placeholders only,
and the page's script fetches with the token as it always did.

Either way the page carries the style of its two φ2 series (``<script type="application/json" id="phi2-style">``),
read from the core's ``fedent/phi2_style.json``, the file ``fedent plot`` draws the same series with: one style,
no copy of it in the page's JavaScript, and no fetch (it is there for the first paint, and is no run data).
"""

from __future__ import annotations

import html
import json
import math
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

from fedent.plot_data import phi2_style_json
from server.dashboard import views
from server.dashboard.models import PrivacyRound, StatusOut
from server.dashboard.rundir import Snapshot

DASH = "–"  # what the page shows for "no value"; static/format.js uses the same character
FIRST_ROUNDS = 1000  # rounds embedded in the page (the API's largest page); static/live.js fetches the rest by offset


@lru_cache(maxsize=4)
def _template(path: Path) -> Template:
    return Template(path.read_text(encoding="utf-8"))


# ---- the formatters of static/format.js, so the first paint and the live page read the same -------------------

def _js_fixed(v: float, digits: int) -> str:
    """``Number.prototype.toFixed``: the exact binary value, ties rounded up (Python's format rounds them to even)."""
    q = Decimal(v).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)  # half away from 0, as JS
    return f"{q:.{digits}f}"


def fmt_pct(v: float | None) -> str:
    return DASH if v is None else _js_fixed(100 * v, 1) + "%"


def fmt_epsilon(p: PrivacyRound | None) -> str:
    """The run's privacy so far (static/format.js ``fmtEpsilon``): ``off``, ``central ε 3.21``, ``local ε ∞``."""
    if p is None:
        return "off"
    return f"{p.dp or 'dp'} ε " + ("∞" if p.epsilon is None else _js_fixed(p.epsilon, 2))


def fmt_duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return DASH
    s = max(0.0, s)
    if s < 60:
        return _js_fixed(s, 1 if s < 10 else 0) + " s"
    h, m, sec = int(s // 3600), int((s % 3600) // 60), int(s % 60)
    return f"{h} h {m:02d} m" if h > 0 else f"{m} m {sec:02d} s"


def _pct_of(progress: float) -> float:
    """static/status.js: ``Math.round(1000 * progress) / 10``."""
    return math.floor(1000 * progress + 0.5) / 10


def _pct_text(pct: float) -> str:
    return str(int(pct)) if float(pct).is_integer() else str(pct)


def header_fields(status: StatusOut | None, last_acc: float | None,
                  privacy: PrivacyRound | None = None) -> dict[str, str]:
    """The header and progress line as static/status.js's ``renderStatus`` writes them (text, not yet HTML-escaped)."""
    if status is None:
        return {"run_id": DASH, "algorithm": DASH, "evaluation": DASH, "placement": DASH, "rounds_done": DASH,
                "rounds": DASH, "phase": DASH,
                "phase_attr": "unknown", "elapsed": DASH, "eta": DASH, "last_acc": DASH, "epsilon": DASH,
                "progress_pct": "0",
                "progress_text": DASH}
    s = status
    pct = _pct_text(_pct_of(s.progress))
    rounds = "?" if s.rounds is None else str(s.rounds)
    in_flight = s.round is not None and s.round > s.rounds_completed and s.phase not in ("done", "failed", "stopped")
    working = f" · round {s.round} {s.phase}" if in_flight else ""
    return {
        "run_id": s.run_id, "algorithm": s.algorithm or DASH, "rounds_done": str(s.rounds_completed),
        "evaluation": s.evaluation or DASH, "placement": s.data_placement or DASH,
        "rounds": rounds, "phase": s.phase, "phase_attr": s.phase, "elapsed": fmt_duration(s.elapsed_s),
        "eta": "done" if s.phase == "done" else fmt_duration(s.eta_s), "last_acc": fmt_pct(last_acc),
        "epsilon": fmt_epsilon(privacy),
        "progress_pct": pct, "progress_text": f"{s.rounds_completed} / {rounds} rounds · {pct}%{working}",
    }


# ---- the embedded snapshot ----------------------------------------------------------------------------------

def initial_state(snap: Snapshot, now: float, stale_after_s: float) -> dict[str, Any]:
    """What the page would fetch first, from one snapshot: the same shapes as the API's responses."""
    return {
        "status": views.build_status(snap, now).model_dump(mode="json"),
        "rounds": views.build_rounds(snap, 0, FIRST_ROUNDS).model_dump(mode="json"),
        "clients": views.build_clients(snap, now, stale_after_s).model_dump(mode="json"),
        "estimator": views.build_estimator(snap).model_dump(mode="json"),
        "partition": views.build_partition(snap).model_dump(mode="json"),
    }


def script_json(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` can end the block
    or open a comment (they only occur inside strings, where ``\\u003c`` etc. mean the same)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_index(template_path: Path, snap: Snapshot | None, now: float, stale_after_s: float) -> str:
    """index.html with the run's state in it; ``snap=None`` (a token is configured) renders placeholders only."""
    if snap is None:
        fields, data = header_fields(None, None), ""
    else:
        state = initial_state(snap, now, stale_after_s)
        last_acc = next((r.test_acc for r in reversed(snap.rounds) if r.test_acc is not None), None)
        privacy = next((r.privacy for r in reversed(snap.rounds) if r.privacy is not None), None)
        fields, data = header_fields(StatusOut(**state["status"]), last_acc, privacy), script_json(state)
    values = {k: html.escape(v, quote=True) for k, v in fields.items()}
    return _template(template_path).substitute(values, initial_data=data, phi2_style=script_json(phi2_style_json()))
