"""Fair tuning on a validation split, with bracketed grids (issue 29, item 3): ``fedent tune``.

Every algorithm gets the same search, scored on the validation set only (``data.validation_fraction``, carved
per client by fedent.data.validation; every tuning run has ``train.evaluate_test: false``, so the test set is
never evaluated while tuning). The score of a point is the mean validation accuracy of the last ``tail_k``
evaluated rounds, averaged over the tuning seeds; a run that diverges scores below every finite one.

The search is one pass of coordinate search: the knobs of an algorithm (its rate first, then its own options,
``KNOBS``) are tuned one at a time, each with the values chosen so far for the others. A knob's grid is
*bracketed* when its best value has a tried value on both sides; when the best is at an edge the grid is
extended one step in that direction (``step``), at most ``max_extend`` times and never past the knob's domain,
and the report says, for every knob, whether its optimum is bracketed and, if not, why. ``--knobs`` tunes a
subset (a full FedEnt search is 7+ runs, its base rate alone 3+); the rest stay at the base config's value, are
still named in every point (so when the knobs tuned are the first ones, e.g. the rate, the runs are the ones a full
search trains first) and are reported as not tuned; ``Tuned`` does not read them back as tuned values.

With a pool (``fedent tune --workers N``) the same search runs in N worker processes: the algorithms are tuned
concurrently (``tune_all``: a thread each; each algorithm's knobs stay in order), and a knob's untried values
(× the seeds) are run at once; an extension past an edge is still decided on the results so far. Every point's
config, run dir and score are the sequential search's, so the chosen values and tuned.json do not depend on N.

The chosen values go to ``tuned.json``; ``fedent compare --tuned tuned.json`` reads them, trains on the same
training part (the validation samples stay held out) and evaluates the test set: the only time it is used.

Why over 400 lines: tuned.json's writer (``write_tuned``) and its reader (``Tuned``) are one format, kept beside
the search that defines its content; the pooled search shares every point's config, name and score with the
sequential one, which is what makes the result independent of ``--workers``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, CancelledError, Executor, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fedent import runlog
from fedent.config import ConfigError, ExperimentConfig, TrainConfig, apply_overrides, config_from_dict, options_class
from fedent.experiments import paired
from fedent.experiments import reuse as earlier_runs
from fedent.inputs import RunInputs, load_inputs

if TYPE_CHECKING:
    from fedent.rounds.stacking import StackSeat

Scale = Literal["log", "log1m"]  # log: x × factor per step; log1m: (1 − x) × factor per step (β, γ near 1)
TUNED_VERSION = 1


@dataclass(frozen=True)
class Knob:
    """One tuned value: a dotted config key (``train.lr`` or ``algorithm.<option>``) and its starting grid."""

    key: str
    grid: tuple[float, ...]
    scale: Scale = "log"
    factor: float = 3.0  # the step when the grid is extended
    lo: float = 0.0  # the domain (lo, hi), open unless closed_lo/closed_hi: an extension that leaves it is not made
    hi: float = math.inf
    closed_lo: bool = False  # lo itself allowed (an option's ``ge`` above 0: train.local_epochs ≥ 1)
    closed_hi: bool = False  # hi itself allowed (an option's ``le`` on the log scale: train.fraction ≤ 1)

    def step(self, value: float, up: bool) -> float:
        """The next value beyond ``value`` upwards or downwards on this knob's scale."""
        if self.scale == "log":
            return float(f"{(value * self.factor if up else value / self.factor):.12g}")
        nxt = 1.0 - (1.0 - value) / self.factor if up else 1.0 - (1.0 - value) * self.factor
        return round(nxt, 12)  # 1 − 0.1 × 10 is 0, not 2e-16: the domain test must see the limit

    def inside(self, value: float) -> bool:
        above = self.lo < value or (self.closed_lo and value == self.lo)
        return above and (value < self.hi or (self.closed_hi and value == self.hi))

    def domain(self) -> str:
        return f"{'[' if self.closed_lo else '('}{self.lo:g}, {self.hi:g}{']' if self.closed_hi else ')'}"


def _rate(values: tuple[float, ...] = (0.003, 0.01, 0.03)) -> Knob:
    return Knob("train.lr", values, "log", 3.0)


def _near_one(key: str) -> Knob:
    return Knob(key, (0.9, 0.99, 0.999), "log1m", 10.0, 0.0, 1.0)


