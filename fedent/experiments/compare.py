"""Several algorithms x seeds on identical partitions and client sampling, summarised as a table and figures.

For one seed every algorithm gets the same data, partition, initial model and participants per round
(fedent.rng.sample_clients depends only on the seed), so differences come from the algorithms alone. The
summary checks that claim from the logs themselves (participants per round and partition md5).

Why ~440 lines in one module: the rows (an algorithm, a control ``LABEL=ALGORITHM``, tuned values), the runs and
the report that states what each row ran are one unit; split, the report would re-derive the rows' configs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedent import provenance, runlog
from fedent.config import AlgorithmConfig, ConfigError, ExperimentConfig, apply_overrides, config_from_dict
from fedent.experiments import paired
from fedent.experiments.tuning import Tuned
from fedent.inputs import RunInputs, load_inputs
from fedent.rounds.engine import RoundPolicy
from fedent.rounds.rundir import RunFinished
from fedent.rounds.stacking import StackSeat, can_stack, side_by_side
from fedent.sim.simulator import SimulationError, run_simulation

# Every run checkpoints each round, so an interrupted comparison started again on the same --out continues:
# finished runs are read back, the interrupted one resumes from its last round, the rest run.
RESUMABLE = RoundPolicy(checkpoint_keep=2)

Records = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class RunSummary:
    algorithm: str
    seed: int
    run_dir: Path
    final_acc: float | None
    best_acc: float | None
    rounds_to_target: int | None  # number of rounds until test_acc >= target (None: never)
    wall_s: float | None
    error: str | None = None


@dataclass(frozen=True)
class AlgorithmSummary:
    algorithm: str
    runs: int
    final: tuple[float, float | None] | None  # (mean, std) over seeds that finished; std None for one
    best: tuple[float, float | None] | None
    reach: tuple[float, float | None] | None  # over seeds that reached the target
    reached: int
    failed: int


@dataclass(frozen=True)
class ComparisonResult:
    out_dir: Path
    runs: list[RunSummary]
    summaries: list[AlgorithmSummary]
    target: float | None
    same_sampling: bool
    figures: list[Path] = field(default_factory=list)
    arms: dict[str, str] = field(default_factory=dict)  # rows that are not the base config: what each one runs


def rounds_to_target(records: Records, target: float | None) -> int | None:
    """Rounds (1-based count) until the global test accuracy first reaches ``target``."""
    if target is None:
        return None
    for r in records:
        acc = r.get("test_acc")
        if acc is not None and acc >= target:
            return runlog.round_of(r)
    return None


def _mean_std(values: Sequence[float]) -> tuple[float, float | None] | None:
    """Mean and sample std; the std is None for one value (one seed has no spread to report, not a zero one)."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else None


def summarize(runs: Sequence[RunSummary], algorithms: Sequence[str]) -> list[AlgorithmSummary]:
    out = []
    for algo in algorithms:
        mine = [r for r in runs if r.algorithm == algo]
        ok = [r for r in mine if r.error is None]
        out.append(AlgorithmSummary(
            algorithm=algo,
            runs=len(mine),
            final=_mean_std([r.final_acc for r in ok if r.final_acc is not None]),
            best=_mean_std([r.best_acc for r in ok if r.best_acc is not None]),
            reach=_mean_std([float(r.rounds_to_target) for r in ok if r.rounds_to_target is not None]),
            reached=sum(r.rounds_to_target is not None for r in ok),
            failed=len(mine) - len(ok),
        ))
    return out


def _pct(ms: tuple[float, float | None] | None) -> str:
    if ms is None:
        return "—"
    return f"{100 * ms[0]:.2f} (n=1)" if ms[1] is None else f"{100 * ms[0]:.2f} ± {100 * ms[1]:.2f}"


def _reach(s: AlgorithmSummary, target: float | None) -> str:
    if target is None:
        return "—"
    if s.reach is None:
        return f"not reached (0/{s.runs})"
    mean, std = s.reach
    spread = "" if std is None else f" ± {std:.1f}"
    return f"{mean:.1f}{spread} ({s.reached}/{s.runs})"


