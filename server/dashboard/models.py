"""Response models of the dashboard API: they are the OpenAPI schema and the contract the page relies on.

Every field the run directory may lack is optional, because the dashboard must answer (with empty data)
for a run that has only just started or whose files are damaged.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str = "ok"


class StatusOut(BaseModel):
    run_id: str
    algorithm: str | None = None
    phase: str = Field(description="starting, estimating, training, aggregating, evaluating, done, failed or unknown")
    round: int | None = Field(None, description="round in progress, 1..R as everywhere (the last round once done)")
    rounds: int | None = Field(None, description="configured number of rounds")
    rounds_completed: int = Field(0, description="lines in metrics.jsonl")
    progress: float = Field(0.0, description="rounds_completed / rounds, in [0, 1]")
    started_at: float | None = Field(None, description="Unix epoch seconds")
    updated_at: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = Field(None, description="estimated seconds to finish (mean round time x rounds left)")
    error: str | None = Field(None, description="failure message of a failed run")
    evaluation: str | None = Field(None, description="server (held-out set at the aggregator) or federated (each "
                                                     "client's local test split, sample-weighted mean)")
    data_placement: str | None = Field(None, description="central (every process reads the dataset) or workers "
                                                         "(each client's data stays on its worker)")


class FedentClientDiag(BaseModel):
    client: int
    theta: float | None = None
    a: float | None = None
    b: float | None = None
    c: float | None = None
    phi2_next: float | None = None
    beta: float | None = None
    gamma: float | None = None
    variant: str | None = None
    eta_max: float | None = None  # null: η* uncapped (spec §5)
    eta_prev: float | None = None  # η_i(t−1), the rate η decayed from
    phi2_rate: str | None = None  # the rate the mean field stepped with: used | star
    eta_star: float | None = None
    eta: float | None = None


class FedentRound(BaseModel):
    phi2_pred: float | None = None
    phi2_actual: float | None = None
    entropy: float | None = None
    guards: int | None = None
    eta_max: float | None = None
    phi2_rate: str | None = None
    clients: list[FedentClientDiag] = []


class PrivacyRound(BaseModel):
    """A round's ``privacy`` entry (fedent/privacy): the run's (ε, δ) so far and how it was accounted."""

    dp: str | None = None
    epsilon: float | None = None  # null: no guarantee (noise multiplier 0)
    delta: float | None = None
    accountant: str | None = None
    clip_norm: float | None = None


class RoundOut(BaseModel):
    round: int
    algorithm: str | None = None
    test_acc: float | None = None
    test_loss: float | None = None
    train_loss: float | None = None
    clients: list[int] = []
    num_clients: int | None = None
    wall_s: float | None = None
    elapsed_s: float | None = None
    fedent: FedentRound | None = None
    diagnostics: dict[str, Any] = {}
    privacy: PrivacyRound | None = None


class RoundsPage(BaseModel):
    total: int
    offset: int
    limit: int
    items: list[RoundOut]


class ClientOut(BaseModel):
    cid: int
    worker: str | None = None
    state: str | None = None
    health: str = Field(description="ok, stale (no recent heartbeat), down (failed/lost) or unknown while the run "
                                    "is live; finished (run done) or stopped (run failed) once it is over, unless down")
    device: str | None = None
    samples: int | None = None
    participation: int = 0
    bytes_sent: int | None = None
    bytes_received: int | None = None
    bytes_total: int | None = Field(None, description="bytes both ways: sent + received when both are known, "
                                                      "else the writer's total")
    eta: float | None = Field(None, description="FedEnt: the learning rate η the client actually trained with in its "
                                                "last round, η = γ·η(previous) + (1−γ)·η*")
    eta_star: float | None = Field(None, description="FedEnt: the entropy-optimal rate η* of Proposition 1 in the "
                                                     "client's last round, before the decay toward it")
    last_heartbeat: float | None = Field(None, description="Unix epoch seconds")
    heartbeat_age_s: float | None = None
    data_source: str | None = Field(None, description="where the client's data came from: its file on the worker "
                                                       "(worker-local data), or central (the dataset's source)")
    last_failure: str | None = Field(None, description="'round t: why' of the client's last failure: a rejected "
                                                        "upload (rejected: ...), a deadline, a lost worker")


class ClientsOut(BaseModel):
    source: str = Field(description="clients.json, metrics.jsonl (fallback) or none")
    clients: list[ClientOut]


class TrajectoryPoint(BaseModel):
    round: int
    phi2_pred: float | None = None
    phi2_actual: float | None = None
    entropy: float | None = None
    guards: int | None = None


class EstimatorOut(BaseModel):
    available: bool
    mode: str | None = None
    trajectory: list[TrajectoryPoint]
    report: dict[str, Any] = Field(default_factory=dict, description="Algorithm 1's convergence report etc.")


class ConfigOut(BaseModel):
    available: bool
    config: dict[str, Any]
    redacted: list[str] = Field(default_factory=list, description="dotted keys whose values were hidden")


class PartitionOut(BaseModel):
    available: bool
    scheme: str | None = None
    seed: int | None = None
    num_clients: int = 0
    num_classes: int = 0
    md5: str | None = None
    sizes: list[int] = []
    label_counts: list[list[int]] = []
