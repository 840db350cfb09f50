"""The vectorised host: the hosted clients of a round train together, in chunks that fit the device's memory.

``probe`` takes every participant's probe gradient at w(t) in one vmapped pass (``Strategy.plan_probe``), and
Algorithm 1's oracle gives a round's participants their gradients at φ1(t) in one pass too
(``VectorisedOracle``). FedNorm's gradient inside its plan stays one client at a time. ``fit`` asks every
client's strategy for its ``LocalFit`` plan first, in cid order (the plans read and write client state exactly
as the sequential host's fits do), trains the plans in chunks of ``chunk_size`` clients through one
``vmap``-ed step, then finishes each client in cid order. Under local DP that step is DP-SGD's (per-sample
gradients of the whole chunk in one pass, each client's noise from its own generator: the sequential host's
models). The simulator and a GPU worker run the same class."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedent.config import ExecutorName
from fedent.meanfield.oracle import TrainerOracle
from fedent.params import Params, num_elements
from fedent.rng import torch_generator
from fedent.rounds.executor import Gathered
from fedent.rounds.host import ClientHost, ClientStates, ClientTraining, TestShards
from fedent.rounds.stacking import StackSeat
from fedent.strategies.base import (
    ClientState,
    ClientUpdate,
    LocalFit,
    Probe,
    ProbePlan,
    RoundPayload,
    Strategy,
    train_generator,
)
from fedent.trainer import LocalTrainer, TrainResult
from fedent.vectorised_trainer import ClientRun, GradientRequest, VectorisedTrainer

# Of the device memory free when the first round starts, the share the chunks may use (the rest is
# headroom for the allocator, evaluation and the sequential probes).
MEMORY_SHARE = 0.6
# On the CPU, under local DP, the bytes a chunk's per-sample gradients (clients × batch × parameters) may take:
# unbounded they grow with the round's clients (20 clients of MNIST-CNN at batch 32: 4.2 GB), and the chunk
# size barely changes the CPU time (one thread, bench_privacy's 20 clients: chunks of 20, 5 or 1 within 10%).
CPU_DP_BYTES = 2**30
# On the CPU, the share of the available memory a step of stacked runs' clients may take (fedent.rounds.stacking),
# at CPU_BYTES_PER_PARAM bytes per parameter per client (the stacked parameters, their gradients, corrections and
# the step's temporaries; measured: 8 stacked MNIST-CNN runs of 100 clients, 800 clients in one step, went past
# 24 GB and were killed).
CPU_MEMORY_SHARE = 0.25
CPU_BYTES_PER_PARAM = 32


class VectorisedOracle(TrainerOracle):
    """Algorithm 1's gradient oracle with the batched ``gradients``: each client's batch is the one
    ``TrainerOracle.gradient`` draws (the same (t, cid) stream), all at one point in vmapped chunks."""

    def __init__(self, vtrainer: VectorisedTrainer, client_indices: Mapping[int, Tensor] | Sequence[Tensor], seed: int,
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


class VectorisedHost(ClientHost):
    """Hosted clients of a round train in one ``vmap``-ed SGD step per batch, ``max_parallel`` at a time."""

    kind = "vectorised"

    def __init__(self, trainer: LocalTrainer, indices: Mapping[int, Tensor] | Sequence[np.ndarray | Tensor],
                 training: ClientTraining, states: ClientStates | None = None, test: TestShards | None = None,
                 on_update: Callable[[ClientUpdate], None] | None = None, max_parallel: int | None = None,
                 conv: str = "direct") -> None:
        super().__init__(trainer, indices, training, states, test, on_update)
        self.vtrainer = VectorisedTrainer(trainer, conv)  # raises ValueError for a model vmap cannot train
        if max_parallel is not None and max_parallel < 1:
            raise ValueError(f"max_parallel_clients must be >= 1, got {max_parallel}")
        self.chunk_size: int | None = max_parallel  # a cap on clients per chunk; measured on CUDA when None

    def status_fields(self) -> dict[str, Any]:
        fields = {**super().status_fields(), "parallel_clients": self.chunk_size, "conv": self.vtrainer.conv}
        seat = getattr(self.vtrainer, "seat", None)
        if seat is not None:  # trains in one step with other runs (fedent.rounds.stacking)
            fields["stacked_runs"] = seat.stack.size
        return fields

    def oracle(self, seed: int | None = None, batch_size: int | None = None) -> TrainerOracle:
        """Algorithm 1's oracle, batched (each round's participants in one pass per sweep)."""
        chunk = len(self._chunks(self.hosted, self.trainer.params)[0])
        return VectorisedOracle(self.vtrainer, self.indices, self.training.seed if seed is None else seed,
                                self.training.batch_size if batch_size is None else batch_size, chunk)

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        """Every participant's probe gradient at w(t) in vmapped chunks, then each plan's finish in cid order."""
        if not strategy.plans_probe:
            return super().probe(rnd, cids, global_params, strategy)
        self.check_hosted(cids)
        out: Gathered[Probe] = Gathered()
        with self.lock:
            plans: dict[int, ProbePlan] = {}
            for c in cids:
                try:
                    plans[c] = strategy.plan_probe(global_params, self.task(rnd, c), self.state(strategy, c, rnd))
                except Exception as e:
                    self._failed(out, c, "probe", rnd, e)
            for chunk in self._chunks(list(plans), global_params):
                reqs = [GradientRequest(self.indices[c], plans[c].generator, plans[c].batch_size) for c in chunk]
                for c, g in zip(chunk, self.vtrainer.gradients(global_params, reqs), strict=True):
                    try:
                        out.results[c] = plans[c].finish(g)
                    except Exception as e:
                        self._failed(out, c, "probe", rnd, e)
        return Gathered(out.results, out.failed)

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        if not strategy.plans_fit:  # a plug-in strategy that overrides fit only
            return super().fit(rnd, cids, global_params, strategy, payload)
        self.check_hosted(cids)
        out: Gathered[ClientUpdate] = Gathered()
        with self.lock:
            self.coalition = []
            plans: dict[int, LocalFit] = {}
            states: dict[int, ClientState] = {}
            for c in cids:  # in cid order: plans read and write client state as the sequential fits do
                try:
                    states[c] = self.state(strategy, c, rnd)
                    plans[c] = strategy.plan_fit(self.trainer, global_params, payload, self.task(rnd, c), states[c])
                except Exception as e:
                    self._failed(out, c, "fit", rnd, e)
            start = [p.detach().to(self.trainer.device) for p in global_params]
            for chunk in self._chunks(list(plans), start):
                runs = [ClientRun(self.indices[c], train_generator(self.task(rnd, c)), plans[c].lr,
                                  plans[c].weight_coef, plans[c].linear) for c in chunk]
                for c, (params, res) in zip(chunk, self.vtrainer.train(start, runs, self.training.epochs),
                                            strict=True):
                    def one(c: int = c, params: Params = params, res: TrainResult = res
                            ) -> tuple[ClientUpdate, ClientState]:
                        return plans[c].finish(params, res), states[c]

                    self._keep(out, c, rnd, one, start)
            self._collude(out, rnd, start)
        return Gathered(out.results, out.failed)

    def _chunks(self, cids: Sequence[int], point: Sequence[Tensor]) -> list[list[int]]:
        """``cids`` in order, cut into chunks of at most ``chunk_size`` clients (measured on first use)."""
        order = list(cids)
        size = self.chunk_size or self._memory_cap([p.detach().to(self.trainer.device) for p in point])
        return [order[lo:lo + size] for lo in range(0, len(order), size)]

    def _memory_cap(self, start: Sequence[Tensor]) -> int:
        """``chunk_capacity`` for this host's clients, kept (a stacked host never chunks: its stack does)."""
        if getattr(self.vtrainer, "stacked", False):
            self.chunk_size = len(self.indices)
            return self.chunk_size
        probe = self.indices[self.hosted[0]]
        self.chunk_size = chunk_capacity(self.vtrainer, probe, start, limit=len(self.indices))
        return self.chunk_size


