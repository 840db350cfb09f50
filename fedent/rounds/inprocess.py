"""The in-process executor: a ``ClientHost`` of all N clients, in this process (the simulator's executor).

The host does the client half (sequential or vectorised, fedent.rounds.host / fedent.rounds.vectorised);
this wrapper only adds what the engine asks of an executor: the clients.json rows, Algorithm 1 over the
host's oracle, and retries drawn from the same stream as the cluster's (``fedent.rounds.retry``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from fedent.config import ExecutorName
from fedent.params import num_elements
from fedent.rounds.executor import Gathered
from fedent.rounds.host import ClientHost, ClientStates, ClientTraining
from fedent.rounds.retry import retry_order
from fedent.rounds.stacking import StackSeat
from fedent.rounds.vectorised import make_host
from fedent.strategies.base import ClientUpdate, Probe, RoundPayload, Strategy
from fedent.trainer import LocalTrainer

if TYPE_CHECKING:
    from fedent.rounds.engine import RoundEngine


def central_source(partition_info: dict[str, Any]) -> str:
    """clients.json's data_source when every client's data is cut from one central dataset."""
    return f"central ({partition_info.get('source') or partition_info.get('dataset') or 'dataset'})"


def update_bytes(update: ClientUpdate) -> int:
    """What the update would weigh on the wire, uncompressed: its model and its extra tensor groups."""
    groups = [update.params, *update.tensors.values()]
    masked = int(update.masked.nbytes) if update.masked is not None else 0
    return masked + sum(num_elements(g) * g[0].element_size() for g in groups if g)


class InProcessExecutor:
    """Every client is hosted here, by ``host``; nothing to dispatch, nobody to wait for."""

    def __init__(self, host: ClientHost) -> None:
        self.host = host
        self.engine: RoundEngine | None = None
        host.on_update = self.note_upload
        self.on_client: Callable[[int, int], None] | None = None  # (clients done, total) within a fit: progress
        self._fit = [0, 0]

    def bind(self, engine: RoundEngine) -> None:
        self.engine = engine
        worker = "simulator" if self.host.kind == "sequential" else f"simulator ({self.host.kind})"
        engine.clients.update(self.host.hosted, worker=worker, state="idle", device=str(self.host.trainer.device),
                              data_source=central_source(engine.partition_info))

    def status_fields(self) -> dict[str, Any]:
        fields = self.host.status_fields()
        if fields.get("executor") == "sequential":
            fields.pop("executor")  # the default: status.json has said nothing about it since the start
        return {"mode": "simulator", **fields}  # the run directory says which kind of run it holds (rundir)

    def start(self) -> None:
        """Every client is here already; counts its host reports otherwise than the partition's (a simulated
        inflate-count attacker) are adopted as a worker's would be, so the engine's bounds judge them alike."""
        if self.engine is None:
            return
        reported = [self.host.reported_samples(c) for c in self.host.hosted]
        if self.host.hosted == list(range(len(self.engine.sizes))) and reported != self.engine.sizes:
            self.engine.adopt_client_data(reported, {"reported": "simulated adversary"})

    def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                rounds: int) -> tuple[Strategy, dict[str, Any]]:
        """Algorithm 1 over the host's (maybe batched) oracle."""
        with self.host.lock:
            return strategy, dict(strategy.prepare(self.host.oracle(), global_params, sizes, rounds) or {})

    def resumed(self, first: int | None, error: BaseException | None) -> None:
        """One process: nothing to agree on."""

    def begin_round(self, rnd: int, global_params: Sequence[Tensor]) -> None:
        """The model is already in this process."""

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        return self.host.probe(rnd, cids, global_params, strategy)

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        self._fit = [0, len(cids)]
        return self.host.fit(rnd, cids, global_params, strategy, payload)

    def note_upload(self, update: ClientUpdate) -> None:
        """clients.json: the upload's size and the client's last sign of life."""
        if self.engine is not None:
            self.engine.clients.add_bytes(update.cid, update_bytes(update))
            self.engine.clients.update([update.cid], last_heartbeat=time.time())
        self._fit[0] += 1
        if self.on_client is not None:
            self.on_client(min(self._fit[0], self._fit[1]), self._fit[1])

    def secure_exchange(self, rnd: int, requests: Mapping[int, bytes]) -> Gathered[bytes]:
        return self.host.secure_exchange(rnd, requests)

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        """Every client is live here: the first ``k`` of the cluster's retry stream."""
        return sorted(retry_order(self.host.training.seed, rnd, attempt, len(self.host.indices), exclude)[:k])

    def finish(self, ok: bool, reason: str) -> None:
        """Nothing to release."""


def make_executor(kind: ExecutorName, trainer: LocalTrainer, client_indices: Sequence[np.ndarray],
                  training: ClientTraining, max_parallel: int | None = None,
                  conv: str = "direct", states: ClientStates | None = None,
                  stack: tuple[StackSeat, str] | None = None) -> InProcessExecutor:
    """The simulator's executor: a host of every client, of the kind ``kind`` names (``make_host``); ``states``:
    where the clients' state lives (default: in memory); ``stack``: see ``make_host``."""
    return InProcessExecutor(make_host(kind, trainer, client_indices, training, states=states,
                                       max_parallel=max_parallel, conv=conv, stack=stack))