# What each algorithm tunes, rate first (FedEnt's rate is its base rate η_i(−1)); the paper's value of each
# option is the middle of its grid. Algorithms not listed tune their rate only.
KNOBS: dict[str, tuple[Knob, ...]] = {
    "fedavg": (_rate(),),
    "fedent": (_rate(), _near_one("algorithm.beta"), _near_one("algorithm.gamma")),
    "fedprox": (_rate(), Knob("algorithm.mu", (0.001, 0.01, 0.1), "log", 10.0)),
    "feddyn": (_rate(), Knob("algorithm.alpha", (1e-4, 1e-3, 1e-2), "log", 10.0)),
    "fedadam": (_rate(), Knob("algorithm.server_lr", (0.001, 0.01, 0.1), "log", 10.0)),
    "fedyogi": (_rate(), Knob("algorithm.server_lr", (0.001, 0.01, 0.1), "log", 10.0)),
}


# Scores this close are one score. A score is a mean of accuracies, so two different ones differ by at least
# 1 / (validation samples × tail_k × seeds) (1.1e-6 for MNIST's 6,000, 5 rounds, 3 seeds; above TIE unless that
# product passes 1e9), while equal ones summed from other rounds' accuracies can differ in the last bits (MNIST:
# 0.9752666666666666 and 0.9752666666666668, both 29,258 of 30,000 validation predictions right).
TIE = 1e-9


def best_of(scores: Mapping[float, float]) -> float:
    """The value with the highest score; ties (within ``TIE``): the smaller value."""
    top = max(scores.values())
    return min(v for v, s in scores.items() if s >= top - TIE)


@dataclass
class KnobResult:
    key: str
    tried: dict[float, float | None] = field(default_factory=dict)  # value -> score (None: diverged/failed)
    best: float | None = None
    bracketed: bool = False
    why: str = ""
    extensions: int = 0
    tuned: bool = True  # False: left out by ``--knobs``, held at the base config's value
    per_seed: dict[float, list[float | None]] = field(default_factory=dict)  # value -> each tuning seed's score

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "tried": [[v, s] for v, s in sorted(self.tried.items())], "best": self.best,
                "bracketed": self.bracketed, "why": self.why, "extensions": self.extensions, "tuned": self.tuned,
                "per_seed": [[v, s] for v, s in sorted(self.per_seed.items())]}

    def seed_choices(self) -> list[float | None]:
        """The value each tuning seed alone would choose among the values tried (ties: the smaller; None: that
        seed diverged everywhere): whether the seeds agree with the mean's choice."""
        n = max((len(s) for s in self.per_seed.values()), default=0)
        out: list[float | None] = []
        for j in range(n):
            ok: dict[float, float] = {v: x for v, per in self.per_seed.items() if (x := per[j]) is not None}
            out.append(None if not ok else best_of(ok))
        return out


@dataclass
class AlgorithmTuning:
    algorithm: str
    chosen: dict[str, float]
    score: float | None
    knobs: list[KnobResult]
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "chosen": self.chosen, "score": self.score,
                "knobs": [k.to_dict() for k in self.knobs], "runs": self.runs}


def knobs_for(algorithm: str, grids: Mapping[str, Sequence[float]] | None = None) -> tuple[Knob, ...]:
    """The algorithm's knobs; ``grids`` replaces starting grids: ``train.lr`` (every algorithm) or
    ``fedprox.algorithm.mu`` (one algorithm; wins over the plain key). A key the algorithm does not tune by
    default becomes a knob of its own (log scale, factor 3, inside the option's declared range: ``_grid_knob``)."""
    mine: dict[str, tuple[float, ...]] = {}
    for key, values in (grids or {}).items():
        head, _, rest = key.partition(".")
        if head in ("train", "algorithm"):
            mine.setdefault(key, tuple(sorted(values)))
        elif head == algorithm:
            mine[rest] = tuple(sorted(values))
    own = KNOBS.get(algorithm, (_rate(),))
    out = [dataclasses.replace(k, grid=mine.pop(k.key)) if k.key in mine else k for k in own]
    out += [_grid_knob(algorithm, key, values) for key, values in mine.items()]
    for k in out:
        if len(k.grid) < 2 or len(set(k.grid)) != len(k.grid) or any(not k.inside(v) for v in k.grid):
            raise ConfigError(f"--grid {algorithm}.{k.key}: needs at least two distinct values inside {k.domain()}")
    return tuple(out)


def point_config(base: ExperimentConfig, algorithm: str, values: Mapping[str, float], fraction: float, *,
                 tuning: bool) -> ExperimentConfig:
    """``base`` for ``algorithm`` with ``values`` (dotted keys) set; validation carved at ``fraction``; the test
    set sealed when ``tuning``."""
    raw = base.to_dict()
    if raw["algorithm"].get("name") != algorithm:
        raw["algorithm"] = {"name": algorithm}
    sets = [f"{k}={json.dumps(v)}" for k, v in values.items()]
    sets += [f"data.validation_fraction={fraction!r}", f"train.evaluate_test={'false' if tuning else 'true'}"]
    return config_from_dict(apply_overrides(raw, sets))


