"""The vectorised executor: the round's clients train together, in chunks that fit the device's memory.

``probe`` takes every participant's probe gradient at w(t) in one vmapped pass (``Strategy.plan_probe``), and
Algorithm 1's oracle gives a round's participants their gradients at φ1(t) in one pass too
(``VectorisedOracle``). FedNorm's gradient inside its plan stays one client at a time.
``fit`` asks every client's strategy for its ``LocalFit``
plan first, in cid order (the plans read and write client state exactly as the sequential executor's fits
do), trains the plans in chunks of ``chunk_size`` clients through one ``vmap``-ed step, then finishes each
client in cid order."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedent.meanfield.oracle import TrainerOracle
from fedent.params import Params, num_elements
from fedent.rng import torch_generator
from fedent.rounds.executor import Gathered
from fedent.rounds.sequential import SequentialExecutor
from fedent.strategies.base import ClientUpdate, LocalFit, Probe, RoundPayload, Strategy, train_generator
from fedent.trainer import LocalTrainer
from fedent.vectorised_trainer import ClientRun, GradientRequest, VectorisedTrainer

# Of the device memory free when the first round starts, the share the chunks may use (the rest is
# headroom for the allocator, evaluation and the sequential probes).
MEMORY_SHARE = 0.6


class VectorisedOracle(TrainerOracle):
    """Algorithm 1's gradient oracle with the batched ``gradients``: each client's batch is the one
    ``TrainerOracle.gradient`` draws (the same (t, cid) stream), all at one point in vmapped chunks."""

    def __init__(self, vtrainer: VectorisedTrainer, client_indices: Sequence[Tensor], seed: int,
                 batch_size: int | None, chunk: int) -> None:
        super().__init__(vtrainer.trainer, client_indices, seed, batch_size)
        self.vtrainer, self.chunk = vtrainer, max(1, chunk)

    def gradients(self, t: int, cids: Sequence[int], point: Sequence[Tensor]) -> list[Params]:
        for c in cids:
            if int(self.client_indices[c].numel()) == 0:
                raise ValueError(f"client {c} has no samples; cannot compute its gradient")
        reqs = [GradientRequest(self.client_indices[c], torch_generator(self.seed, "oracle", t, c), self.batch_size)
                for c in cids]
        out: list[Params] = []
        for lo in range(0, len(reqs), self.chunk):
            out += self.vtrainer.gradients(point, reqs[lo:lo + self.chunk])
        return out


class VectorisedExecutor(SequentialExecutor):
    """Clients of a round train in one ``vmap``-ed SGD step per batch, ``max_parallel`` at a time."""

    def __init__(self, trainer: LocalTrainer, client_indices: Sequence[np.ndarray], lr: float, epochs: int,
                 seed: int, batch_size: int, max_parallel: int | None = None, conv: str = "direct") -> None:
        super().__init__(trainer, client_indices, lr, epochs, seed, batch_size)
        self.vtrainer = VectorisedTrainer(trainer, conv)  # raises ValueError for a model vmap cannot train
        if max_parallel is not None and max_parallel < 1:
            raise ValueError(f"max_parallel_clients must be >= 1, got {max_parallel}")
        self.chunk_size: int | None = max_parallel  # a cap on clients per chunk; measured on CUDA when None

    def bind(self, engine: Any) -> None:
        super().bind(engine)
        engine.clients.update(range(len(self.indices)), worker="simulator (vectorised)")

    def status_fields(self) -> dict[str, Any]:
        return {**super().status_fields(), "executor": "vectorised", "parallel_clients": self.chunk_size,
                "conv": self.vtrainer.conv}

    def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                rounds: int) -> tuple[Strategy, dict[str, Any]]:
        """Algorithm 1 over the batched oracle (each round's participants in one pass per sweep)."""
        chunk = len(self._chunks(list(range(len(self.indices))), global_params)[0])
        oracle = VectorisedOracle(self.vtrainer, self.indices, self.seed, self.batch_size, chunk)
        return strategy, dict(strategy.prepare(oracle, global_params, sizes, rounds) or {})

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        """Every participant's probe gradient at w(t) in vmapped chunks, then each plan's finish in cid order."""
        if not strategy.plans_probe:
            return super().probe(rnd, cids, global_params, strategy)
        plans = {c: strategy.plan_probe(global_params, self.task(rnd, c), self.state(strategy, c)) for c in cids}
        out: dict[int, Probe] = {}
        for chunk in self._chunks(cids, global_params):
            reqs = [GradientRequest(self.indices[c], plans[c].generator, plans[c].batch_size) for c in chunk]
            for c, g in zip(chunk, self.vtrainer.gradients(global_params, reqs), strict=True):
                out[c] = plans[c].finish(g)
        return Gathered(out)

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        if not strategy.plans_fit:  # a plug-in strategy that overrides fit only
            return super().fit(rnd, cids, global_params, strategy, payload)
        plans: dict[int, LocalFit] = {
            c: strategy.plan_fit(self.trainer, global_params, payload, self.task(rnd, c), self.state(strategy, c))
            for c in cids}
        start = [p.detach().to(self.trainer.device) for p in global_params]
        out: dict[int, ClientUpdate] = {}
        for chunk in self._chunks(cids, start):
            runs = [ClientRun(self.indices[c], train_generator(self.task(rnd, c)), plans[c].lr,
                              plans[c].weight_coef, plans[c].linear) for c in chunk]
            for c, (params, res) in zip(chunk, self.vtrainer.train(start, runs, self.epochs), strict=True):
                out[c] = plans[c].finish(params, res)
                self.note_upload(c, out[c])
        return Gathered(out)

    def _chunks(self, cids: Sequence[int], point: Sequence[Tensor]) -> list[list[int]]:
        """``cids`` in order, cut into chunks of at most ``chunk_size`` clients (measured on first use)."""
        order = list(cids)
        size = self.chunk_size or self._memory_cap([p.detach().to(self.trainer.device) for p in point])
        return [order[lo:lo + size] for lo in range(0, len(order), size)]

    def _memory_cap(self, start: Sequence[Tensor]) -> int:
        """No cap on the CPU; on CUDA as many clients as ``MEMORY_SHARE`` of the free memory holds, measured
        once from a one-client trial step (peak bytes), never fewer than one."""
        dev = self.trainer.device
        if dev.type != "cuda":
            self.chunk_size = len(self.indices)
            return self.chunk_size
        torch.cuda.synchronize(dev)
        free, _ = torch.cuda.mem_get_info(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        probe = self.indices[0][: self.batch_size]
        self.vtrainer.train(start, [ClientRun(probe, torch.Generator().manual_seed(0), 0.0)], 1)
        per_client = max(torch.cuda.max_memory_allocated(dev) - base, 1)
        per_client += 4 * num_elements(start) * start[0].element_size()  # stacked params, grads, corrections
        self.chunk_size = max(1, min(len(self.indices), int(MEMORY_SHARE * free // per_client)))
        print(f"vectorised executor: {self.chunk_size} clients per chunk ({per_client / 2**20:.1f} MiB each, "
              f"{free / 2**30:.1f} GiB free)", file=sys.stderr)
        return self.chunk_size


def make_executor(kind: str, trainer: LocalTrainer, client_indices: Sequence[np.ndarray], lr: float, epochs: int,
                  seed: int, batch_size: int, max_parallel: int | None = None,
                  conv: str = "direct") -> SequentialExecutor:
    """The executor ``kind`` names (``auto``: vectorised on CUDA, sequential on the CPU, where
    benchmarks/bench_simulator.py measured the vectorised path slower). A model that vmap cannot train
    falls back to the sequential executor with one line on stderr saying why."""
    want = kind if kind != "auto" else ("vectorised" if trainer.device.type == "cuda" else "sequential")
    if want == "vectorised":
        try:
            return VectorisedExecutor(trainer, client_indices, lr, epochs, seed, batch_size, max_parallel, conv)
        except ValueError as e:
            print(f"vectorised executor unavailable ({e}); using the sequential executor", file=sys.stderr)
    return SequentialExecutor(trainer, client_indices, lr, epochs, seed, batch_size)
