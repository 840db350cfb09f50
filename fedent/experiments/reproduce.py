"""Running a ``fedent reproduce`` plan: each run into its own directory, in a process pool, resumable.

A run whose directory already holds every round of the same config is skipped, and so is one that diverged (a
model went non-finite: training is deterministic per seed, so it would diverge again). The protocol itself is
data in ``fedent.experiments.profiles``, the runs it needs come from ``fedent.experiments.plan``, and the report
that renders the logs is ``fedent.experiments.reproduce_report``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from fedent import runlog
from fedent.config import ConfigError, ExperimentConfig, config_from_dict
from fedent.experiments.plan import Plan, RunSpec
from fedent.inputs import RunInputs, load_inputs
from fedent.strategies.base import StrategyError

if TYPE_CHECKING:
    from fedent.rounds.stacking import StackSeat


@dataclass(frozen=True)
class RunOutcome:
    key: str
    status: str  # done | skipped (already complete) | diverged (a model went non-finite) | failed | not run | cut short
    wall_s: float
    final_acc: float | None = None
    error: str | None = None


# ---- running ---------------------------------------------------------------------------------------------

def is_complete(run_dir: Path, rounds: int) -> bool:
    """A run counts as done when its metrics.jsonl holds every round 1..rounds (resume skips it)."""
    recs = runlog.read_metrics(runlog.RunPaths(run_dir).metrics)
    return sorted(int(r.get("round", -1)) for r in recs) == list(range(1, rounds + 1))


# A model went non-finite, or so large that a strategy's declared scalar left its range (FedEnt's probe
# a = <w, g> at 1e25 under a x(-10) attack): every client rejected, the quorum missed.
DIVERGED = ("not finite", "is outside its range")


def diverged(run_dir: Path) -> str | None:
    """The engine's error when the run stopped because a model went non-finite (or out of every declared scalar
    range), else None. Such a run has settled: training is deterministic per seed, so running it again diverges
    again (resume skips it)."""
    status = runlog.read_json(runlog.RunPaths(run_dir).status, default=None)
    if not isinstance(status, dict) or status.get("phase") != "failed":
        return None
    error = str((status.get("state") or {}).get("error") or status.get("error") or "")
    return error if any(d in error for d in DIVERGED) else None


def settled(spec: RunSpec) -> bool:
    """Complete, or diverged, with this spec's config: nothing left to run."""
    return settled_dir(spec.run_dir, spec.config, spec.rounds)


def settled_dir(run_dir: Path, config: Mapping[str, Any], rounds: int) -> bool:
    """The run in ``run_dir`` has ``config`` and is complete or diverged (``settled`` without a spec)."""
    return (is_complete(run_dir, rounds) or diverged(run_dir) is not None) and same_config(run_dir, config)


def finished(run_dir: Path) -> bool:
    """The run in ``run_dir`` ended, whatever its config: its status says done, or it diverged. Unlike
    ``fedent.rounds.rundir.finished_status`` it needs no final model: kept run logs without models (a GPU
    machine's archive, docs/mnist's run-logs.tar.gz) are results too."""
    status = runlog.read_json(runlog.RunPaths(run_dir).status, default=None)
    return (isinstance(status, dict) and status.get("phase") == "done") or diverged(run_dir) is not None


SUPERSEDED = ".superseded-"  # a set-aside run directory's name: ``<run>.superseded-<n>``


def set_aside(run_dir: Path) -> Path:
    """Move ``run_dir`` to a free ``<name>.superseded-<n>`` beside it; returns where it went."""
    n = 1
    while (kept := run_dir.with_name(f"{run_dir.name}{SUPERSEDED}{n}")).exists():
        n += 1
    os.replace(run_dir, kept)
    return kept


def same_config(run_dir: Path, config: Mapping[str, Any]) -> bool:
    """True when the run dir's config.yaml is this spec's config (a changed profile must not be skipped)."""
    path = runlog.RunPaths(run_dir).config
    try:
        written = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    want = json.loads(json.dumps(runlog.jsonable(config_from_dict(config).to_dict())))
    return bool(written == want)


@lru_cache(maxsize=2)
def cached_inputs(key: str) -> RunInputs:
    """Data + partition + model factory per (data, model, seed), reused by a worker's consecutive runs."""
    return load_inputs(config_from_dict(json.loads(key)))


def inputs_key(cfg: Mapping[str, Any]) -> str:
    return json.dumps({"data": cfg["data"], "model": cfg["model"], "train": {"seed": cfg["train"]["seed"]}},
                      sort_keys=True)