def val_score(records: Sequence[Mapping[str, Any]], k: int) -> float | None:
    """Mean validation accuracy over the last ``k`` evaluated rounds (None: never scored)."""
    accs = [float(r["val_acc"]) for r in records if r.get("val_acc") is not None]
    return sum(accs[-k:]) / len(accs[-k:]) if accs else None


RunFn = Callable[[ExperimentConfig, Path, RunInputs], "Sequence[Mapping[str, Any]] | None"]


def simulate_point(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs,
                   seat: StackSeat | None = None) -> Sequence[Mapping[str, Any]] | None:
    """One tuning run (read back when it finished before with this config, continued from its newest checkpoint
    when it was cut short); None when it diverged or failed. ``seat``: it trains side by side with other points
    (``run_stacked``)."""
    try:
        return _simulate_point(cfg, run_dir, inputs, seat)
    finally:
        if seat is not None:
            seat.leave()


def _simulate_point(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs,
                    seat: StackSeat | None) -> Sequence[Mapping[str, Any]] | None:
    from fedent.experiments.reproduce import diverged, is_complete, prepare_run_dir, same_config
    from fedent.rounds.engine import RoundPolicy
    from fedent.sim.simulator import SimulationError, run_simulation

    if run_dir.exists() and same_config(run_dir, cfg.to_dict()):
        if is_complete(run_dir, cfg.train.rounds):
            return runlog.read_metrics(runlog.RunPaths(run_dir).metrics)
        if diverged(run_dir) is not None:
            return None
    # a point an interrupted search left half-trained goes on from its newest checkpoint, as reproduce's runs do
    resume = prepare_run_dir(run_dir, cfg, run_dir.name)
    try:
        return run_simulation(cfg, run_dir, progress=False, inputs=inputs, plots=False, seat=seat,
                              policy=RoundPolicy(checkpoint_keep=2), resume=resume).records
    except SimulationError:  # diverged (a model went non-finite) or the strategy gave up: scores below any run
        return None


InputsFor = Callable[[ExperimentConfig], RunInputs]


def run_in_worker(run: RunFn, inputs_for: InputsFor | None, cfg: ExperimentConfig,
                  run_dir: Path) -> Sequence[Mapping[str, Any]] | None:
    """A pool task: one tuning run, its inputs loaded here (the data is never sent through the pool), cached per
    data key across the worker's runs (``fedent.experiments.reproduce.cached_inputs``) unless ``inputs_for``."""
    from fedent.experiments.reproduce import cached_inputs, inputs_key

    inputs = inputs_for(cfg) if inputs_for is not None else cached_inputs(inputs_key(cfg.to_dict()))
    return run(cfg, run_dir, inputs)


Job = tuple[ExperimentConfig, Path]


def run_stacked(run: RunFn, jobs: Sequence[tuple[ExperimentConfig, Path, RunInputs]]) -> list[Any]:
    """Tuning runs side by side in this process, one thread each, their clients trained in one vectorised step
    (``fedent.rounds.stacking``; each run's records are the ones it gets alone). ``run`` takes the seat as its fourth
    argument (``simulate_point`` does). The first error of a run is raised once every run has ended."""
    if len(jobs) == 1:
        return [run(*jobs[0])]
    from fedent.rounds.stacking import side_by_side

    got = side_by_side([functools.partial(run, *job) for job in jobs], "tune-stacked")  # seat: the 4th argument
    for o in got:
        if isinstance(o, BaseException):
            raise o
    return got


def run_group_in_worker(run: RunFn, inputs_for: InputsFor | None, jobs: Sequence[Job]) -> list[Any]:
    """A pool task: tuning runs stacked in one worker (``run_stacked``), each one's inputs loaded here."""
    from fedent.experiments.reproduce import cached_inputs, inputs_key

    return run_stacked(run, [(cfg, run_dir, inputs_for(cfg) if inputs_for is not None else
                              cached_inputs(inputs_key(cfg.to_dict()))) for cfg, run_dir in jobs])


class TuningAborted(RuntimeError):
    """Another algorithm's search failed: this one stops at its next point."""


