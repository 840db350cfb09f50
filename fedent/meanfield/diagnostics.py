"""The per-round FedEnt record (spec §5) written under key "fedent" in metrics.jsonl.

It carries every input of each participant's rate (θ, a, b, c, φ2', β, γ, variant) next to the η* and η
that were used, so anyone can recompute every learning rate from the run's own log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedent.meanfield.entropy import entropy_term

CLIENT_FIELDS = ("client", "theta", "a", "b", "c", "phi2_next", "beta", "gamma", "variant", "eta_max", "eta_prev",
                 "phi2_rate", "eta_star", "eta")


@dataclass(frozen=True)
class ParticipantReport:
    """One participant's upload as the record needs it."""

    client: int
    num_samples: int
    model_sq_norm: float  # ‖w_i(t+1)‖² of the uploaded model
    scalars: Mapping[str, float]  # the ClientUpdate scalars: eta_star, eta, a, b, c, theta, phi2_next, guarded


def fedent_round_record(
    participants: Sequence[ParticipantReport], beta: float, gamma: float, variant: str,
    eta_max: float | None = None, phi2_rate: str = "star",
) -> dict[str, Any]:
    """{phi2_pred, phi2_actual, entropy, guards, eta_max, phi2_rate, clients: [...]} for one round.

    ``eta_max`` is null when uncapped; each client's ``eta_prev`` is the η_i(t−1) its rate decayed from."""
    if not participants:
        raise ValueError("a FedEnt round record needs at least one participant")
    total = float(sum(p.num_samples for p in participants))
    thetas = [p.num_samples / total for p in participants]
    norms = [p.model_sq_norm for p in participants]
    clients = []
    for p in participants:
        s = p.scalars
        clients.append({
            "client": int(p.client),
            "theta": float(s["theta"]),
            "a": float(s["a"]),
            "b": float(s["b"]),
            "c": float(s["c"]),
            "phi2_next": float(s["phi2_next"]),
            "beta": float(beta),
            "gamma": float(gamma),
            "variant": variant,
            "eta_max": None if eta_max is None else float(eta_max),
            "eta_prev": float(s["eta_prev"]),
            "phi2_rate": phi2_rate,
            "eta_star": float(s["eta_star"]),
            "eta": float(s["eta"]),
        })
    return {
        "phi2_pred": float(participants[0].scalars["phi2_next"]),
        "phi2_actual": float(sum(t * n for t, n in zip(thetas, norms, strict=True))),
        "entropy": entropy_term(thetas, norms),
        "guards": int(sum(1 for p in participants if p.scalars.get("guarded", 0.0))),
        "eta_max": None if eta_max is None else float(eta_max),
        "phi2_rate": phi2_rate,
        "clients": clients,
    }
