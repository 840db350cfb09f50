"""Several runs of one setting trained side by side: their vectorised steps merged into one (issue 28).

On a GPU one run's round (20 clients of a small CNN) leaves most of the card idle; several runs of one setting
(seeds, algorithms, a tuning grid's rates) share the data, the model's shape and the batch plan's form, so their
clients can train in one vmapped step. Each run keeps its own thread, round engine and vectorised host; only the
host's trainer is a ``StackMember``, which hands each call (a chunk's local training, a batch of probe or
Algorithm 1 gradients) to the ``TrainerStack`` the runs share. The stack waits until every run still going has
handed it a call, then runs together what fits together: training calls of equal epochs as one step over every
run's clients (each client from its own run's model, ``ClientRun.start``), gradient calls as one pass (each at its
own run's point). A run that ends, fails, or cannot join (another setting, a sequential host) leaves the stack,
so the others never wait for it. A client's batches, rate, correction and noise come from its own run exactly as
alone, so its result is the one its run computes alone (tests/fedent/rounds/test_stacking.py). If a merged call
fails, every generator it read is rewound and each run's call is redone alone: one run's error stays its own.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch
from torch import Tensor

from fedent.config import ExperimentConfig
from fedent.params import Params
from fedent.signals import Stopped
from fedent.trainer import LocalTrainer, TrainResult, resolve_device
from fedent.vectorised_trainer import ClientRun, GradientRequest, VectorisedTrainer

Trained = list[tuple[Params, TrainResult]]
OUT_OF_MEMORY: type[BaseException] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
T = TypeVar("T")


def can_stack(cfg: ExperimentConfig) -> bool:
    """Whether a run of ``cfg`` can join a stack: the vectorised executor (named, or ``auto`` on a GPU) and a
    model without dropout. Commands group only such runs; one that still cannot join (a plug-in model vmap cannot
    train) trains alone beside the stack, its dropout draws taking turns (``fedent.rng.GLOBAL_RNG``)."""
    tr = cfg.train
    if cfg.model.dropout > 0:
        return False
    if tr.executor == "vectorised":
        return True
    if tr.executor != "auto":
        return False
    try:
        return resolve_device(tr.device).type == "cuda"
    except ValueError:
        return False


def stack_key(cfg: ExperimentConfig) -> str:
    """What runs must share to train in one step: data, model, privacy and the training's form (batch, epochs,
    device, executor, convolution, precision, levers, chunk cap). Rates, algorithm, seed and rounds may differ
    (the stack also compares the data tensors themselves when a run joins)."""
    d = cfg.to_dict()
    tr = d["train"]
    keep = ("batch_size", "local_epochs", "device", "executor", "conv", "precision", "perf", "max_parallel_clients")
    return json.dumps({"data": d["data"], "model": d["model"], "privacy": d.get("privacy"),
                       "train": {k: tr.get(k) for k in keep}}, sort_keys=True, default=str)


@dataclass
class _Call:
    """One run's pending call: what it asks, and (once the stack ran it) its answer or its error."""

    kind: str  # "train" | "grad"
    point: Sequence[Tensor] | None
    items: Sequence[Any]  # ClientRun for train, GradientRequest for grad
    epochs: int = 0
    result: Any = None
    error: BaseException | None = None
    done: bool = False

    @property
    def group(self) -> tuple[str, int]:
        return (self.kind, self.epochs)


@dataclass
class StackSeat:
    """One run's place in a stack: ``join`` with its trainer (or ``leave`` without), ``leave`` when it ends."""

    stack: TrainerStack
    index: int
    joined: bool = False
    left: bool = False

    def join(self, vtrainer: VectorisedTrainer, key: str, cap: int | None = None) -> VectorisedTrainer:
        """The trainer the run's host should use: a ``StackMember`` when the run can train with the stack, else
        ``vtrainer`` itself (the seat then leaves, and one line on stderr says why)."""
        return self.stack.join(self, vtrainer, key, cap)

    def leave(self) -> None:
        """This run calls the stack no more (idempotent); the others stop waiting for it."""
        self.stack.leave(self)


class StackMember(VectorisedTrainer):
    """A run's vectorised trainer seen through the stack: ``train`` and ``gradients`` go to the shared step;
    everything else (``trainer``, ``conv``, the levers of ``fedent.perf``) is the run's own (``own``)."""

    stacked = True

    def __init__(self, seat: StackSeat, own: VectorisedTrainer) -> None:  # noqa: D107 - no super: a view
        self.seat, self.own = seat, own
        self.trainer: LocalTrainer = own.trainer
        self.conv = own.conv
        self.names = own.names

    def train(self, start: Sequence[Tensor] | None, runs: Sequence[ClientRun], epochs: int) -> Trained:
        if not runs:
            return []
        return list(self.seat.stack.call(self.seat, _Call("train", start, list(runs), epochs)))

    def gradients(self, point: Sequence[Tensor] | None, requests: Sequence[GradientRequest]) -> list[Params]:
        if not requests:
            return []
        return list(self.seat.stack.call(self.seat, _Call("grad", point, list(requests))))


