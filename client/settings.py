"""The worker's process settings, declared like the config (``fedent.config.Declared``): building them checks
every field's type and range and raises one ``SettingsError`` naming each bad setting (a ValueError)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fedent.config import Declared, ExecutorName, SettingsError, option, required
from fedentrpc.security.flags import ClientSecurity

__all__ = ["SettingsError", "WorkerSettings"]


@dataclass(frozen=True)
class WorkerSettings(Declared):
    error_type = SettingsError

    aggregator: str = required("HOST:PORT of the aggregator")
    client_ids: tuple[int, ...] = required("the simulated clients this worker hosts")
    estimator: str = option("", "HOST:PORT, for FedEnt offline mode (Algorithm 1's gradient requests)")
    device: str = option("auto", "auto (CUDA when present) | cpu | cuda | cuda:N")
    data_root: str | None = option(None, "overrides data.root of the aggregator's config (data stays local)")
    name: str = option("", "worker name shown on the dashboard")
    token: str = option("", "registration token, when the aggregator requires one")
    connect_timeout_s: float = option(60.0, "seconds to wait for the aggregator", gt=0)
    stall_timeout_s: float = option(30.0, "a model upload or download that moves no chunk this long is cut and "
                                          "resumed from the last chunk the other side holds", gt=0)
    state_dir: str | None = option(None, "persist ClientState here (per run id) so a restarted worker resumes")
    security: ClientSecurity | None = option(None, "TLS / token for both links; None = plaintext, no token")
    reconnect_attempts: int = option(10, "re-registrations tried after losing the aggregator; 0 = exit at once",
                                     ge=0)
    reconnect_window_s: float = option(300.0, "give up reconnecting after this long without a working connection",
                                       gt=0)
    backoff_base_s: float = option(0.5, "full-jitter exponential backoff: sleep U(0, min(cap, base * 2**attempt))",
                                   gt=0)
    backoff_cap_s: float = option(15.0, "the backoff's largest bound (seconds)", gt=0)
    data: str | None = option(None, "--data SPEC: the hosted clients' data from this machine (data.placement: "
                                    "workers)")
    label_histogram: bool = option(True, "report each client's label histogram at Ready (for the dashboard)")
    executor: ExecutorName = option("auto", "how this worker's clients train: sequential, vectorised (a round's "
                                            "clients in one vmapped step), auto = vectorised on CUDA")
    max_parallel_clients: int | None = option(None, "vectorised: clients per chunk (None: from free device memory)",
                                              ge=1)

    def checks(self) -> Iterable[tuple[str, str]]:
        if not self.client_ids:
            yield "client_ids", "a worker must host at least one client"
        if ":" not in self.aggregator:
            yield "aggregator", f"must be HOST:PORT, got {self.aggregator!r}"
        if self.backoff_base_s > self.backoff_cap_s:
            yield "backoff_base_s", f"must be <= backoff_cap_s ({self.backoff_cap_s:g}), got {self.backoff_base_s:g}"
