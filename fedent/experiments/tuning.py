"""Fair tuning on a validation split, with bracketed grids (issue 29, item 3): ``fedent tune``.

Every algorithm gets the same search, scored on the validation set only (``data.validation_fraction``, carved
per client by fedent.data.validation; every tuning run has ``train.evaluate_test: false``, so the test set is
never evaluated while tuning). The score of a point is the mean validation accuracy of the last ``tail_k``
evaluated rounds, averaged over the tuning seeds; a run that diverges scores below every finite one.

The search is one pass of coordinate search: the knobs of an algorithm (its rate first, then its own options,
``KNOBS``) are tuned one at a time, each with the values chosen so far for the others. A knob's grid is
*bracketed* when its best value has a tried value on both sides; when the best is at an edge the grid is
extended one step in that direction (``step``), at most ``max_extend`` times and never past the knob's domain,
and the report says, for every knob, whether its optimum is bracketed and, if not, why.

The chosen values go to ``tuned.json``; ``fedent compare --tuned tuned.json`` reads them, trains on the same
training part (the validation samples stay held out) and evaluates the test set: the only time it is used.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fedent import runlog
from fedent.config import ConfigError, ExperimentConfig, apply_overrides, config_from_dict
from fedent.experiments import paired
from fedent.inputs import RunInputs, load_inputs

Scale = Literal["log", "log1m"]  # log: x × factor per step; log1m: (1 − x) × factor per step (β, γ near 1)
TUNED_VERSION = 1


@dataclass(frozen=True)
class Knob:
    """One tuned value: a dotted config key (``train.lr`` or ``algorithm.<option>``) and its starting grid."""

    key: str
    grid: tuple[float, ...]
    scale: Scale = "log"
    factor: float = 3.0  # the step when the grid is extended
    lo: float = 0.0  # the open domain (lo, hi): an extension that leaves it is not made
    hi: float = math.inf

    def step(self, value: float, up: bool) -> float:
        """The next value beyond ``value`` upwards or downwards on this knob's scale."""
        if self.scale == "log":
            return float(f"{(value * self.factor if up else value / self.factor):.12g}")
        nxt = 1.0 - (1.0 - value) / self.factor if up else 1.0 - (1.0 - value) * self.factor
        return round(nxt, 12)  # 1 − 0.1 × 10 is 0, not 2e-16: the domain test must see the limit

    def inside(self, value: float) -> bool:
        return self.lo < value < self.hi


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