@dataclass
class TrainerStack:
    """The shared step of ``size`` runs (one thread each); see the module's docstring."""

    size: int
    leader: VectorisedTrainer | None = None
    key: str | None = None
    cap: int | None = None  # clients per merged step (train.max_parallel_clients; on CUDA measured once)
    merged_calls: int = 0  # calls that ran merged with another run's (status, tests)
    steps: int = 0  # merged steps run
    _seats: list[StackSeat] = field(default_factory=list)
    _waiting: dict[int, _Call] = field(default_factory=dict)
    _live: int = 0
    _stopped: BaseException | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a stack needs at least one run, got {self.size}")
        self._cond = threading.Condition()
        self._seats = [StackSeat(self, i) for i in range(self.size)]
        self._live = self.size

    def seats(self) -> list[StackSeat]:
        return list(self._seats)

    def join(self, seat: StackSeat, vtrainer: VectorisedTrainer, key: str, cap: int | None) -> VectorisedTrainer:
        with self._cond:
            if seat.left or seat.joined:
                raise RuntimeError(f"seat {seat.index} already {'left' if seat.left else 'joined'} the stack")
            why = None if self.leader is None else self._mismatch(vtrainer, key)
            if why is None:
                if self.leader is None:
                    self.leader, self.key, self.cap = vtrainer, key, cap
                else:  # the same data: share the leader's tensors, one copy on the device
                    vtrainer.trainer.x, vtrainer.trainer.y = self.leader.trainer.x, self.leader.trainer.y
                seat.joined = True
                return StackMember(seat, vtrainer)
        print(f"stacked runs: run {seat.index} trains alone ({why})", file=sys.stderr)
        self.leave(seat)
        return vtrainer

    def _mismatch(self, vt: VectorisedTrainer, key: str) -> str | None:
        """Why ``vt`` cannot train in one step with the leader's, or None."""
        lead = self.leader
        assert lead is not None
        a, b = lead.trainer, vt.trainer
        if key != self.key:
            return "another setting: data, model, privacy or the training's form differ"
        if vt.conv != lead.conv or a.batch_size != b.batch_size or a.device != b.device or a.dp != b.dp:
            return "another convolution form, batch size, device or local DP"
        if [(n, p.shape, p.dtype) for n, p in zip(vt.names, b.params, strict=True)] != \
                [(n, p.shape, p.dtype) for n, p in zip(lead.names, a.params, strict=True)]:
            return "another model shape"
        if a.x.shape != b.x.shape or a.x.dtype != b.x.dtype or not torch.equal(a.x, b.x) or not torch.equal(a.y, b.y):
            return "other training data"
        mine, theirs = vt.buffers, lead.buffers  # the merged step runs the leader's model with the leader's buffers
        if set(mine) != set(theirs) or any(mine[k].shape != theirs[k].shape or not torch.equal(mine[k], theirs[k])
                                           for k in mine):
            return "other model buffers"
        return None

    def leave(self, seat: StackSeat) -> None:
        with self._cond:
            if seat.left:
                return
            seat.left = True
            self._live -= 1
            if self._waiting and len(self._waiting) >= self._live:
                self._flush()

    def stop(self, why: BaseException) -> None:
        """The command was stopped (SIGTERM, SIGINT): every call waiting now, and every later one, raises a
        ``KeyboardInterrupt`` like ``why`` in its run's thread, so each engine ends ``stopped`` (resumable)."""
        with self._cond:
            self._stopped = why
            for c in self._waiting.values():
                c.error, c.done = _stop_like(why), True
            self._waiting = {}
            self._cond.notify_all()

    def call(self, seat: StackSeat, call: _Call) -> Any:
        """Hand ``call`` to the stack and wait for its answer (the last run to arrive runs every waiting call)."""
        with self._cond:
            if self._stopped is not None:
                raise _stop_like(self._stopped)
            if seat.left or not seat.joined:
                raise RuntimeError(f"run {seat.index} is not in the stack")
            self._waiting[seat.index] = call
            if len(self._waiting) >= self._live:
                self._flush()
            while not call.done:
                self._cond.wait()
        if call.error is not None:
            raise call.error
        return call.result

    # ---- the merged step (runs under the lock while every live run waits) ---------------------------------

    def _flush(self) -> None:
        calls, self._waiting = list(self._waiting.values()), {}
        try:
            groups: dict[tuple[str, int], list[_Call]] = {}
            for c in calls:
                groups.setdefault(c.group, []).append(c)
            for group in groups.values():
                self._run_group(group)
        finally:
            for c in calls:
                c.done = True
            self._cond.notify_all()

    def _run_group(self, group: list[_Call]) -> None:
        saved = [_gen_state(c) for c in group]
        answers: list[Any] | None = None
        while answers is None:
            try:
                answers = self._merged(group)
            except Exception as e:  # noqa: BLE001 - redone alone below, so each run gets its own answer or error
                for c, s in zip(group, saved, strict=True):
                    _rewind(c, s)
                if isinstance(e, OUT_OF_MEMORY) and self._shrink(group):
                    continue  # the same calls again, in smaller steps
                break
        for i, c in enumerate(group):
            try:
                c.result = answers[i] if answers is not None else self._merged([c])[0]
            except Exception as e:  # noqa: BLE001 - handed to the run that made the call
                c.error = e
        if answers is not None and len(group) > 1:
            self.merged_calls += len(group)

    def _merged(self, group: Sequence[_Call]) -> list[Any]:
        """The group's calls as one list of clients (each with its run's point), in chunks of ``cap``; the
        answers cut back per call."""
        lead = self.leader
        assert lead is not None
        if group[0].kind == "train":
            items: list[Any] = [r if r.start is not None else replace(r, start=list(c.point or ()))
                                for c in group for r in c.items]
        else:
            items = [q if q.point is not None else replace(q, point=list(c.point or ()))
                     for c in group for q in c.items]
        cap = self._cap(group)
        flat: list[Any] = []
        for lo in range(0, len(items), cap):
            chunk = items[lo:lo + cap]
            flat += lead.train(None, chunk, group[0].epochs) if group[0].kind == "train" else \
                lead.gradients(None, chunk)
            self.steps += 1
        out, lo = [], 0
        for c in group:
            out.append(flat[lo:lo + len(c.items)])
            lo += len(c.items)
        return out

    def _shrink(self, group: Sequence[_Call]) -> bool:
        """After running out of device memory: half as many clients a step, the leader's step buffers and CUDA graphs
        of the old sizes dropped (merged steps of several sizes each keep theirs); False when one client a step
        already ran out."""
        total = sum(len(c.items) for c in group)
        cap = min(self.cap, total) if self.cap is not None else total
        if cap <= 1:
            return False
        self.cap = cap // 2
        lead = self.leader
        assert lead is not None
        lead._states.clear()
        lead._runners.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(f"stacked runs: out of device memory at {cap} clients a step; now {self.cap}", file=sys.stderr)
        return True

    def _cap(self, group: Sequence[_Call]) -> int:
        """Clients per merged step: ``cap`` if set, else set once by ``fedent.rounds.vectorised``'s rules: on CUDA
        measured from the first call's first client; on the CPU what a share of the available memory holds (and
        local DP's per-sample bound)."""
        if self.cap is not None:
            return max(1, self.cap)
        lead = self.leader
        assert lead is not None
        from fedent.rounds.vectorised import chunk_capacity, cpu_memory_capacity

        first = group[0].items[0]
        point = group[0].point if group[0].point is not None else \
            (first.start if isinstance(first, ClientRun) else first.point)
        assert point is not None
        self.cap = chunk_capacity(lead, first.indices, point, limit=None)
        if lead.trainer.device.type != "cuda":
            self.cap = min(self.cap, cpu_memory_capacity(point))
        return self.cap


