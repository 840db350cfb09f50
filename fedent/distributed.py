"""One run over P processes: who this process is among them, and the few collectives a run needs.

``torchrun --nproc-per-node P -m fedent simulate ...`` (or ``fedent simulate --procs P``, which starts the P
processes itself) sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``; ``World.from_env``
reads them and joins the process group: gloo on the CPU, NCCL for tensors on GPUs (with gloo beside it for
the Python objects that the executor gathers, which travel on the CPU). Every rank runs the same round engine
deterministically; ``fedent.rounds.distributed.DistributedExecutor`` splits each round's clients over the
ranks and gathers their results (or all-reduces their weighted sum, ``World.reduce``) so every rank aggregates
the same round.

torch.distributed pulls in no grpc, protobuf or fastapi, so this module belongs to the pure core
(tests/system/test_core_purity.py).
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
Reduce = Literal["auto", "gather", "sum"]
REDUCE_CHOICES: tuple[Reduce, ...] = ("auto", "gather", "sum")

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# A collective waits this long for a rank that never arrives (a crashed peer) before the run fails.
TIMEOUT_S = 1800


class WorldError(RuntimeError):
    """The process group cannot be formed, or the ranks disagree about something they must share."""


class RanksFailed(WorldError):
    """Some ranks failed in their own part of a step and said so in its collective: ``failures`` lists (rank,
    why); every rank raises it alike, so none goes on to a collective the failed ones will not enter."""

    def __init__(self, size: int, failures: list[tuple[int, str]]) -> None:
        self.failures = failures
        super().__init__("; ".join(f"rank {r} of {size} failed: {why}" for r, why in failures))


def said(error: BaseException | None) -> str | None:
    """How a rank's failure travels to its peers: its type and message, bounded."""
    return None if error is None else f"{type(error).__name__}: {error}"[:500]


def raise_failures(size: int, error: BaseException | None, whys: Sequence[tuple[int, str | None]]) -> None:
    """After a collective that carried each rank's ``said`` (``whys``: rank, what it said): this rank's own
    ``error`` is re-raised, another rank's becomes ``RanksFailed``; nothing when none failed."""
    if error is not None:
        raise error
    failures = [(r, str(why)) for r, why in whys if why is not None]
    if failures:
        raise RanksFailed(size, failures)


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` processes of one run (``size == 1``: no process group at all)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str = "none"
    # how the ranks combine a round's updates (fedent.rounds.distributed): "sum" all-reduces their weighted sum
    # (one model's worth of traffic), "gather" all-gathers every update (one process's model bit for bit),
    # "auto" sums wherever the run allows (fedent.rounds.distributed.sum_blocker) and gathers elsewhere
    reduce: Reduce = "auto"

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def leader(self) -> bool:
        """Rank 0: the one that writes the run directory, prints and plots."""
        return self.rank == 0

    def owner(self, cid: int) -> int:
        """The rank that hosts client ``cid``: a fixed round-robin by id, so a client's state (FedDyn λ,
        SCAFFOLD c_i, FedEnt η) always lives in the same process, and a sampled round splits about evenly."""
        return int(cid) % self.size

    def mine(self, cids: list[int] | tuple[int, ...] | Any) -> list[int]:
        return [int(c) for c in cids if self.owner(int(c)) == self.rank]

    # ---- collectives (identity when size == 1) ---------------------------------------------------------
    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj``, in rank order (Python objects; tensors inside should be on the CPU)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T, src: int = 0) -> T:
        if not self.distributed:
            return obj
        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks, in place (gloo for CPU tensors, NCCL for GPU ones, or a CPU copy through
        gloo where the ranks share a GPU); ``t`` when alone."""
        if not self.distributed:
            return t
        if t.is_cuda and "nccl" not in self.backend:
            c = t.cpu()
            dist.all_reduce(c, op=dist.ReduceOp.SUM)
            return t.copy_(c)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def agree(self, error: BaseException | None) -> None:
        """Every rank learns whether any rank failed a check (so none waits forever in a collective for a peer
        that has already given up): the local error is re-raised; another rank's becomes a ``WorldError``."""
        raise_failures(self.size, error, list(enumerate(self.all_gather(said(error)))))

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    # ---- forming the group -----------------------------------------------------------------------------
    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, device: str = "cpu", reduce: Reduce = "auto") -> World:
        """The world torchrun (or ``fedent simulate --procs``) described in the environment; ``World()`` when
        ``WORLD_SIZE`` is absent or 1. ``device``: ``cuda`` binds this rank to GPU ``LOCAL_RANK`` and adds NCCL."""
        if reduce not in REDUCE_CHOICES:
            raise WorldError(f"reduce must be one of {', '.join(REDUCE_CHOICES)}, got {reduce!r}")
        env = os.environ if env is None else env
        size = int(env.get("WORLD_SIZE", "1") or 1)
        if size <= 1:
            return cls(reduce=reduce)
        missing = [k for k in ENV_KEYS if not env.get(k)]
        if missing:
            raise WorldError(f"WORLD_SIZE={size} but {', '.join(missing)} not set: start the processes with "
                             "torchrun --nproc-per-node P -m fedent ... or fedent simulate --procs P")
        rank, local = int(env["RANK"]), int(env["LOCAL_RANK"])
        if not 0 <= rank < size:
            raise WorldError(f"RANK={rank} is outside WORLD_SIZE={size}")
        backend = "gloo"
        if device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise WorldError("device cuda requested for a multi-process run but CUDA is not available")
            n = torch.cuda.device_count()
            torch.cuda.set_device(local % n)
            backend = backend_for(n, int(env.get("LOCAL_WORLD_SIZE", "") or size))
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, rank=rank, world_size=size,
                                    timeout=datetime.timedelta(seconds=TIMEOUT_S))
        return cls(rank, size, local, backend, reduce)


def backend_for(gpus: int, local_size: int) -> str:
    """The process group's backend for ranks on GPUs: NCCL beside gloo when every rank of this host has a GPU of its
    own; gloo alone when they share (NCCL refuses two ranks on one device), GPU tensors then reduced through a CPU
    copy (``World.all_reduce_sum``)."""
    return "cpu:gloo,cuda:nccl" if gpus >= local_size else "gloo"


def free_port() -> int:
    """A TCP port free on this host now (for MASTER_PORT of a launch on one machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, size: int, port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun would give rank ``rank`` of ``size`` processes on this one host."""
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env
