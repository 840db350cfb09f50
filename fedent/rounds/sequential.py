"""The in-process executor: one ``LocalTrainer`` (one model, the data on the device once) trains every
sampled client in turn; client state lives in a dict for the whole run. This is the simulator's executor."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedent.params import num_elements
from fedent.rounds.executor import Gathered
from fedent.strategies.base import ClientState, ClientTask, ClientUpdate, Probe, RoundPayload, Strategy
from fedent.trainer import LocalTrainer

if TYPE_CHECKING:
    from fedent.rounds.engine import RoundEngine


def central_source(partition_info: dict[str, Any]) -> str:
    """clients.json's data_source when every client's data is cut from one central dataset."""
    return f"central ({partition_info.get('source') or partition_info.get('dataset') or 'dataset'})"


def update_bytes(update: ClientUpdate) -> int:
    """What the update would weigh on the wire, uncompressed: its model and its extra tensor groups."""
    groups = [update.params, *update.tensors.values()]
    return sum(num_elements(g) * g[0].element_size() for g in groups if g)


class SequentialExecutor:
    """Clients run one after another in this process, on ``trainer``'s device."""

    def __init__(self, trainer: LocalTrainer, client_indices: Sequence[np.ndarray], lr: float, epochs: int,
                 seed: int, batch_size: int) -> None:
        self.trainer = trainer
        self.indices: list[Tensor] = [torch.tensor(np.asarray(ix), dtype=torch.int64) for ix in client_indices]
        self.lr, self.epochs, self.seed, self.batch_size = lr, epochs, seed, batch_size
        self.states: dict[int, ClientState] = {}
        self.engine: RoundEngine | None = None

    def bind(self, engine: RoundEngine) -> None:
        self.engine = engine
        engine.clients.update(range(len(self.indices)), worker="simulator", state="idle",
                              device=str(self.trainer.device), data_source=central_source(engine.partition_info))

    def status_fields(self) -> dict[str, Any]:
        return {"mode": "simulator"}  # the run directory says which kind of run it holds (rounds.rundir)

    def start(self) -> None:
        """Every client is here already."""

    def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                rounds: int) -> tuple[Strategy, dict[str, Any]]:
        from fedent.meanfield.oracle import TrainerOracle

        oracle = TrainerOracle(self.trainer, self.indices, self.seed, self.batch_size)
        return strategy, dict(strategy.prepare(oracle, global_params, sizes, rounds) or {})

    def begin_round(self, rnd: int, global_params: Sequence[Tensor]) -> None:
        """The model is already in this process."""

    def task(self, rnd: int, cid: int) -> ClientTask:
        return ClientTask(cid, rnd, self.indices[cid], self.lr, self.epochs, self.seed)

    def state(self, strategy: Strategy, cid: int) -> ClientState:
        st = self.states.get(cid)
        if st is None:
            st = self.states[cid] = strategy.init_client_state(cid, int(self.indices[cid].numel()))
        return st

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        return Gathered({c: strategy.probe(self.trainer, global_params, self.task(rnd, c), self.state(strategy, c))
                         for c in cids})

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        out: dict[int, ClientUpdate] = {}
        for c in cids:
            out[c] = strategy.fit(self.trainer, global_params, payload, self.task(rnd, c), self.state(strategy, c))
            self.note_upload(c, out[c])
        return Gathered(out)

    def note_upload(self, cid: int, update: ClientUpdate) -> None:
        """clients.json: the upload's size and the client's last sign of life."""
        if self.engine is not None:
            self.engine.clients.add_bytes(cid, update_bytes(update))
            self.engine.clients.update([cid], last_heartbeat=time.time())

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        """Never needed: an in-process client always answers (a failure is an exception that ends the run)."""
        raise AssertionError("in-process clients never miss a quorum")

    def finish(self, ok: bool, reason: str) -> None:
        """Nothing to release."""