def _gen_state(call: _Call) -> list[Tensor]:
    return [item.generator.get_state() for item in call.items]


def _rewind(call: _Call, states: Sequence[Tensor]) -> None:
    for item, s in zip(call.items, states, strict=True):
        item.generator.set_state(s)


STOP_WAIT_S = 60.0  # how long a stopped command waits for its stacked runs to write ``stopped``


def _stop_like(why: BaseException) -> KeyboardInterrupt:
    return Stopped(why.signame) if isinstance(why, Stopped) else KeyboardInterrupt()


def side_by_side(jobs: Sequence[Callable[[StackSeat], T]], name: str = "stacked") -> list[T | BaseException]:
    """Each job in its own thread with its seat of one ``TrainerStack`` (the seat is left when the job ends, however
    it ends); each job's result or the exception it raised, in order. Stopped (SIGTERM, SIGINT in this thread),
    it stops the stack, so each run ends ``stopped`` at its next stacked call, waits up to ``STOP_WAIT_S`` for them
    and raises; the runs resume from their last checkpoints."""
    stack = TrainerStack(len(jobs))
    out: list[T | BaseException | None] = [None] * len(jobs)
    ended = [threading.Event() for _ in jobs]

    def one(i: int, seat: StackSeat) -> None:
        try:
            out[i] = jobs[i](seat)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            out[i] = e
        finally:
            seat.leave()
            ended[i].set()

    threads = [threading.Thread(target=one, args=(i, seat), name=f"{name}-{i}", daemon=True)
               for i, seat in enumerate(stack.seats())]
    for t in threads:
        t.start()
    # waited on through Events, not Thread.join: a join interrupted by a signal can mark a thread that is still
    # running as ended (seen: the command exited while a stacked run was still evaluating)
    try:
        for ev in ended:
            ev.wait()
    except KeyboardInterrupt as e:  # the command was stopped: the runs stop at their next stacked call
        stack.stop(e)
        deadline = time.monotonic() + STOP_WAIT_S
        for ev in ended:
            ev.wait(max(0.0, deadline - time.monotonic()))
        raise
    return [o if o is not None else RuntimeError("the run's thread ended without a result") for o in out]
