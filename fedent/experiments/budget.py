"""A wall-clock budget for ``fedent reproduce``, re-planned while the runs go (``--budget-s``).

A lent GPU gives one call of a few minutes, and the rate a machine trains at is known only once it trains. So
the plan is first trimmed by ``drop_order`` to what the *estimated* rate fits, and re-trimmed each time a
worker is free, at the rate *measured* so far (client steps of the runs finished in this call, plus the logged
rounds of the running ones, over the elapsed time): a faster machine gets dropped (setting, seed) units back in
reverse drop order, a slower one loses units not yet started (a unit with a started run is kept, so that its
table can be finished). Units are always dropped in the documented order,
and a run is started only when it is expected to finish within the budget. When the budget ends, runs still
going are cut short (their processes killed); everything not run or cut short is reported with why, never
silently left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedent import runlog
from fedent.experiments.plan import Plan, RunSpec, client_steps, trim_plan
from fedent.experiments.reproduce import settled

WARMUP_S = 60.0  # before this, the estimate stands: process start and data loading would read as a slow rate


@dataclass
class TimeBudget:
    plan: Plan  # the whole plan, untrimmed
    budget_s: float
    steps_per_s: float  # the starting estimate, all workers together
    workers: int
    clock: Callable[[], float] = time.monotonic
    warmup_s: float = WARMUP_S
    started: float = field(init=False, default=0.0)
    done_steps: int = field(init=False, default=0)  # client steps of runs trained (not skipped) in this call
    free: set[str] = field(init=False, default_factory=set)  # settled before the call: cost nothing now
    dropped: list[tuple[str, int]] = field(init=False, default_factory=list)  # the current trim's units
    started_units: set[tuple[str, int]] = field(init=False, default_factory=set)  # never dropped again
    _costs: dict[str, int] = field(init=False, default_factory=dict)
    _plan_key: tuple[Any, ...] | None = field(init=False, default=None)  # what the current rate and trim saw
    _rate: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or self.steps_per_s <= 0 or self.workers < 1:
            raise ValueError("a time budget needs budget_s > 0, steps_per_s > 0 and workers >= 1")
        self.free = {s.key for s in self.plan.runs if settled(s)}
        self._costs = {s.key: 0 if s.key in self.free else client_steps(s.config) for s in self.plan.runs}
        # a unit an earlier call began counts as started: its table is finished before new units are begun
        self.started_units = {(s.setting, s.seed) for s in self.plan.runs if s.key in self.free}
        self.started = self.clock()
        self.dropped = self._trim(self.steps_per_s)

    def cost(self, spec: RunSpec) -> int:
        return self._costs[spec.key]

    def elapsed(self) -> float:
        return self.clock() - self.started

    def measured(self, running: Sequence[RunSpec] = ()) -> float | None:
        """Client steps per second so far, all workers together (None before any logged progress)."""
        progress = self.done_steps + sum(self._progress(s) for s in running)
        return progress / self.elapsed() if progress > 0 and self.elapsed() > 0 else None

    def rate(self, running: Sequence[RunSpec] = ()) -> float:
        """The rate plans use: measured once past the warm-up (and once anything was logged), else the estimate."""
        got = self.measured(running) if self.elapsed() >= self.warmup_s else None
        return self.steps_per_s if got is None else got

    def admit(self, spec: RunSpec, running: Sequence[RunSpec] = ()) -> str | None:
        """None when ``spec`` may start now, else why not (re-trimmed at the current rate first)."""
        if spec.key in self.free:
            return None  # complete already: reproduce skips it at no cost
        rate = self._replan(running)
        if (spec.setting, spec.seed) in self.dropped:
            return f"setting {spec.setting}, seed {spec.seed} dropped to fit --budget-s {self.budget_s:g}"
        left = self.time_left()
        need = self.cost(spec) / (rate / self.workers)
        if need > left:
            return (f"would not finish within --budget-s {self.budget_s:g} (about {need:.0f} s at "
                    f"{rate / self.workers:.0f} steps/s per worker, {max(left, 0):.0f} s left)")
        self.started_units.add((spec.setting, spec.seed))
        return None

    def time_left(self) -> float:
        """Seconds until the budget ends; then the runs still going are cut short (``run_plan``)."""
        return self.budget_s - self.elapsed()

    def finished(self, spec: RunSpec, status: str) -> None:
        if status == "done":
            self.done_steps += self.cost(spec)

    def _replan(self, running: Sequence[RunSpec]) -> float:
        """The rate and trim, measured again only when something changed (a run finished or started, a unit
        was begun) or a second passed: ``run_plan`` asks about every waiting run each time a worker frees, and
        measuring reads the running runs' logs."""
        key = (self.done_steps, tuple(s.key for s in running), len(self.started_units))
        now = self.clock()
        if self._plan_key is None or key != self._plan_key[0] or now - self._plan_key[1] >= 1.0:
            self._rate = self.rate(running)
            self.dropped = self._trim(self._rate)
            self._plan_key = (key, now)
        return self._rate

    def _trim(self, rate: float) -> list[tuple[str, int]]:
        # a unit with a started run stays: dropping it would waste its finished runs and leave its table partial
        # (on the H100 a falling measured rate dropped a half-run setting again)
        return trim_plan(self.plan, int(rate * self.budget_s), cost=self.cost, keep=self.started_units)[1]

    def _progress(self, spec: RunSpec) -> float:
        """The client steps a running run has logged (rounds done / rounds of its cost)."""
        rounds = len(runlog.read_metrics(runlog.RunPaths(spec.run_dir).metrics))
        return self.cost(spec) * min(rounds, spec.rounds) / max(spec.rounds, 1)