InputsFor = Callable[[ExperimentConfig], RunInputs]


def execute(spec: RunSpec, inputs_for: InputsFor | None = None, progress: bool = True,
            seat: StackSeat | None = None) -> RunOutcome:
    """Run one spec into its run dir. Every run checkpoints each round, so a partial dir that an interrupted
    reproduce left with this spec's config resumes from its last checkpoint; one of another config, or one that
    cannot be resumed (no checkpoint: written before checkpoints, or killed in its first round), is cleared and
    run from the start.

    ``progress``: one line per round on stdout when it is not a terminal (on a terminal, the per-run lines
    of ``fedent reproduce`` are enough). ``seat``: the run trains in one step with others (``execute_stacked``);
    a run that settles without training leaves it at once."""
    try:
        return _execute(spec, inputs_for, progress, seat)
    finally:
        if seat is not None:
            seat.leave()


def _execute(spec: RunSpec, inputs_for: InputsFor | None, progress: bool, seat: StackSeat | None) -> RunOutcome:
    from fedent.rounds.engine import RoundPolicy
    from fedent.sim.simulator import SimulationError, run_simulation

    t0 = time.perf_counter()
    if is_complete(spec.run_dir, spec.rounds) and same_config(spec.run_dir, spec.config):
        recs = runlog.read_metrics(runlog.RunPaths(spec.run_dir).metrics)
        return RunOutcome(spec.key, "skipped", 0.0, runlog.final_accuracy(recs))
    if (blew := diverged(spec.run_dir)) is not None and same_config(spec.run_dir, spec.config):
        return RunOutcome(spec.key, "diverged", 0.0, None, f"(before) {blew}")
    cfg = config_from_dict(spec.config)
    resume = prepare_run_dir(spec.run_dir, cfg, spec.key)
    inputs = inputs_for(cfg) if inputs_for is not None else cached_inputs(inputs_key(spec.config))
    try:
        # no bar (parallel runs would draw over each other); a line per round where there is no terminal
        res = run_simulation(cfg, spec.run_dir, progress=progress, bar=False, inputs=inputs, plots=False,
                             label=spec.key, policy=RoundPolicy(checkpoint_keep=2), resume=resume, seat=seat)
    except (SimulationError, StrategyError, ValueError, RuntimeError) as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        status = "diverged" if diverged(spec.run_dir) is not None else "failed"  # an outcome, not an error
        return RunOutcome(spec.key, status, time.perf_counter() - t0, None, f"{type(e).__name__}: {msg}")
    return RunOutcome(spec.key, "done", time.perf_counter() - t0, res.final_acc)


def prepare_run_dir(run_dir: Path, cfg: ExperimentConfig, label: str) -> bool:
    """Make ``run_dir`` ready for ``cfg``'s run; True when it holds this config's unfinished run to resume from
    its newest checkpoint. Anything else there is cleared, except a finished run (of another config: a caller
    skips this config's own), which is a result and is moved aside whole (``set_aside``), never deleted."""
    from fedent.rounds.rundir import SIMULATOR, RunDirError, RunFinished, plan_run_dir

    if not run_dir.exists():
        return False
    if same_config(run_dir, cfg.to_dict()) and _log_covers_checkpoints(run_dir):
        try:
            if plan_run_dir(run_dir, cfg, SIMULATOR).action == "resume":
                return True
        except (RunDirError, RunFinished):
            pass
    if finished(run_dir):
        kept = set_aside(run_dir)
        print(f"{label}: {run_dir} held a finished run of another config; moved to {kept.name}", file=sys.stderr)
    else:
        shutil.rmtree(run_dir)
    return False


def _log_covers_checkpoints(run_dir: Path) -> bool:
    """metrics.jsonl holds rounds 1..m without a gap and every checkpoint is of a round it logged: what an
    interruption leaves (a log cut or edited behind its checkpoints is not resumed, it is run again)."""
    from fedent.checkpoint import list_checkpoints

    paths = runlog.RunPaths(run_dir)
    logged = [r.get("round") for r in runlog.read_metrics(paths.metrics)]
    found = list_checkpoints(paths.checkpoint)
    return bool(found) and logged == list(range(1, len(logged) + 1)) and max(r for r, _ in found) < len(logged)


_POOL_STOP: Any = None  # in a pool worker: the pool's stop event (``process_pool``)