class Tuner:
    """The search for one base config: runs (cached per point), knobs in turn, bracketing."""

    def __init__(self, base: ExperimentConfig, seeds: Sequence[int], out: Path, *, fraction: float = 0.1,
                 tail_k: int = paired.TAIL_K, max_extend: int = 2, run: RunFn = simulate_point,
                 inputs_for: InputsFor | None = None, log: Callable[[str], None] | None = None,
                 pool: Executor | None = None, stack: int = 1, reuse: Sequence[Path] = ()) -> None:
        """``inputs_for``: a run's data, partition and model (default: the configured ones, loaded once per seed,
        or once per worker with a ``pool``). ``pool``: run the points there (``run`` and ``inputs_for`` must
        then reach its workers: module-level functions for a process pool). ``stack``: up to this many runs of a
        batch of points train side by side, their clients in one vectorised step (``run_stacked``). ``reuse``:
        earlier searches' output directories whose settled runs of a point's config are read back, not trained
        (fedent.experiments.reuse)."""
        if stack < 1:
            raise ConfigError("--stack: must be >= 1")
        self.stack, self.reuse = stack, [Path(p) for p in reuse]
        for earlier in self.reuse:
            if not (earlier / "runs").is_dir():
                raise ConfigError(f"--reuse {earlier}: not a search's output directory (it has no runs/)")
        if not 0 < fraction < 1:
            raise ConfigError(f"--validation-fraction: must be in (0, 1), got {fraction}")
        if max_extend < 0:
            raise ConfigError("--max-extend: must be >= 0")
        self.base, self.seeds, self.out = base, [int(s) for s in seeds], out
        self.fraction, self.tail_k, self.max_extend = fraction, tail_k, max_extend
        self.run, self.inputs_for, self.log, self.pool = run, inputs_for, log, pool
        self._inputs: dict[int, RunInputs] = {}
        self._scores: dict[tuple[str, str], float | None] = {}
        self._seed_scores: dict[tuple[str, str], list[float | None]] = {}  # each seed's, in seed order
        self._algorithm_runs: dict[str, int] = {}
        self._lock = threading.Lock()  # the score cache and the run counters, shared by tune_all's threads
        self._outstanding: set[Future[Any]] = set()
        self._aborted = False

    def _inputs_of(self, cfg: ExperimentConfig) -> RunInputs:
        seed = int(cfg.train.seed)
        if seed not in self._inputs:  # the data and its split depend on the seed only, not on the tuned values
            self._inputs[seed] = (self.inputs_for or load_inputs)(cfg)
        return self._inputs[seed]

    def _point(self, algorithm: str, values: Mapping[str, float], seed: int) -> tuple[ExperimentConfig, Path]:
        """One seed of a point: its config and run directory (an earlier search's run of that config copied in
        first when ``reuse`` holds one and the directory is absent)."""
        cfg = point_config(self.base, algorithm, values, self.fraction, tuning=True)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed),
                                  name=f"{self.base.name}-tune-{algorithm}")
        run_dir = self.out / "runs" / algorithm / f"{_point_name(values)}-s{seed}"
        if self.reuse and not run_dir.exists():
            src = earlier_runs.adopt(run_dir, cfg.to_dict(), cfg.train.rounds,
                                     earlier_runs.candidates(self.reuse, algorithm, seed))
            if src is not None and self.log is not None:
                self.log(f"tune {algorithm}: {run_dir.name}: read back from {src}")
        return cfg, run_dir

    @property
    def runs(self) -> int:
        """Runs this tuner started or read back, all algorithms together."""
        with self._lock:
            return sum(self._algorithm_runs.values())

    def _counted(self, algorithm: str) -> None:
        with self._lock:
            self._algorithm_runs[algorithm] = self._algorithm_runs.get(algorithm, 0) + 1

    def _scored(self, algorithm: str, values: Mapping[str, float], scores: Sequence[float | None]) -> float | None:
        """The point's score from its seeds' (in seed order), logged and cached."""
        got = None if any(s is None for s in scores) else sum(s for s in scores if s is not None) / len(scores)
        if self.log is not None:
            shown = "diverged" if got is None else f"{100 * got:.2f}%"
            if len(scores) > 1:
                shown += " (seeds " + ", ".join("diverged" if x is None else f"{100 * x:.2f}%" for x in scores) + ")"
            self.log(f"tune {algorithm}: {_point_name(values)}: validation {shown}")
        with self._lock:
            self._scores[_score_key(algorithm, values)] = got
            self._seed_scores[_score_key(algorithm, values)] = list(scores)
        return got

    def seed_scores(self, algorithm: str, values: Mapping[str, float]) -> list[float | None]:
        """A scored point's score on each tuning seed, in seed order."""
        with self._lock:
            return list(self._seed_scores[_score_key(algorithm, values)])

    def score(self, algorithm: str, values: Mapping[str, float]) -> float | None:
        """The point's score over the tuning seeds (None when any seed diverged or never scored)."""
        return self.score_many(algorithm, [values])[0]

    def score_many(self, algorithm: str, points: Sequence[Mapping[str, float]]) -> list[float | None]:
        """The points' scores: one after the other in this process, or all their runs at once in the pool."""
        if self.pool is not None:
            return self._score_pooled(algorithm, points)
        if self.stack > 1:
            return self._score_stacked(algorithm, points)
        out = []
        for values in points:
            key = _score_key(algorithm, values)
            if key in self._scores:
                out.append(self._scores[key])
                continue
            scores = []
            for seed in self.seeds:
                cfg, run_dir = self._point(algorithm, values, seed)
                recs = self.run(cfg, run_dir, self._inputs_of(cfg))
                self._counted(algorithm)
                scores.append(None if recs is None else val_score(recs, self.tail_k))
            out.append(self._scored(algorithm, values, scores))
        return out

    def _todo(self, algorithm: str, points: Sequence[Mapping[str, float]]) -> list[tuple[int, int, Job]]:
        """Every seed of every uncached point (a point listed twice once): (point, seed index, job)."""
        keys = [_score_key(algorithm, v) for v in points]
        return [(i, j, self._point(algorithm, points[i], seed)) for i, k in enumerate(keys)
                if k not in self._scores and keys.index(k) == i for j, seed in enumerate(self.seeds)]

    def _groups(self, todo: Sequence[tuple[int, int, Job]]) -> list[list[tuple[int, int, Job]]]:
        """``stack`` runs to a group where they can stack (``fedent.rounds.stacking.can_stack``), else one."""
        from fedent.rounds.stacking import can_stack

        k = self.stack if all(can_stack(cfg) for _, _, (cfg, _) in todo) else 1
        return [list(todo[lo:lo + k]) for lo in range(0, len(todo), k)]

    def _score_stacked(self, algorithm: str, points: Sequence[Mapping[str, float]]) -> list[float | None]:
        """The batch's runs in this process, ``stack`` at a time side by side; each point scored once its seeds
        have run."""
        todo = self._todo(algorithm, points)
        recs: dict[tuple[int, int], Any] = {}
        for group in self._groups(todo):
            got = run_stacked(self.run, [(cfg, run_dir, self._inputs_of(cfg)) for _, _, (cfg, run_dir) in group])
            for (i, j, _), r in zip(group, got, strict=True):
                recs[i, j] = r
                self._counted(algorithm)
        for i in sorted({i for i, _, _ in todo}):
            scores = [None if recs[i, j] is None else val_score(recs[i, j], self.tail_k)
                      for j in range(len(self.seeds))]
            self._scored(algorithm, points[i], scores)
        return [self._scores[_score_key(algorithm, v)] for v in points]

    def _score_pooled(self, algorithm: str, points: Sequence[Mapping[str, float]]) -> list[float | None]:
        """Submit every seed of every uncached point (``stack`` runs to a task), score each point as its last seed
        finishes (a run that raised is a bug: the others are cancelled and it is raised here)."""
        assert self.pool is not None
        keys = [_score_key(algorithm, v) for v in points]
        futures: dict[Future[Any], list[tuple[int, int]]] = {}  # -> [(point, seed index)]
        seeds: dict[int, list[float | None]] = {}
        with self._lock:
            if self._aborted:
                raise TuningAborted("another algorithm's tuning failed")
            todo = self._todo(algorithm, points)
            for i, _, _ in todo:
                seeds[i] = [None] * len(self.seeds)
            for group in self._groups(todo):
                jobs = [job for _, _, job in group]
                fut = self.pool.submit(run_in_worker, self.run, self.inputs_for, *jobs[0]) if len(jobs) == 1 else \
                    self.pool.submit(run_group_in_worker, self.run, self.inputs_for, jobs)
                futures[fut] = [(i, j) for i, j, _ in group]
            self._outstanding.update(futures)
        left = {i: len(self.seeds) for i in seeds}
        try:
            for fut in as_completed(futures):
                try:
                    got: Any = fut.result()
                except CancelledError:
                    raise TuningAborted("another algorithm's tuning failed") from None
                pairs = futures[fut]
                answers: list[Any] = list(got) if len(pairs) > 1 else [got]
                for (i, j), recs in zip(pairs, answers, strict=True):
                    self._counted(algorithm)
                    seeds[i][j] = None if recs is None else val_score(recs, self.tail_k)
                    left[i] -= 1
                    if left[i] == 0:
                        self._scored(algorithm, points[i], seeds[i])
        finally:
            for fut in futures:
                fut.cancel()
            with self._lock:
                self._outstanding.difference_update(futures)
        with self._lock:
            return [self._scores[k] for k in keys]

    def abort(self) -> None:
        """Stop every search: the runs not yet started are cancelled, and each search ends at its next point."""
        with self._lock:
            self._aborted = True
            for fut in self._outstanding:
                fut.cancel()

    def tune_all(self, algorithms: Sequence[str], grids: Mapping[str, Sequence[float]] | None = None,
                 only: Collection[str] | None = None) -> list[AlgorithmTuning]:
        """Every algorithm's search: in turn, or with a pool each in a thread of its own (all their runs share
        the pool). The first error is raised once the others have stopped. ``only``: the knobs to tune (every
        key a knob of every algorithm: ``check_knobs``)."""
        if only is not None:
            check_knobs(algorithms, grids, only)
        if self.pool is None:
            return [self.tune(a, grids, only) for a in algorithms]
        if len(set(algorithms)) != len(algorithms):
            raise ConfigError(f"--algorithms: {','.join(algorithms)} lists an algorithm twice")
        threads = ThreadPoolExecutor(max_workers=max(len(algorithms), 1), thread_name_prefix="tune")
        try:
            futures = [threads.submit(self.tune, a, grids, only) for a in algorithms]
            wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.done() and f.exception() is not None for f in futures):
                self.abort()
            wait(futures)
        except BaseException:  # SIGTERM or Ctrl-C: waiting for the searches would wait for their running points;
            self.abort()  # the pool's owner stops those (fedent.experiments.reproduce.process_pool)
            threads.shutdown(wait=False, cancel_futures=True)
            raise
        threads.shutdown(wait=True)
        errors = [e for f in futures if (e := f.exception()) is not None]
        if errors:  # the first real error, not a search it stopped
            raise next((e for e in errors if not isinstance(e, TuningAborted)), errors[0])
        return [f.result() for f in futures]

    def tune_knob(self, algorithm: str, knob: Knob, fixed: Mapping[str, float]) -> KnobResult:
        res = KnobResult(knob.key)
        values = sorted(knob.grid)
        while True:
            untried = [v for v in values if v not in res.tried]
            scores = self.score_many(algorithm, [{**fixed, knob.key: v} for v in untried])
            res.tried.update(zip(untried, scores, strict=True))
            res.per_seed.update({v: self.seed_scores(algorithm, {**fixed, knob.key: v}) for v in untried})
            ok = {v: s for v, s in res.tried.items() if s is not None}
            if not ok:
                res.why = "every value diverged"
                return res
            res.best = best_of(ok)
            order = sorted(res.tried)
            i = order.index(res.best)
            if 0 < i < len(order) - 1:
                res.bracketed, res.why = True, "a worse value on either side"
                return res
            up = i == len(order) - 1
            nxt = knob.step(order[-1] if up else order[0], up)
            side = "upper" if up else "lower"
            if not knob.inside(nxt):
                res.why = f"best at the {side} edge, which is the domain's limit"
                return res
            if res.extensions >= self.max_extend:
                res.why = f"best at the {side} edge after {res.extensions} extension(s) (the limit)"
                return res
            res.extensions += 1
            values = [*order, nxt]

    def tune(self, algorithm: str, grids: Mapping[str, Sequence[float]] | None = None,
             only: Collection[str] | None = None) -> AlgorithmTuning:
        """The algorithm's knobs in turn; ``only``: tune just these keys, the others held at the base config's
        value and still named in every point (so tuning the first knobs trains the full search's first runs)."""
        knobs = knobs_for(algorithm, grids)
        chosen: dict[str, float] = {}
        defaults = self._defaults(algorithm, knobs)
        results = []
        start = self._algorithm_runs.get(algorithm, 0)
        for knob in knobs:
            if only is not None and knob.key not in only:
                results.append(KnobResult(knob.key, why="not tuned (--knobs): the base config's value",
                                          tuned=False))
                chosen[knob.key] = defaults[knob.key]
                continue
            fixed = {**defaults, **chosen}
            fixed.pop(knob.key, None)
            res = self.tune_knob(algorithm, knob, fixed)
            results.append(res)
            chosen[knob.key] = res.best if res.best is not None else defaults[knob.key]
        score = self.score(algorithm, chosen)
        return AlgorithmTuning(algorithm, chosen, score, results, self._algorithm_runs.get(algorithm, 0) - start)

    def _defaults(self, algorithm: str, knobs: Sequence[Knob]) -> dict[str, float]:
        """Each knob's value before it is tuned: the base config's (the paper's) value."""
        cfg = point_config(self.base, algorithm, {}, self.fraction, tuning=True)
        raw = cfg.to_dict()
        out = {}
        for k in knobs:
            section, _, name = k.key.partition(".")
            out[k.key] = float(raw[section][name])
        return out


