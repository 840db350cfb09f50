"""Prometheus text exposition (format 0.0.4) of a run, written by hand to avoid a client-library dependency.

Everything is derived from the same snapshot the JSON API uses, so a scrape and the page never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedent.runlog import PHASES
from server.dashboard.models import ClientOut, ClientsOut, EstimatorOut, RoundOut, StatusOut
from server.dashboard.views import DOWN_STATES, HEALTHS, integer, mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict[str, str], float | None]]) -> None:
        values = [(labels, v) for labels, v in samples if v is not None]
        if not values:
            return
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, v in values:
            lab = ",".join(f'{k}="{_escape(val)}"' for k, val in labels.items())
            self.lines.append(f"{name}{{{lab}}} {_fmt(v)}" if lab else f"{name} {_fmt(v)}")

    def one(self, name: str, kind: str, help_text: str, value: float | None) -> None:
        self.metric(name, kind, help_text, [({}, value)])


def _client_counters(w: _Writer, rows: list[ClientOut]) -> None:
    """Traffic and client counts, all sums over the same /api/clients rows, so they add up:

    * ``bytes_total`` = Σ rows' ``bytes_total``; ``bytes_sent_total`` and ``bytes_received_total`` are written only
      when every row with traffic knows both directions, and then ``sent + received == total`` exactly (a writer
      that records only totals, as the simulator and the round engine do, gets ``bytes_total`` alone, never a
      misleading 0 beside it);
    * ``clients{health}`` counts every row once, so Σ over health = the number of rows;
      ``connected_clients`` = ``clients{health="ok"}`` (0 once the run is over), ``down_clients`` = ``{health="down"}``.
    """
    with_traffic = [c for c in rows if c.bytes_total is not None]
    w.one("fedent_bytes_total", "counter", "Bytes exchanged with clients, both ways (sum over clients.json).",
          float(sum(c.bytes_total or 0 for c in with_traffic)))
    if with_traffic and all(c.bytes_sent is not None and c.bytes_received is not None for c in with_traffic):
        w.one("fedent_bytes_sent_total", "counter", "Bytes sent to clients (sum over clients.json).",
              float(sum(c.bytes_sent or 0 for c in with_traffic)))
        w.one("fedent_bytes_received_total", "counter", "Bytes received from clients (sum over clients.json).",
              float(sum(c.bytes_received or 0 for c in with_traffic)))
    by_health = {h: 0 for h in HEALTHS}
    for c in rows:
        by_health[c.health] = by_health.get(c.health, 0) + 1
    w.metric("fedent_clients", "gauge", "Clients (rows of /api/clients), by health (" + ", ".join(HEALTHS) + ").",
             [({"health": h}, float(n)) for h, n in by_health.items()])
    w.one("fedent_connected_clients", "gauge", "Clients of a live run that are neither down nor stale "
          "(0 once the run is over).", float(by_health["ok"]))
    w.one("fedent_down_clients", "gauge", "Clients whose state is one of " + ", ".join(DOWN_STATES) + ".",
          float(by_health["down"]))


def render(status: StatusOut, rounds: list[RoundOut], clients: ClientsOut, estimator: EstimatorOut,
           raw_status: object) -> str:
    """The /metrics body."""
    w = _Writer()
    w.metric("fedent_run_info", "gauge", "Run identity (value is always 1).",
             [({"run_id": status.run_id, "algorithm": status.algorithm or ""}, 1.0)])
    w.metric("fedent_phase", "gauge", "1 for the run's current phase, 0 for the others.",
             [({"phase": p}, 1.0 if status.phase == p else 0.0) for p in PHASES])
    w.one("fedent_rounds_completed", "gauge", "Rounds completed (lines in metrics.jsonl).",
          float(status.rounds_completed))
    w.one("fedent_rounds_configured", "gauge", "Rounds the run is configured for.",
          None if status.rounds is None else float(status.rounds))
    w.one("fedent_current_round", "gauge", "Round in progress (1..R, as everywhere).",
          None if status.round is None else float(status.round))
    w.one("fedent_elapsed_seconds", "gauge", "Seconds since the run started.", status.elapsed_s)
    w.one("fedent_eta_seconds", "gauge", "Estimated seconds until the run finishes.", status.eta_s)

    walls = [r.wall_s for r in rounds if r.wall_s is not None]
    if walls:
        w.lines += [
            "# HELP fedent_round_duration_seconds Wall time of completed rounds.",
            "# TYPE fedent_round_duration_seconds summary",
            f"fedent_round_duration_seconds_sum {_fmt(sum(walls))}",
            f"fedent_round_duration_seconds_count {len(walls)}",
        ]
        w.one("fedent_last_round_duration_seconds", "gauge", "Wall time of the last completed round.", walls[-1])
    last_eval = next((r for r in reversed(rounds) if r.test_acc is not None or r.test_loss is not None), None)
    if last_eval is not None:
        w.one("fedent_test_accuracy", "gauge", "Test accuracy at the last evaluation.", last_eval.test_acc)
        w.one("fedent_test_loss", "gauge", "Test loss at the last evaluation.", last_eval.test_loss)
    last_train = next((r for r in reversed(rounds) if r.train_loss is not None), None)
    if last_train is not None:
        w.one("fedent_train_loss", "gauge", "Mean client training loss in the last round.", last_train.train_loss)

    rows = clients.clients
    if clients.source == "clients.json":
        _client_counters(w, rows)
    st = mapping(raw_status)
    errors = integer(st.get("errors"))
    if errors is None:
        errors = integer(mapping(st.get("state")).get("errors"))
    w.one("fedent_errors_total", "counter", "Errors the writer recorded in status.json (1 if the run failed).",
          float(errors if errors is not None else (1 if status.phase == "failed" else 0)))
    w.metric("fedent_client_participation_total", "counter", "Rounds each client took part in.",
             [({"client": str(c.cid)}, float(c.participation)) for c in rows])
    w.metric("fedent_client_eta", "gauge", "FedEnt learning rate of each client's last round.",
             [({"client": str(c.cid)}, c.eta) for c in rows])

    last = estimator.trajectory[-1] if estimator.trajectory else None
    if last is not None:
        w.one("fedent_phi2_predicted", "gauge", "Estimator's predicted phi2 for the last round.", last.phi2_pred)
        w.one("fedent_phi2_actual", "gauge", "Actual sum theta_i ||w_i||^2 of the last round.", last.phi2_actual)
        w.one("fedent_entropy", "gauge", "Entropy of the uploaded models in the last round.", last.entropy)
    return "\n".join(w.lines) + "\n"