class PoolStopping(RuntimeError):
    """A task the pool had already handed to a worker's queue when it was told to stop: it is not started."""


def _unless_stopped(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Every pool task's wrapper: once the pool is stopping, a task a worker takes from its queue does not start
    (``cancel_futures`` cannot recall the few tasks a process pool queues ahead for its workers, and each would
    otherwise begin a run, create its directory and take its lock, until the kill after the grace time)."""
    if _POOL_STOP is not None and _POOL_STOP.is_set():
        raise PoolStopping("not started: the pool was stopping")
    return fn(*args, **kwargs)


class _StoppablePool(ProcessPoolExecutor):
    """A process pool whose tasks check the pool's stop event (``stop_workers`` sets it) before they start."""

    def __init__(self, *args: Any, stop_event: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_event = stop_event

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return super().submit(_unless_stopped, fn, *args, **kwargs)


def init_worker(threads: int, counter: Any = None, gpus: Sequence[str] = (), stop: Any = None) -> None:
    """A pool worker's start: its GPU (``fedent.experiments.placement``: round-robin over ``gpus``), threads, and
    the pool's stop event (``_unless_stopped``)."""
    global _POOL_STOP
    from fedent.experiments.placement import take_slot

    _POOL_STOP = stop
    take_slot(counter, gpus)
    import torch

    torch.set_num_threads(threads)
    _die_with_parent()


@contextmanager
def process_pool(workers: int, threads: int, gpus: Sequence[str] = (),
                 grace_s: float = 15.0) -> Iterator[ProcessPoolExecutor]:
    """The pool of ``workers`` spawned processes (``init_worker``: ``threads`` torch threads each, spread over
    ``gpus``, ended with their parent) that ``run_plan`` and ``fedent tune --workers`` run in. A task loads its
    inputs in the worker (``cached_inputs``): the data is never sent through the pool.

    Left normally, it waits for the tasks still running. Left by an exception (SIGTERM or Ctrl-C raise ``Stopped``
    in the main thread) it stops them instead (``stop_workers``): otherwise the command would hang until every
    running run had trained its last round."""
    ctx = get_context("spawn")
    stop = ctx.Event()
    pool = _StoppablePool(max_workers=workers, mp_context=ctx, initializer=init_worker,
                          initargs=(threads, ctx.Value("i", 0), tuple(gpus), stop), stop_event=stop)
    try:
        yield pool
    except BaseException:
        stop_workers(pool, grace_s)
        raise
    pool.shutdown(wait=True)


def stop_workers(pool: ProcessPoolExecutor, grace_s: float) -> None:
    """Stop the pool's runs as Ctrl-C stops one: nothing queued starts (the futures not yet handed out are
    cancelled, and a task already in a worker's queue finds the stop event set), each worker gets SIGINT (its round
    engine writes status.json ``stopped`` and keeps its checkpoints, so the run resumes), and a worker still alive
    after ``grace_s`` is killed."""
    stop = getattr(pool, "stop_event", None)
    if stop is not None:
        stop.set()
    procs = list(getattr(pool, "_processes", {}).values())  # no public API stops a running task
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(deadline - time.monotonic(), 0.0))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)


def _die_with_parent(poll_s: float = 0.5) -> None:
    """End this pool worker soon after the process that started it dies: a ``fedent reproduce`` killed by a
    timeout or by hand otherwise leaves its workers training on, into run directories a restarted reproduce is
    writing again (seen: a killed medium profile's workers interleaved their rounds into the new runs' logs).

    A daemon thread watches the parent's pid. Not ``PR_SET_PDEATHSIG``: that signal follows the *thread* that
    started the worker, and ``fedent tune --workers`` submits from one thread per algorithm, so a worker was
    killed when the algorithm that happened to start it finished; a worker killed while holding the pool's queue
    lock then hung every other worker and the pool's shutdown for good (CI of 2026-11-27 ran out of time there).
    """
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    if parent == 1:  # the parent died before this worker started
        os._exit(1)
    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def execute_stacked(specs: Sequence[RunSpec], inputs_for: InputsFor | None = None,
                    progress: bool = True) -> list[RunOutcome]:
    """Run ``specs`` side by side in this process, one thread each, their clients trained in one vectorised step
    (``fedent.rounds.stacking``: each run's results are the ones it gets alone). One spec runs as ``execute``."""
    from fedent.rounds.stacking import side_by_side

    if len(specs) == 1:
        return [_execute_safely(specs[0], inputs_for, progress)]
    got = side_by_side([functools.partial(execute, s, inputs_for, progress) for s in specs], "stacked-run")
    return [o if isinstance(o, RunOutcome) else
            RunOutcome(s.key, "failed", 0.0, None, traceback.format_exception_only(type(o), o)[-1].strip())
            for o, s in zip(got, specs, strict=True)]