def markdown_table(summaries: Sequence[AlgorithmSummary], target: float | None) -> str:
    """The comparison table: accuracies in percent, mean ± sample std over seeds (``(n=1)`` for one seed)."""
    tgt = f"{100 * target:.1f}%" if target is not None else "target (unset)"
    lines = [
        f"| algorithm | final accuracy (%) | best accuracy (%) | rounds to {tgt} | failed runs |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for s in summaries:
        lines.append(f"| {s.algorithm} | {_pct(s.final)} | {_pct(s.best)} | {_reach(s, target)} | {s.failed} |")
    return "\n".join(lines)


def sampling_identical(records_by_run: Mapping[tuple[str, int], Records]) -> bool:
    """True when, for every seed, all algorithms logged the same participants in every round they share."""
    by_seed: dict[int, list[dict[int, list[int]]]] = {}
    for (_, seed), recs in records_by_run.items():
        by_seed.setdefault(seed, []).append({runlog.round_of(r): list(r["clients"]) for r in recs})
    for runs in by_seed.values():
        for other in runs[1:]:
            common = set(runs[0]) & set(other)
            if any(runs[0][t] != other[t] for t in common):
                return False
    return True


def parse_arm(entry: str) -> tuple[str, str]:
    """An --algorithms entry: ``ALGORITHM`` or ``LABEL=ALGORITHM`` (a control: the same algorithm under another
    name, with its own --algo-set LABEL.KEY=VALUE options, e.g. ``fedent-shuffled=fedent``)."""
    label, eq, algorithm = entry.partition("=")
    label, algorithm = label.strip(), algorithm.strip()
    if not eq:
        return label, label
    if not label or not algorithm or "." in label:
        raise ConfigError(f"--algorithms {entry!r}: expected LABEL=ALGORITHM with a label without dots")
    return label, algorithm


def algorithm_config(name: str, base: ExperimentConfig, overrides: Sequence[str], algorithm: str | None = None,
                     preset: Mapping[str, Any] | None = None) -> AlgorithmConfig:
    """Options for arm ``name`` of ``algorithm`` (default: ``name``): the config's own options when it names that
    algorithm, then ``preset`` (tuned values), then ``NAME.KEY=VALUE``."""
    algorithm = algorithm or name
    for o in overrides:
        if "." not in o.partition("=")[0]:
            raise ConfigError(f"--algo-set {o!r}: expected ALGORITHM.KEY=VALUE, e.g. fedprox.mu=0.1")
    opts: dict[str, Any] = base.algorithm.options.to_dict() if base.algorithm.name == algorithm else {}
    opts.update(preset or {})
    mine = [o.partition(".")[2] for o in overrides if o.partition(".")[0] == name]
    return AlgorithmConfig.from_mapping({**apply_overrides(opts, mine), "name": algorithm})


def arm_config(cfg: ExperimentConfig, label: str, algorithm: str, overrides: Sequence[str],
               tuned: Tuned | None) -> ExperimentConfig:
    """The config of one arm: the tuned values (``train.*`` and ``algorithm.*``) and validation split of
    ``tuned`` when given, the arm's --algo-set options on top; the test set is evaluated."""
    preset = tuned.algorithm_options(label, algorithm) if tuned is not None else {}
    algo = algorithm_config(label, cfg, overrides, algorithm, preset)
    if tuned is not None:
        cfg = config_from_dict(apply_overrides(cfg.to_dict(), tuned.config_sets(label, algorithm)))
    return dataclasses.replace(cfg, algorithm=algo)


def parse_list(text: str, what: str, cast: Callable[[str], Any]) -> list[Any]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(f"--{what}: expected a comma-separated list")
    try:
        values = [cast(t) for t in items]
    except ValueError:
        raise ConfigError(f"--{what}: cannot parse {text!r}") from None
    if len(set(values)) != len(values):
        raise ConfigError(f"--{what}: duplicate entries in {text!r}")
    return values


def _one_run(cfg_a: ExperimentConfig, run_dir: Path, inputs: RunInputs | None,
             inputs_for: Callable[[ExperimentConfig], RunInputs], device: str | None, progress: bool,
             local_eval: int | None, label: str, target: float | None,
             arm: str | None = None, seat: StackSeat | None = None) -> tuple[RunSummary, Records]:
    """One (algorithm, seed) run, resumed or read back when it finished before; in this process or a pool's.
    ``arm``: the row's label when it is not the algorithm's name (a control); ``seat``: it trains side by side
    with other runs (``--stack``)."""
    algo, seed = arm or cfg_a.algorithm.name, int(cfg_a.train.seed)
    try:
        res = run_simulation(cfg_a, run_dir, device=device, progress=progress,
                             inputs=inputs if inputs is not None else inputs_for(cfg_a),
                             local_eval=local_eval, label=label, plots=False, policy=RESUMABLE, resume=True,
                             seat=seat)
    except RunFinished:  # done before the interruption: its log is the result
        recs = runlog.read_metrics(runlog.RunPaths(run_dir).metrics)
        accs = [float(r["test_acc"]) for r in recs if r.get("test_acc") is not None]
        wall = recs[-1].get("elapsed_s") if recs else None
        return RunSummary(algo, seed, run_dir, runlog.final_accuracy(recs), max(accs, default=None),
                          rounds_to_target(recs, target), float(wall) if wall is not None else None), recs
    except SimulationError as e:
        recs = runlog.read_metrics(runlog.RunPaths(run_dir).metrics)
        return RunSummary(algo, seed, run_dir, None, None, None, None, error=str(e)), recs
    return RunSummary(algo, seed, run_dir, res.final_acc, res.best_acc, rounds_to_target(res.records, target),
                      res.wall_s), res.records


Job = tuple[ExperimentConfig, Path, str]


def _run_group(jobs: Sequence[Job], inputs: Sequence[RunInputs | None],
               inputs_for: Callable[[ExperimentConfig], RunInputs], device: str | None, progress: bool,
               local_eval: int | None, target: float | None) -> list[tuple[RunSummary, Records]]:
    """Runs side by side in this process (``fedent.rounds.stacking.side_by_side``), or one ``_one_run``; a run's
    unexpected error is raised once every run of the group has ended."""
    calls = [functools.partial(_one_run, cfg_a, run_dir, inp, inputs_for, device, progress, local_eval, label,
                               target, run_dir.name.rpartition("-s")[0])
             for (cfg_a, run_dir, label), inp in zip(jobs, inputs, strict=True)]
    if len(calls) == 1:
        return [calls[0]()]
    out = []
    for o in side_by_side(calls, "compare-stacked"):  # each call's seat: _one_run's last argument
        if isinstance(o, BaseException):
            raise o
        out.append(o)
    return out


def run_comparison(
    cfg: ExperimentConfig,
    algorithms: Sequence[str],
    seeds: Sequence[int],
    out_dir: str | Path,
    *,
    target: float | None = None,
    algo_overrides: Sequence[str] = (),
    device: str | None = None,
    progress: bool = True,
    local_eval: int | None = None,
    inputs_for: Callable[[ExperimentConfig], RunInputs] = load_inputs,
    tail_k: int = paired.TAIL_K,
    workers: int = 1,
    tuned: Tuned | None = None,
    stack: int = 1,
) -> ComparisonResult:
    """Run every algorithm for every seed into ``out_dir/runs/<algo>-s<seed>``; write compare.md and figures.

    Started again on the same ``out_dir`` (after Ctrl-C, SIGTERM, a crash) it continues where it stopped: a
    finished run is read back, not run again, and an interrupted one resumes from its last checkpoint.
    ``workers`` > 1: the runs go to a pool of that many processes (each with its share of the CPU threads, no
    progress bars; ``inputs_for`` must then be picklable); the results are the same as one process's.
    ``algorithms`` entries may be ``LABEL=ALGORITHM`` (controls); ``tuned`` (fedent.experiments.tuning, a
    tuned.json) gives each arm its tuned values and the validation split they were chosen on. ``stack``: up to
    this many consecutive runs (a seed's arms, then the next seed's) train side by side in one process, their
    clients in one vectorised step (``fedent.rounds.stacking``; the results are the same)."""
    out = Path(out_dir)
    if workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {workers}")
    if stack < 1:
        raise ConfigError(f"--stack: must be >= 1, got {stack}")
    arms = dict(parse_arm(a) for a in algorithms)
    if len(arms) != len(algorithms):
        raise ConfigError("--algorithms: duplicate labels")
    algorithms = list(arms)
    specs = {a: arm_config(cfg, a, algo, algo_overrides, tuned) for a, algo in arms.items()}  # fail before training
    unknown = sorted({o.partition(".")[0] for o in algo_overrides} - set(algorithms))
    if unknown:
        raise ConfigError(f"--algo-set: {', '.join(unknown)} is not among --algorithms")
    target = target if target is not None else cfg.train.target_accuracy
    runs: list[RunSummary] = []
    records: dict[tuple[str, int], Records] = {}
    md5s: dict[int, Any] = {}
    total = len(seeds) * len(algorithms)
    jobs: list[tuple[ExperimentConfig, Path, str]] = []
    for seed in seeds:
        for algo in algorithms:
            spec = specs[algo]
            cfg_a = dataclasses.replace(spec, train=dataclasses.replace(spec.train, seed=int(seed)),
                                        name=f"{cfg.name}-{algo}")
            jobs.append((cfg_a, out / "runs" / f"{algo}-s{seed}", f"run {len(jobs) + 1}/{total} {algo} s{seed}"))
    k = stack if all(can_stack(cfg_a) for cfg_a, _, _ in jobs) else 1  # a sequential executor, dropout: alone
    batches = [jobs[lo:lo + k] for lo in range(0, len(jobs), k)]
    if workers == 1:
        inputs_by_seed: dict[int, RunInputs] = {}
        for group in batches:
            for cfg_a, _, _ in group:
                seed = int(cfg_a.train.seed)
                if seed not in inputs_by_seed:
                    inputs_by_seed[seed] = inputs_for(cfg_a)
                    md5s[seed] = inputs_by_seed[seed].partition_info.get("md5")
            inputs = [inputs_by_seed[int(cfg_a.train.seed)] for cfg_a, _, _ in group]
            for summary, recs in _run_group(group, inputs, inputs_for, device, progress and len(group) == 1,
                                            local_eval, target):
                runs.append(summary)
                records[(summary.algorithm, summary.seed)] = recs
    else:
        import os

        from fedent.experiments.reproduce import process_pool  # SIGTERM stops its runs; workers die with us

        threads = max(1, (os.cpu_count() or 1) // workers)
        with process_pool(workers, threads) as pool:
            futures = [pool.submit(_run_group, group, [None] * len(group), inputs_for, device, False, local_eval,
                                   target) for group in batches]
            for fut in futures:  # in the order of the jobs, so the report reads as one process's
                for summary, recs in fut.result():
                    runs.append(summary)
                    records[(summary.algorithm, summary.seed)] = recs
        for seed in seeds:
            md5s[int(seed)] = next((json.loads(p.read_text()).get("md5") for p in
                                    [runlog.RunPaths(out / "runs" / f"{a}-s{seed}").partition for a in algorithms]
                                    if p.exists()), None)
    summaries = summarize(runs, algorithms)
    same = sampling_identical(records)
    from fedent.plots import plot_groups

    groups = {a: [records[(a, int(s))] for s in seeds if records.get((a, int(s)))] for a in algorithms}
    figures = plot_groups(groups, out / "figures", title=cfg.name)
    result = ComparisonResult(out, runs, summaries, target, same, figures, arm_lines(cfg, specs, arms, tuned))
    write_report(result, cfg, seeds, md5s, tail_k)
    return result


def arm_lines(cfg: ExperimentConfig, specs: Mapping[str, ExperimentConfig], arms: Mapping[str, str],
              tuned: Tuned | None) -> dict[str, str]:
    """What each row runs, for the report, when any row is not the base config with the algorithm's defaults
    (a control row, an --algo-set option, tuned values): its algorithm, rate and options off their defaults."""
    out: dict[str, str] = {}
    for label, spec in specs.items():
        defaults = type(spec.algorithm.options)().to_dict()
        opts = {k: v for k, v in spec.algorithm.options.to_dict().items() if defaults.get(k) != v}
        text = f"{arms[label]}, lr {spec.train.lr:g}" + "".join(f", {k} {v}" for k, v in opts.items())
        out[label] = text
    plain = all(v == f"{a}, lr {cfg.train.lr:g}" for v, a in zip(out.values(), arms.values(), strict=True))
    if plain and tuned is None:
        return {}
    if tuned is not None:
        out = {k: f"{v} (tuned values of {tuned.source or 'a tuned.json'})" if tuned.for_arm(k, arms[k]) else v
               for k, v in out.items()}
    return out


def paired_rows(result: ComparisonResult, tail_k: int = paired.TAIL_K) -> list[dict[str, Any]]:
    """Each algorithm against the first, paired over seeds: the end point (mean of the last ``tail_k`` evaluated
    rounds) and rounds to target (seeds where both reached it), read back from the runs' logs."""
    ok = [r for r in result.runs if r.error is None]
    recs = {(r.algorithm, r.seed): runlog.read_metrics(runlog.RunPaths(r.run_dir).metrics) for r in ok}
    algos = [s.algorithm for s in result.summaries]
    if not algos:
        return []
    ref = algos[0]

    def end(a: str) -> dict[int, float | None]:
        return {s: paired.tail_mean(v, tail_k) for (al, s), v in recs.items() if al == a}

    def reach(a: str) -> dict[int, float | None]:
        return {r.seed: None if r.rounds_to_target is None else float(r.rounds_to_target)
                for r in ok if r.algorithm == a}

    return [{"algorithm": a, "reference": ref, "tail_k": tail_k, "end_point": paired.paired(end(a), end(ref)),
             "rounds_to_target": paired.paired(reach(a), reach(ref))} for a in algos[1:]]


def cfg_val(result: ComparisonResult) -> float:
    """The validation fraction the runs trained with (0: none), from their config.yaml."""
    for r in result.runs:
        path = runlog.RunPaths(r.run_dir).config
        if path.exists():
            import yaml

            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            return float((raw.get("data") or {}).get("validation_fraction") or 0.0)
    return 0.0


def write_report(result: ComparisonResult, cfg: ExperimentConfig, seeds: Sequence[int],
                 md5s: Mapping[int, Any], tail_k: int = paired.TAIL_K) -> None:
    """compare.md (human) and summary.json (machine) in the comparison directory."""
    out = result.out_dir
    pairs = paired_rows(result, tail_k)
    provs = {r.run_dir.name: runlog.read_json(runlog.RunPaths(r.run_dir).provenance) for r in result.runs}
    prov_lines = sorted({provenance.describe(p) for p in provs.values()})
    d, t = cfg.data, cfg.train
    part = d.partition + (f" (α={d.alpha})" if d.partition == "dirichlet" else "")
    lines = [
        f"# Comparison: {cfg.name}",
        "",
        f"- data: {d.name}, {part}, {d.num_clients} clients, {100 * t.fraction:g}% per round; "
        f"model {cfg.model.name}",
        f"- training: {t.rounds} rounds, {t.local_epochs} local epochs, batch {t.batch_size}, lr {t.lr:g}",
        f"- seeds: {', '.join(str(s) for s in seeds)} (accuracy: mean ± sample std over seeds)",
        f"- partition md5 per seed: {', '.join(f'{s}: {md5s.get(int(s))}' for s in seeds)}",
        f"- identical participants per round across algorithms: {'yes' if result.same_sampling else 'NO'}",
        *([f"- validation split: {cfg_val(result)} of every client's training samples held out (not trained on)"]
          if cfg_val(result) else []),
        *(["- rows (the lr above is the base config's; each row's own):"] if result.arms else []),
        *[f"  - {label}: {text}" for label, text in result.arms.items()],
        "",
        markdown_table(result.summaries, result.target),
        "",
        f"Paired over seeds against {pairs[0]['reference'] if pairs else '—'} (same partitions and participants): "
        f"mean difference and 95% t-interval of the per-seed difference; end point = mean global test accuracy "
        f"of the last {tail_k} evaluated rounds (percentage points); rounds to target over the seeds where both "
        "reached it (negative = sooner).",
        "",
        "| algorithm | Δ end point (pts) | Δ rounds to target |",
        "| --- | ---: | ---: |",
        *[f"| {p['algorithm']} | {paired.fmt(p['end_point'])} | "
          f"{paired.fmt(p['rounds_to_target'], scale=1.0, digits=1)} |" for p in pairs],
        "",
        "Provenance (provenance.json of the runs): " + "; ".join(prov_lines),
        "",
        "## Runs",
        "",
        "| algorithm | seed | final (%) | best (%) | rounds to target | wall (s) | run dir |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in result.runs:
        fin = "—" if r.final_acc is None else f"{100 * r.final_acc:.2f}"
        best = "—" if r.best_acc is None else f"{100 * r.best_acc:.2f}"
        reach = "—" if r.rounds_to_target is None else str(r.rounds_to_target)
        wall = f"failed: {r.error}" if r.error else f"{r.wall_s:.1f}"
        lines.append(f"| {r.algorithm} | {r.seed} | {fin} | {best} | {reach} | {wall} | "
                     f"{r.run_dir.relative_to(out)} |")
    if result.figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{p.stem}]({p.relative_to(out)})" for p in result.figures if p.suffix in (".png", ".svg")]
    runlog.atomic_write_text(out / "compare.md", "\n".join(lines) + "\n")

    def ms(v: tuple[float, float | None] | None) -> dict[str, float | None] | None:
        return None if v is None or any(x is not None and math.isnan(x) for x in v) else {"mean": v[0], "std": v[1]}

    runlog.atomic_write_json(out / "summary.json", {
        "config": cfg.to_dict(), "seeds": list(seeds), "target": result.target,
        "same_sampling": result.same_sampling,
        "algorithms": [{"algorithm": s.algorithm, "runs": s.runs, "final_acc": ms(s.final), "best_acc": ms(s.best),
                        "rounds_to_target": ms(s.reach), "reached": s.reached, "failed": s.failed}
                       for s in result.summaries],
        "runs": [dataclasses.asdict(r) | {"run_dir": str(r.run_dir), "provenance": provs.get(r.run_dir.name)}
                 for r in result.runs],
        "paired": [{**p, "end_point": paired.as_dict(p["end_point"]),
                    "rounds_to_target": paired.as_dict(p["rounds_to_target"])} for p in pairs],
    })