def _grid_knob(algorithm: str, key: str, values: tuple[float, ...]) -> Knob:
    """A knob only ``--grid`` names (FedAdam's β1, FedNorm's γ): its domain is the option's declared range, so an
    extension past an edge stops at what the config accepts instead of failing mid-search (β1 0.99 × 3 would be
    2.97); a range ending at 1 whose grid lies in [0.5, 1) is a decay, stepped on the near-one scale as β, γ are.
    An inclusive bound (``ge``, ``le``) stays in the domain where a step can leave it (not 0 on the log scale)."""
    section, _, name = key.partition(".")
    if section not in ("train", "algorithm"):
        raise ConfigError(f"--grid {key}: tune train.* or algorithm.* keys")
    declared = options_class(algorithm) if section == "algorithm" else TrainConfig
    meta = {f.name: f.metadata for f in dataclasses.fields(declared)}.get(name)
    if meta is None:
        raise ConfigError(f"--grid {algorithm}.{key}: {algorithm} has no option {key!r}")
    gt, ge, lt, le = (meta.get(k) for k in ("gt", "ge", "lt", "le"))
    lo = max([0.0, *(b for b in (gt, ge) if b is not None)])
    hi = min([math.inf, *(b for b in (lt, le) if b is not None)])
    closed_lo = ge is not None and ge == lo > 0  # 0 stays out: a log step cannot leave it
    if hi == 1.0 and all(0.5 <= v < 1.0 for v in values):  # 1 stays out: a step on 1 − x cannot leave it
        return Knob(key, values, "log1m", 10.0, lo, hi, closed_lo)
    return Knob(key, values, lo=lo, hi=hi, closed_lo=closed_lo, closed_hi=le is not None and le == hi)