def stackable(spec: RunSpec) -> str | None:
    """The key of the runs ``spec`` may train in one step with (``fedent.rounds.stacking.stack_key``), or None
    where it cannot stack (``can_stack``: a sequential executor, dropout) or its config does not parse (it runs
    alone and fails with its own error)."""
    from fedent.rounds.stacking import can_stack, stack_key

    try:
        cfg = config_from_dict(spec.config)
        return stack_key(cfg) if can_stack(cfg) else None
    except (ConfigError, ValueError, KeyError, TypeError):
        return None


def _open_group(groups: list[list[RunSpec]], spec: RunSpec, stack: int) -> list[RunSpec] | None:
    """The group ``spec`` joins: the first with room whose runs share its stack key (``stackable``), or None (a
    run that cannot stack, or no such group: it starts a group of its own)."""
    key = stackable(spec) if stack > 1 else None
    if key is None:
        return None
    return next((g for g in groups if len(g) < stack and stackable(g[0]) == key), None)


def _execute_group_safely(specs: tuple[RunSpec, ...]) -> list[RunOutcome]:
    """Pool entry point of a group of stacked runs."""
    return execute_stacked(specs)


def _execute_safely(spec: RunSpec, inputs_for: InputsFor | None = None, progress: bool = True) -> RunOutcome:
    """Pool entry point: an unexpected crash of one run becomes a failed outcome, not a dead pool."""
    try:
        return execute(spec, inputs_for, progress)
    except Exception as e:  # noqa: BLE001 - reported per run, the others go on
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return RunOutcome(spec.key, "failed", 0.0, None, last)


def _cut_short(pool: ProcessPoolExecutor, futures: dict[Future[list[RunOutcome]], tuple[RunSpec, ...]],
               status: dict[str, str]) -> Iterator[RunOutcome]:
    """End the runs still going when a time budget is spent: their workers are stopped at once (no grace: the
    budget is spent; a run's directory keeps the rounds it logged and its checkpoints, so a later call with more
    time resumes it), and each is reported as cut short, its rounds read once its worker is gone."""
    stop_workers(pool, grace_s=0.0)
    for fut, group in list(futures.items()):
        futures.pop(fut)
        for spec in group:
            status[spec.key] = "cut short"
            rounds = len(runlog.read_metrics(runlog.RunPaths(spec.run_dir).metrics))
            yield RunOutcome(spec.key, "cut short", 0.0, None, f"the time budget ended it after {rounds} of "
                             f"{spec.rounds} rounds")


def _unmet(spec: RunSpec) -> str:
    return f"needs {', '.join(spec.after)}, which failed or did not run"


class Admission(Protocol):
    """What ``run_plan`` asks before starting a run (``budget.TimeBudget``): None to start it, else why not."""

    def admit(self, spec: RunSpec, running: Sequence[RunSpec] = ()) -> str | None: ...

    def finished(self, spec: RunSpec, status: str) -> None: ...

    def time_left(self) -> float: ...


