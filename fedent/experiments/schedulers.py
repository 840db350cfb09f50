"""Handing ``fedent reproduce``'s runs to a cluster scheduler instead of its own process pool.

Two schedulers: a Slurm job array through submitit (``--scheduler slurm``; ``submitit-local`` runs the same
jobs as local processes, the way to try it without a cluster) and Ray (``--scheduler ray``: an existing Ray
cluster at ``--ray-address``, or a local one). Each run is one task calling the same
``fedent.experiments.reproduce.execute`` as the pool does, so resuming is as today: a settled run (complete or
diverged, same config) is skipped, an interrupted one is redone. The plan goes out in waves: a run that replays
another (``RunSpec.after``) waits for the wave holding it; a run whose prerequisite failed is not submitted.
The time budget (``--budget-s``) belongs to the pool; a scheduler has its own limits (``--timeout-min``).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fedent.config import ConfigError
from fedent.experiments.plan import Plan, RunSpec
from fedent.experiments.reproduce import RunOutcome, _execute_safely, _unmet

SCHEDULERS = ("pool", "slurm", "submitit-local", "ray")
_BAD = ("failed", "not run", "cut short", "diverged")


class Backend(Protocol):
    """Runs a batch of independent specs somewhere and yields each one's outcome (in any order)."""

    def run(self, specs: Sequence[RunSpec]) -> Iterable[RunOutcome]: ...


def _lost(spec: RunSpec, e: BaseException) -> RunOutcome:
    """A task the scheduler lost (killed, timed out, node failure): the run failed, the others go on."""
    return RunOutcome(spec.key, "failed", 0.0, None, traceback.format_exception_only(type(e), e)[-1].strip()[:500])


def run_external(plan: Plan, backend: Backend) -> Iterator[RunOutcome]:
    """The plan's runs through ``backend``, wave by wave (a wave: every run whose prerequisites have ended)."""
    status: dict[str, str] = {}
    remaining = list(plan.runs)
    while remaining:
        wave = [s for s in remaining if all(d in status for d in s.after)]
        if not wave:  # prerequisites outside the plan: they never run here
            wave = list(remaining)
        ready = []
        for spec in wave:
            remaining.remove(spec)
            if any(status.get(d, "not run") in _BAD for d in spec.after):
                status[spec.key] = "failed"
                yield RunOutcome(spec.key, "failed", 0.0, None, _unmet(spec))
            else:
                ready.append(spec)
        if ready:
            for o in backend.run(ready):
                status[o.key] = o.status
                yield o


@dataclass
class SubmititBackend:
    """A wave is one job array (``executor.map_array``): on Slurm one ``sbatch --array``."""

    executor: Any  # a submitit executor (AutoExecutor, LocalExecutor, DebugExecutor)

    def run(self, specs: Sequence[RunSpec]) -> Iterator[RunOutcome]:
        jobs = self.executor.map_array(_execute_safely, list(specs))
        for spec, job in zip(specs, jobs, strict=True):
            try:
                yield job.result()
            except Exception as e:  # noqa: BLE001 - one lost task fails one run
                yield _lost(spec, e)


def submitit_executor(kind: str, folder: Path, *, partition: str | None = None, gpus_per_run: int = 0,
                      cpus_per_run: int = 1, timeout_min: int = 240, parallel: int | None = None) -> Any:
    """A submitit executor for ``--scheduler slurm`` (``cluster="slurm"``) or ``submitit-local``
    (``cluster="local"``: each task a local process; ``debug``: in this process, for tests)."""
    try:
        import submitit
    except ImportError:
        raise ConfigError("--scheduler slurm/submitit-local needs submitit (pip install submitit)") from None
    cluster = {"slurm": "slurm", "submitit-local": "local", "debug": "debug"}[kind]
    ex = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    params: dict[str, Any] = {"timeout_min": int(timeout_min), "cpus_per_task": int(cpus_per_run),
                              "name": "fedent-reproduce"}
    if gpus_per_run:
        params["gpus_per_node"] = int(gpus_per_run)
    if cluster == "slurm":
        if partition:
            params["slurm_partition"] = partition
        if parallel:
            params["slurm_array_parallelism"] = int(parallel)
    ex.update_parameters(**params)
    return ex


class RayBackend:
    """Each run a Ray task (``num_gpus``: Ray sets the task's ``CUDA_VISIBLE_DEVICES``); ``address``: an existing
    cluster (``ray start --head`` / ``auto``), or None for a local one started here."""

    def __init__(self, address: str | None = None, gpus_per_run: float = 0.0, cpus_per_run: float = 1.0,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--scheduler ray needs ray (pip install ray)") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, **(init_kwargs or {}))
        self.task = ray.remote(num_gpus=gpus_per_run, num_cpus=cpus_per_run)(_execute_safely)

    def run(self, specs: Sequence[RunSpec]) -> Iterator[RunOutcome]:
        refs = {self.task.remote(s): s for s in specs}
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    yield self.ray.get(ref)
                except Exception as e:  # noqa: BLE001 - one lost task fails one run
                    yield _lost(refs[ref], e)

    def close(self) -> None:
        self.ray.shutdown()