@dataclass
class KnobResult:
    key: str
    tried: dict[float, float | None] = field(default_factory=dict)  # value -> score (None: diverged/failed)
    best: float | None = None
    bracketed: bool = False
    why: str = ""
    extensions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "tried": [[v, s] for v, s in sorted(self.tried.items())], "best": self.best,
                "bracketed": self.bracketed, "why": self.why, "extensions": self.extensions}


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
    default becomes a knob of its own (log scale, factor 3)."""
    mine: dict[str, tuple[float, ...]] = {}
    for key, values in (grids or {}).items():
        head, _, rest = key.partition(".")
        if head in ("train", "algorithm"):
            mine.setdefault(key, tuple(sorted(values)))
        elif head == algorithm:
            mine[rest] = tuple(sorted(values))
    own = KNOBS.get(algorithm, (_rate(),))
    out = [dataclasses.replace(k, grid=mine.pop(k.key)) if k.key in mine else k for k in own]
    out += [Knob(key, values) for key, values in mine.items()]
    for k in out:
        if not k.key.startswith(("train.", "algorithm.")):
            raise ConfigError(f"--grid {k.key}: tune train.* or algorithm.* keys")
        if len(k.grid) < 2 or len(set(k.grid)) != len(k.grid) or any(not k.inside(v) for v in k.grid):
            raise ConfigError(f"--grid {algorithm}.{k.key}: needs at least two distinct values inside "
                              f"({k.lo:g}, {k.hi:g})")
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


def simulate_point(cfg: ExperimentConfig, run_dir: Path, inputs: RunInputs) -> Sequence[Mapping[str, Any]] | None:
    """One tuning run (read back when it finished before with this config); None when it diverged or failed."""
    from fedent.experiments.reproduce import diverged, is_complete, same_config
    from fedent.sim.simulator import SimulationError, run_simulation

    if run_dir.exists():
        if same_config(run_dir, cfg.to_dict()):
            if is_complete(run_dir, cfg.train.rounds):
                return runlog.read_metrics(runlog.RunPaths(run_dir).metrics)
            if diverged(run_dir) is not None:
                return None
        shutil.rmtree(run_dir)
    try:
        return run_simulation(cfg, run_dir, progress=False, inputs=inputs, plots=False).records
    except SimulationError:  # diverged (a model went non-finite) or the strategy gave up: scores below any run
        return None


class Tuner:
    """The search for one base config: runs (cached per point), knobs in turn, bracketing."""

    def __init__(self, base: ExperimentConfig, seeds: Sequence[int], out: Path, *, fraction: float = 0.1,
                 tail_k: int = paired.TAIL_K, max_extend: int = 2, run: RunFn = simulate_point,
                 inputs_for: Callable[[ExperimentConfig], RunInputs] = load_inputs,
                 log: Callable[[str], None] | None = None) -> None:
        if not 0 < fraction < 1:
            raise ConfigError(f"--validation-fraction: must be in (0, 1), got {fraction}")
        if max_extend < 0:
            raise ConfigError("--max-extend: must be >= 0")
        self.base, self.seeds, self.out = base, [int(s) for s in seeds], out
        self.fraction, self.tail_k, self.max_extend = fraction, tail_k, max_extend
        self.run, self.inputs_for, self.log = run, inputs_for, log
        self._inputs: dict[int, RunInputs] = {}
        self._scores: dict[tuple[str, str], float | None] = {}
        self.runs = 0

    def _inputs_of(self, cfg: ExperimentConfig) -> RunInputs:
        seed = int(cfg.train.seed)
        if seed not in self._inputs:  # the data and its split depend on the seed only, not on the tuned values
            self._inputs[seed] = self.inputs_for(cfg)
        return self._inputs[seed]

    def score(self, algorithm: str, values: Mapping[str, float]) -> float | None:
        """The point's score over the tuning seeds (None when any seed diverged or never scored)."""
        key = (algorithm, json.dumps(sorted(values.items())))
        if key in self._scores:
            return self._scores[key]
        name = "_".join(f"{k.split('.')[-1]}{v:.6g}" for k, v in sorted(values.items())) or "defaults"
        scores = []
        for seed in self.seeds:
            cfg = point_config(self.base, algorithm, values, self.fraction, tuning=True)
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed),
                                      name=f"{self.base.name}-tune-{algorithm}")
            recs = self.run(cfg, self.out / "runs" / algorithm / f"{name}-s{seed}", self._inputs_of(cfg))
            self.runs += 1
            scores.append(None if recs is None else val_score(recs, self.tail_k))
        got = None if any(s is None for s in scores) else sum(s for s in scores if s is not None) / len(scores)
        if self.log is not None:
            shown = "diverged" if got is None else f"{100 * got:.2f}%"
            self.log(f"tune {algorithm}: {name}: validation {shown}")
        self._scores[key] = got
        return got

    def tune_knob(self, algorithm: str, knob: Knob, fixed: Mapping[str, float]) -> KnobResult:
        res = KnobResult(knob.key)
        values = sorted(knob.grid)
        while True:
            for v in values:
                if v not in res.tried:
                    res.tried[v] = self.score(algorithm, {**fixed, knob.key: v})
            ok = {v: s for v, s in res.tried.items() if s is not None}
            if not ok:
                res.why = "every value diverged"
                return res
            top = max(ok.values())
            res.best = min(v for v, s in ok.items() if s == top)  # ties: the smaller value
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

    def tune(self, algorithm: str, grids: Mapping[str, Sequence[float]] | None = None) -> AlgorithmTuning:
        knobs = knobs_for(algorithm, grids)
        chosen: dict[str, float] = {}
        defaults = self._defaults(algorithm, knobs)
        results = []
        start = self.runs
        for knob in knobs:
            fixed = {**defaults, **chosen}
            fixed.pop(knob.key, None)
            res = self.tune_knob(algorithm, knob, fixed)
            results.append(res)
            chosen[knob.key] = res.best if res.best is not None else defaults[knob.key]
        return AlgorithmTuning(algorithm, chosen, self.score(algorithm, chosen), results, self.runs - start)

    def _defaults(self, algorithm: str, knobs: Sequence[Knob]) -> dict[str, float]:
        """Each knob's value before it is tuned: the base config's (the paper's) value."""
        cfg = point_config(self.base, algorithm, {}, self.fraction, tuning=True)
        raw = cfg.to_dict()
        out = {}
        for k in knobs:
            section, _, name = k.key.partition(".")
            out[k.key] = float(raw[section][name])
        return out


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
            lines.append(f"| {r.algorithm} | {k.key} | {tried} | {r.chosen.get(k.key, float('nan')):.4g} | {br} |")
    return lines


@dataclass(frozen=True)
class Tuned:
    """A tuned.json, read back: each algorithm's chosen values and the validation fraction they were tuned on."""

    validation_fraction: float
    chosen: Mapping[str, Mapping[str, float]]
    source: str = ""  # the file it was read from

    @classmethod
    def read(cls, path: str | Path) -> Tuned:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"--tuned {path}: cannot read it ({e})") from None
        if not isinstance(raw, dict) or raw.get("version") != TUNED_VERSION:
            raise ConfigError(f"--tuned {path}: not a tuned.json of version {TUNED_VERSION}")
        algos = raw.get("algorithms") or {}
        return cls(float(raw["validation_fraction"]), {a: dict(v["chosen"]) for a, v in algos.items()}, str(path))

    def for_arm(self, label: str, algorithm: str) -> dict[str, float]:
        """The values of arm ``label`` (its own tuning, else its algorithm's: a control inherits them)."""
        return dict(self.chosen.get(label) or self.chosen.get(algorithm) or {})