def run_plan(plan: Plan, workers: int = 2, threads: int = 1, inputs_for: InputsFor | None = None,
             budget: Admission | None = None, gpus: Sequence[str] = (), stack: int = 1) -> Iterator[RunOutcome]:
    """Execute the plan's runs in order, yielding outcomes as runs finish.

    ``workers`` > 1 uses a process pool (spawned, each with ``threads`` torch threads): on a small CPU box
    independent runs in separate processes beat one process with more threads (see docs/results.md).
    ``budget``: a run starts only when it admits it; a run it never admits ends as ``not run`` with the reason
    (with a pool, a refused run waits and is asked again as slots free up, so a faster measured rate can
    still admit it). ``gpus``: device ids the pool's workers are spread over, one each, round-robin (a single
    worker trains where the process already is). ``stack``: up to this many ready runs of one setting
    (``fedent.rounds.stacking.stack_key``) run in one worker side by side, their clients trained in one
    vectorised step (``execute_stacked``); a group counts as one worker's task.
    """
    if workers < 1 or threads < 1:
        raise ConfigError("--workers/--threads: must be >= 1")
    if stack < 1:
        raise ConfigError("--stack: must be >= 1")
    if workers == 1:
        init_worker(threads)
        yield from _run_here(plan, inputs_for, budget, stack)
        return
    if inputs_for is not None:
        raise ConfigError("injected inputs need workers=1 (they are not sent to worker processes)")
    with process_pool(workers, threads, gpus) as pool:
        # a run waits for the runs it replays (``after``); the others are submitted in plan order, and with a
        # budget only as workers free up (so that it decides with the latest rate)
        waiting = list(plan.runs)
        status: dict[str, str] = {}
        refused: dict[str, str] = {}
        futures: dict[Future[list[RunOutcome]], tuple[RunSpec, ...]] = {}

        def running() -> list[RunSpec]:
            return [s for g in futures.values() for s in g]

        def release() -> Iterator[RunOutcome]:
            # ready runs into groups of one stack key as they come (``_open_group``); with a budget, no more
            # groups than free workers, so that every admitted run starts now
            groups: list[list[RunSpec]] = []
            free = workers - len(futures) if budget is not None else None
            for spec in list(waiting):
                deps = [status.get(k) for k in spec.after]
                if any(d in _BAD for d in deps):
                    waiting.remove(spec)
                    status[spec.key] = "failed"
                    yield RunOutcome(spec.key, "failed", 0.0, None, _unmet(spec))
                elif all(d is not None for d in deps):
                    group = _open_group(groups, spec, stack)
                    if group is None and free is not None and len(groups) >= free:
                        continue  # no worker for a new group (a later run may still join an open one)
                    why = budget.admit(spec, running() + [s for g in groups for s in g]) if budget is not None \
                        else None
                    if why is not None:
                        refused[spec.key] = why
                        continue
                    waiting.remove(spec)
                    if group is None:
                        groups.append([spec])
                    else:
                        group.append(spec)
            for g in groups:
                futures[pool.submit(_execute_group_safely, tuple(g))] = tuple(g)
        try:
            yield from release()
            while futures:
                left = budget.time_left() if budget is not None else None
                finished, _ = wait(list(futures), timeout=None if left is None else max(left, 0.0),
                                   return_when=FIRST_COMPLETED)
                if not finished:  # the budget is spent: stop the runs still going, report them cut short
                    yield from _cut_short(pool, futures, status)
                    refused.update({s.key: "the time budget ended before it started" for s in waiting})
                    break
                for done in finished:
                    group = futures.pop(done)
                    for spec, o in zip(group, done.result(), strict=True):
                        status[o.key] = o.status
                        if budget is not None:
                            budget.finished(spec, o.status)
                        yield o
                yield from release()
            for spec in waiting:  # never admitted (or waiting on a run that was not)
                status[spec.key] = "not run"
                yield RunOutcome(spec.key, "not run", 0.0, None, refused.get(spec.key, "not admitted"))
        except BaseException:
            for f in futures:
                f.cancel()
            raise


_BAD = ("failed", "not run", "cut short", "diverged")


def _run_here(plan: Plan, inputs_for: InputsFor | None, budget: Admission | None,
              stack: int) -> Iterator[RunOutcome]:
    """``run_plan`` in this process: in plan order (a replayed run comes before its replay), the first waiting run
    with up to ``stack`` - 1 later runs of its stack key whose prerequisites ended well, side by side."""
    pending = list(plan.runs)
    status: dict[str, str] = {}
    while pending:
        head = pending.pop(0)
        why = budget.admit(head) if budget is not None else None
        if why is not None or any(status.get(d) in _BAD for d in head.after):
            o = RunOutcome(head.key, "not run", 0.0, None, why) if why is not None else \
                RunOutcome(head.key, "failed", 0.0, None, _unmet(head))
            status[o.key] = o.status
            yield o
            continue
        group = [head]
        key = stackable(head) if stack > 1 else None
        for spec in list(pending):
            if key is None or len(group) >= stack:
                break
            if stackable(spec) != key or not all(status.get(d) not in (None, *_BAD) for d in spec.after):
                continue
            if budget is not None and budget.admit(spec, group) is not None:
                continue  # asked again when it is the first waiting run
            pending.remove(spec)
            group.append(spec)
        outs = [execute(head, inputs_for)] if len(group) == 1 else execute_stacked(group, inputs_for)
        for spec, o in zip(group, outs, strict=True):
            if budget is not None:
                budget.finished(spec, o.status)
            status[o.key] = o.status
            yield o