def check_knobs(algorithms: Sequence[str], grids: Mapping[str, Sequence[float]] | None,
                only: Collection[str]) -> None:
    """``--knobs``: every key a knob of every algorithm tuned (an algorithm tuning none of them would train only
    runs at its config's values and report them as tuned), none given twice, and no ``--grid`` for a knob left
    out (it would be ignored)."""
    keys = list(only)
    if not keys:
        raise ConfigError("--knobs: expected a comma-separated list")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--knobs: duplicate entries in {','.join(keys)}")
    for algorithm in algorithms:
        knobs = [k.key for k in knobs_for(algorithm, grids)]
        missing = [k for k in keys if k not in knobs]
        if missing:
            raise ConfigError(f"--knobs: {', '.join(missing)}: not a knob of {algorithm} (its knobs: "
                              f"{', '.join(knobs)}); tune such algorithms in separate runs")
    for key in grids or {}:
        head, _, rest = key.partition(".")
        knob = rest if head not in ("train", "algorithm") else key
        if knob not in keys and any(knob in [k.key for k in knobs_for(a, grids)] for a in algorithms):
            raise ConfigError(f"--grid {key}: that knob is not tuned (--knobs {','.join(keys)})")


def _point_name(values: Mapping[str, float]) -> str:
    return "_".join(f"{k.split('.')[-1]}{v:.6g}" for k, v in sorted(values.items())) or "defaults"