def chunk_capacity(vtrainer: VectorisedTrainer, probe: Tensor, start: Sequence[Tensor], limit: int | None) -> int:
    """Clients per vectorised step. On the CPU no cap (``limit``, None: unbounded) but under local DP as many
    clients as ``CPU_DP_BYTES`` of per-sample gradients hold; on CUDA as many clients as ``MEMORY_SHARE`` of the
    free memory holds, measured from a one-client trial step on ``probe``'s first batch (peak bytes, DP-SGD's
    per-sample gradients included). Never fewer than one."""
    tr = vtrainer.trainer
    dev = tr.device
    start = [p.detach().to(dev) for p in start]
    big = limit if limit is not None else sys.maxsize
    if dev.type != "cuda":
        cap = big
        if tr.dp is not None:
            per_client = tr.batch_size * num_elements(start) * start[0].element_size()
            cap = min(cap, CPU_DP_BYTES // per_client)
        return max(1, cap)
    return _cuda_capacity(vtrainer, probe, start, big)


def cpu_memory_capacity(start: Sequence[Tensor]) -> int:
    """Clients a CPU step may hold within ``CPU_MEMORY_SHARE`` of the memory available now (a stack's merged steps:
    a run alone never meets this bound in practice, K runs of 100 clients do)."""
    try:
        avail = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, int(CPU_MEMORY_SHARE * avail // (CPU_BYTES_PER_PARAM * num_elements(start))))


def _cuda_capacity(vtrainer: VectorisedTrainer, probe: Tensor, start: Sequence[Tensor], big: int) -> int:
    tr = vtrainer.trainer
    dev = tr.device
    torch.cuda.synchronize(dev)
    free, _ = torch.cuda.mem_get_info(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    VectorisedTrainer.train(vtrainer, start, [ClientRun(probe[: tr.batch_size], torch.Generator().manual_seed(0),
                                                        0.0)], 1)
    per_client = max(torch.cuda.max_memory_allocated(dev) - base, 1)
    per_client += 4 * num_elements(start) * start[0].element_size()  # stacked params, grads, corrections
    cap = max(1, min(big, int(MEMORY_SHARE * free // per_client)))
    print(f"vectorised executor: {cap} clients per chunk ({per_client / 2**20:.1f} MiB each, "
          f"{free / 2**30:.1f} GiB free)", file=sys.stderr)
    return cap


def make_host(kind: ExecutorName, trainer: LocalTrainer,
              indices: Mapping[int, Tensor] | Sequence[np.ndarray | Tensor], training: ClientTraining,
              states: ClientStates | None = None, test: TestShards | None = None,
              on_update: Callable[[ClientUpdate], None] | None = None, max_parallel: int | None = None,
              conv: str = "direct", stack: tuple[StackSeat, str] | None = None) -> ClientHost:
    """The host ``kind`` names (``auto``: vectorised on CUDA, sequential on the CPU, where the vectorised
    host measured 1.35x slower in the simulator and 1.12x in a cluster round: benchmarks/README.md). The
    simulator and every worker decide alike. A model that vmap cannot train falls back to the sequential
    host with one line on stderr saying why. ``stack``: (this run's seat, its ``stack_key``) where runs train
    side by side (fedent.rounds.stacking); a sequential host leaves the stack at once."""
    want = kind if kind != "auto" else ("vectorised" if trainer.device.type == "cuda" else "sequential")
    if want == "vectorised":
        try:
            host = VectorisedHost(trainer, indices, training, states, test, on_update, max_parallel, conv)
        except ValueError as e:
            print(f"vectorised executor unavailable ({e}); using the sequential executor", file=sys.stderr)
        else:
            if stack is not None:
                host.vtrainer = stack[0].join(host.vtrainer, stack[1], max_parallel)
            return host
    if stack is not None:
        print("stacked runs: a sequential executor trains alone (train.executor: vectorised stacks)", file=sys.stderr)
        stack[0].leave()
    return ClientHost(trainer, indices, training, states, test, on_update)