def _score_key(algorithm: str, values: Mapping[str, float]) -> tuple[str, str]:
    return algorithm, json.dumps(sorted(values.items()))


def write_tuned(path: Path, tuner: Tuner, results: Sequence[AlgorithmTuning]) -> None:
    """tuned.json (read by ``fedent compare --tuned``) and tune.md beside it."""
    runlog.atomic_write_json(path, {
        "version": TUNED_VERSION, "config": tuner.base.to_dict(), "seeds": tuner.seeds,
        "validation_fraction": tuner.fraction, "tail_k": tuner.tail_k, "max_extend": tuner.max_extend,
        "metric": f"validation accuracy, mean of the last {tuner.tail_k} evaluated rounds, mean over the seeds",
        "algorithms": {r.algorithm: r.to_dict() for r in results},
    })
    runlog.atomic_write_text(path.with_name("tune.md"), "\n".join(tune_table(results, tuner)) + "\n")


def tune_table(results: Sequence[AlgorithmTuning], tuner: Tuner) -> list[str]:
    lines = [f"Tuned on the validation split ({tuner.fraction:g} of every client's training samples), seeds "
             f"{', '.join(map(str, tuner.seeds))}; score: mean validation accuracy of the last {tuner.tail_k} "
             "evaluated rounds; the test set was not evaluated.", "",
             "| algorithm | knob | values tried (validation %) | chosen | bracketed |",
             "| --- | --- | --- | ---: | --- |"]
    for r in results:
        for k in r.knobs:
            tried = ", ".join(f"{v:.4g} ({'div.' if s is None else f'{100 * s:.1f}'})" for v, s in
                              sorted(k.tried.items()))
            br = "yes" if k.bracketed else f"no: {k.why}"
            if not k.tuned:
                tried, br = "not tuned (--knobs)", "-"
            lines.append(f"| {r.algorithm} | {k.key} | {tried} | {r.chosen.get(k.key, float('nan')):.4g} | {br} |")
    if len(tuner.seeds) > 1:
        lines += ["", "Each tuning seed's score (validation %) and the value it alone would choose:", "",
                  "| algorithm | knob | value | " + " | ".join(f"seed {s}" for s in tuner.seeds) + " | mean |",
                  "| --- | --- | ---: | " + " | ".join("---:" for _ in tuner.seeds) + " | ---: |"]
        for r in results:
            for k in (k for k in r.knobs if k.tuned):
                for v, per in sorted(k.per_seed.items()):
                    lines.append(f"| {r.algorithm} | {k.key} | {v:.4g} | " + " | ".join(_pct(x) for x in per)
                                 + f" | {_pct(k.tried.get(v))} |")
                alone = " | ".join("none" if c is None else f"**{c:.4g}**" for c in k.seed_choices())
                lines.append(f"| {r.algorithm} | {k.key} | alone chooses | {alone} | **{r.chosen[k.key]:.4g}** |")
    return lines


def _pct(score: float | None) -> str:
    return "div." if score is None else f"{100 * score:.2f}"


@dataclass(frozen=True)
class Tuned:
    """A tuned.json, read back: each algorithm's chosen values and the validation fraction they were tuned on."""

    validation_fraction: float
    chosen: Mapping[str, Mapping[str, float]]
    source: str = ""  # the file it was read from
    sha256: str = ""  # of that file's bytes: names exactly which tuning a run used (fedent reproduce --tuned)
    config: Mapping[str, Any] = field(default_factory=dict)  # the base config it was tuned on

    def problem_mismatch(self, config: Mapping[str, Any]) -> list[str]:
        """The keys that make ``config`` another federated problem than the tuning's (dataset, split, clients,
        participation, model): values tuned there say nothing here. Rounds and subsamples may differ."""
        if not self.config:
            return []
        keys = [("data", "name"), ("data", "partition"), ("data", "num_clients"), ("train", "fraction"),
                ("model", "name")]
        if (config.get("data") or {}).get("partition") == "dirichlet":
            keys += [("data", "alpha"), ("data", "dirichlet_flavour")]
        out = []
        for a, b in keys:
            here, there = (config.get(a) or {}).get(b), (self.config.get(a) or {}).get(b)
            if here != there:
                out.append(f"{a}.{b} {here!r} (tuned on {there!r})")
        return out

    @classmethod
    def read(cls, path: str | Path) -> Tuned:
        try:
            data = Path(path).read_bytes()
            raw = json.loads(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"--tuned {path}: cannot read it ({e})") from None
        if not isinstance(raw, dict) or raw.get("version") != TUNED_VERSION:
            raise ConfigError(f"--tuned {path}: not a tuned.json of version {TUNED_VERSION}")
        algos = raw.get("algorithms") or {}
        try:  # a knob left out by --knobs ("tuned": false) was held at the tuning config's value: not a tuned value
            held = {str(a): {str(k["key"]) for k in v.get("knobs") or [] if k.get("tuned") is False}
                    for a, v in algos.items()}
            chosen = {str(a): {str(k): float(x) for k, x in v["chosen"].items() if str(k) not in held[str(a)]}
                      for a, v in algos.items()}
            fraction = float(raw["validation_fraction"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"--tuned {path}: malformed (needs validation_fraction and each algorithm's "
                              "chosen values)") from None
        base = raw["config"] if isinstance(raw.get("config"), dict) else {}
        return cls(fraction, chosen, str(path), hashlib.sha256(data).hexdigest(), base)

    def for_arm(self, label: str, algorithm: str) -> dict[str, float]:
        """The values of arm ``label`` (its own tuning, else its algorithm's: a control inherits them)."""
        return dict(self.chosen.get(label) or self.chosen.get(algorithm) or {})

    def algorithm_options(self, label: str, algorithm: str) -> dict[str, float]:
        """The arm's tuned ``algorithm.*`` values as strategy options (``beta``, ``mu``, ...)."""
        return {k.partition(".")[2]: v for k, v in self.for_arm(label, algorithm).items()
                if k.startswith("algorithm.")}

    def config_sets(self, label: str, algorithm: str) -> list[str]:
        """``--set`` overrides of every other tuned value of the arm (``train.lr``, ...), plus the validation split
        they were tuned on (every arm of a tuned comparison trains on the same training part, whether or not its
        algorithm was tuned) and the test set evaluated: the one place the test set is used."""
        sets = [f"{k}={json.dumps(v)}" for k, v in self.for_arm(label, algorithm).items()
                if not k.startswith("algorithm.")]
        return [*sets, f"data.validation_fraction={self.validation_fraction!r}", "train.evaluate_test=true"]
