"""The runs a profile needs (``build_plan``), their size in client SGD steps, and what a budget drops first.

For one seed every row of a setting trains on the identical data, partition, initial model and client sampling
(all derived from the seed), so differences come from the algorithms alone. Runs shared between sections (e.g.
FedEnt β = 0.99 in the sweep is the Table III FedEnt run) are planned once, in an order that leaves the most
useful whole tables when a run is stopped early (``run_tier``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedent import runlog
from fedent.config import AlgorithmConfig, ConfigError, apply_overrides, config_from_dict, load_config
from fedent.experiments.profiles import Profile, Row, Section, Setting
from fedent.experiments.tuning import Tuned


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a row on a setting for a seed, with its fully resolved config (a plain dict, picklable)."""

    setting: str
    row: str
    seed: int
    config: Mapping[str, Any] = field(repr=False)
    run_dir: Path
    after: tuple[str, ...] = ()  # keys of runs that must be complete first (a replay reads their log)

    @property
    def key(self) -> str:
        return f"{self.setting}/{self.row}-s{self.seed}"

    @property
    def rounds(self) -> int:
        return int(self.config["train"]["rounds"])


@dataclass(frozen=True)
class Plan:
    profile: Profile
    seeds: tuple[int, ...]
    sections: tuple[Section, ...]
    runs: tuple[RunSpec, ...]  # in execution order: seed-major, then section order; no duplicates
    tuned: Mapping[str, Tuned] = field(default_factory=dict)  # setting -> the tuned.json its rows use (--tuned)
    overrides: tuple[str, ...] = ()  # --set key=value, applied to every setting after its own overrides


def effective_overrides(*lists: Sequence[str]) -> list[str]:
    """``key=value`` lists applied in turn, as ``apply_overrides`` applies them: a later value of a key replaces an
    earlier one in its place, so a report names what the runs were trained with (``--set train.local_eval=0``
    over a setting's ``train.local_eval=5`` reads ``train.local_eval=0``)."""
    out: dict[str, str] = {}
    for items in lists:
        for item in items:
            out[item.split("=", 1)[0].strip()] = item
    return list(out.values())


# ---- building the plan -----------------------------------------------------------------------------------

def setting_config(setting: Setting, config_dir: Path, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The setting's resolved, validated config as a plain dict (algorithm section removed: rows set it);
    ``extra`` are --set overrides applied after the profile's own."""
    if isinstance(setting.base, str):
        cfg = load_config(config_dir / setting.base, [*setting.overrides, *extra])
    else:
        cfg = config_from_dict(apply_overrides(dict(setting.base), [*setting.overrides, *extra]))
    raw = cfg.to_dict()
    raw.pop("algorithm", None)
    return raw


def run_config(base: Mapping[str, Any], setting: str, row: Row, seed: int,
               replay_log: Path | None = None, tuned: Tuned | None = None) -> dict[str, Any]:
    """One run's config. With ``tuned`` (the setting's tuned.json) the row gets its tuned values as
    ``fedent compare --tuned`` gives an arm (``Tuned.config_sets``/``algorithm_options``: its own, else its
    algorithm's, so a control inherits them), trains on the tuning's training part, and its name carries the file's
    sha256 (config.yaml records it; the run-cache key, the config, changes with the file). The row's own options
    win over tuned ones (the β sweep keeps its β) and ``lr_scale`` multiplies the tuned rate."""
    raw = json.loads(json.dumps(base))  # deep copy of plain data
    raw["name"] = f"reproduce-{setting}-{row.label}"
    preset: dict[str, float] = {}
    if tuned is not None:
        raw = apply_overrides(raw, tuned.config_sets(row.label, row.algorithm))
        raw["name"] += f"-tuned-{tuned.sha256[:12]}"
        preset = tuned.algorithm_options(row.label, row.algorithm)
    raw["train"]["seed"] = int(seed)
    if row.lr_scale != 1.0:
        raw["train"]["lr"] = float(raw["train"]["lr"]) * row.lr_scale
    raw["algorithm"] = {"name": row.algorithm, **preset, **row.options_dict()}
    if row.replay_of is not None:
        if replay_log is None:
            raise ConfigError(f"row {row.label} replays {row.replay_of}: needs that run's metrics.jsonl")
        raw["algorithm"]["replay_rates"] = str(replay_log)
    return raw


def build_plan(profile: Profile, seeds: Sequence[int], out_dir: str | Path, config_dir: str | Path,
               only: Sequence[str] | None = None, rows: Sequence[str] | None = None,
               rounds: int | None = None, overrides: Sequence[str] = (),
               tuned: Mapping[str, Tuned] | None = None, settings: Sequence[str] | None = None) -> Plan:
    """Every run the chosen sections need, deduplicated, seed-major so an early stop leaves whole seeds.
    ``overrides`` (``--set key=value``) apply to every setting, e.g. the device's precision or conv path;
    ``tuned``: setting -> its tuned.json (``run_config``); a setting without one runs untuned. ``settings``: only
    these settings of the chosen sections (``--settings``), e.g. the one a tuned.json was made for."""
    if not seeds:
        raise ConfigError("--seeds: at least one seed")
    tuned = dict(tuned or {})
    for key in tuned:
        profile.setting(key)  # an unknown setting is an error, not a silently untuned run
    sections = tuple(profile.section(k) for k in only) if only else profile.sections
    if settings:  # only these settings of the chosen sections
        for key in settings:
            profile.setting(key)
        sections = tuple(dataclasses.replace(s, settings=tuple(k for k in s.settings if k in settings))
                         for s in sections)
        sections = tuple(s for s in sections if s.settings)
        if not sections:
            raise ConfigError("--settings: none of these settings is in the chosen sections")
    if rows:  # only these rows (a replay still brings the run it replays)
        for label in rows:
            profile.row(label)
        sections = tuple(Section(s.key, s.title, s.settings, tuple(r for r in s.rows if r in rows), s.only_in,
                                 s.priority) for s in sections)
        sections = tuple(s for s in sections if s.rows)
        if not sections:
            raise ConfigError("--rows: none of these rows is in the chosen sections")
    out, cdir = Path(out_dir), Path(config_dir)
    bases: dict[str, dict[str, Any]] = {}
    if rounds is not None and rounds < 1:
        raise ConfigError("--rounds: must be >= 1")
    for key in overrides:
        if key.split("=", 1)[0].strip() in ("algorithm", "train.seed") or key.startswith("algorithm."):
            raise ConfigError(f"--set {key}: rows set the algorithm and seeds the seed; --set is for the settings")
    for sec in sections:
        for key in sec.settings:
            if key not in bases:
                bases[key] = setting_config(profile.setting(key), cdir, overrides)
                if key in tuned and (wrong := tuned[key].problem_mismatch(bases[key])):
                    raise ConfigError(f"--tuned {tuned[key].source}: setting {key} is another problem: "
                                      f"{'; '.join(wrong)}")
                if rounds is not None:  # a smoke test of the profile
                    bases[key]["train"]["rounds"] = int(rounds)
        for label in sec.rows:
            row = profile.row(label)
            AlgorithmConfig.from_mapping({"name": row.algorithm, **row.options_dict()})  # fail before any run
    order = sorted(((run_tier(sec.priority, i), i, j) for i in range(len(seeds)) for j, sec in enumerate(sections)))
    runs: dict[str, RunSpec] = {}

    def add(key: str, label: str, seed: int) -> str:
        row = profile.row(label)
        run_dir = out / "runs" / key / f"{label}-s{seed}"
        after: tuple[str, ...] = ()
        log = None
        if row.replay_of is not None:  # the replayed run comes first (added here if no section has it)
            dep = add(key, row.replay_of, seed)
            after, log = (dep,), runlog.RunPaths(runs[dep].run_dir).metrics
        spec = RunSpec(key, label, seed, run_config(bases[key], key, row, seed, log, tuned.get(key)), run_dir, after)
        runs.setdefault(spec.key, spec)
        return spec.key

    for _, i, j in order:
        seed, sec = int(seeds[i]), sections[j]
        for key in sec.settings:
            for label in sec.rows_for(key):
                add(key, label, seed)
    used = {k: t for k, t in tuned.items() if k in bases}
    return Plan(profile, tuple(int(s) for s in seeds), sections, tuple(runs.values()), used, tuple(overrides))


def read_tuned(texts: Sequence[str], profile: Profile) -> dict[str, Tuned]:
    """``--tuned`` values -> setting -> its tuned.json. Tuned values are per setting (a rate tuned on one
    partition says nothing about another), so each entry is ``SETTING=FILE`` or a directory ``DIR`` holding
    ``DIR/<setting>/tuned.json`` (what ``fedent tune --out DIR/<setting>`` writes) for the settings it has; a
    bare FILE only for a profile of one setting. A later entry wins for its setting."""
    keys = [s.key for s in profile.settings]
    out: dict[str, Tuned] = {}
    for text in texts:
        name, eq, path = text.partition("=")
        if eq and name in keys:
            out[name] = Tuned.read(path)
        elif Path(text).is_dir():
            found = {k: Path(text) / k / "tuned.json" for k in keys if (Path(text) / k / "tuned.json").is_file()}
            if not found:
                raise ConfigError(f"--tuned {text}: no <setting>/tuned.json in it (settings: {', '.join(keys)})")
            out.update({k: Tuned.read(p) for k, p in found.items()})
        elif len(keys) == 1 and Path(text).is_file():
            out[keys[0]] = Tuned.read(text)
        elif eq:
            raise ConfigError(f"--tuned {text}: profile {profile.name} has no setting {name!r} "
                              f"(settings: {', '.join(keys)})")
        else:
            raise ConfigError(f"--tuned {text}: expected SETTING=FILE or a directory of <setting>/tuned.json "
                              "(tuned values are per setting)")
    return out


def run_tier(priority: int, seed_index: int) -> int:
    """Execution order, so that an early stop leaves the most useful whole tables: the first seed of every
    analysis except the costly ones (priority 2); the main table's second seed; the costly analyses' first
    seed; the main table's further seeds; the first seed of the extra checks (priority 3); then the other
    analyses' further seeds."""
    if seed_index == 0:
        return {0: 0, 1: 0, 2: 2}.get(priority, 4)
    if priority == 0:
        return 1 if seed_index == 1 else 3
    return {1: 5, 2: 6}.get(priority, 7)


# ---- size: client SGD steps, and what is dropped first when a budget does not hold them ----------------------

TRAIN_IMAGES = {"fashion-mnist": 60_000, "mnist": 60_000, "cifar10": 50_000, "cifar100": 50_000, "emnist-l": 124_800}


def client_steps(config: Mapping[str, Any]) -> int:
    """SGD steps a run trains (summed over clients): rounds × clients per round × E × ⌈D_i/B⌉ with D_i the mean
    client size, plus Algorithm 1's gradient evaluations (max_sweeps × T × clients per round) for offline FedEnt."""
    data, train, algo = config["data"], config["train"], config.get("algorithm") or {}
    n = int(data["num_clients"])
    images = data.get("max_train_samples") or TRAIN_IMAGES.get(str(data["name"]), data.get("synthetic_train") or 0)
    per_round = max(1, int(round(float(train["fraction"]) * n)))
    batches = max(1, -(-int(images) // n // int(train["batch_size"])))
    steps = int(train["rounds"]) * per_round * int(train["local_epochs"]) * batches
    if algo.get("name") == "fedent":
        steps += int(train["rounds"]) * per_round  # the probe gradient each round
        if algo.get("estimator") == "offline":
            steps += int(algo.get("max_sweeps") or 20) * int(train["rounds"]) * per_round
    return steps


def drop_order(plan: Plan) -> list[tuple[str, int]]:
    """(setting, seed) units in the order they are dropped to fit a budget, never silently: the last seed of
    every setting first (costliest setting first), then the next-to-last seed, ...; then the first seed of the
    settings, costliest first; the first setting of the profile (the paper's MNIST pathological row) stays."""
    cost: dict[str, int] = {}
    for spec in plan.runs:
        cost[spec.setting] = cost.get(spec.setting, 0) + client_steps(spec.config)
    settings = sorted(cost, key=lambda k: -cost[k])
    keep = plan.profile.settings[0].key
    units = [(st, sd) for sd in reversed(plan.seeds[1:]) for st in settings]
    units += [(st, plan.seeds[0]) for st in settings if st != keep]
    return units


def trim_plan(plan: Plan, budget_steps: int, cost: Callable[[RunSpec], int] | None = None,
              keep: Collection[tuple[str, int]] = ()) -> tuple[Plan, list[tuple[str, int]]]:
    """The plan without the first units of ``drop_order`` that must go for its client steps to fit the budget
    (``cost``: a run's steps, default ``client_steps`` of its config; a time budget counts done runs as 0;
    ``keep``: units never dropped, e.g. those a time budget has started)."""
    size = cost or (lambda r: client_steps(r.config))
    runs = list(plan.runs)
    dropped: list[tuple[str, int]] = []
    for unit in drop_order(plan):
        if unit in keep:
            continue
        if sum(size(r) for r in runs) <= budget_steps:
            break
        runs = [r for r in runs if (r.setting, r.seed) != unit]
        dropped.append(unit)
    return dataclasses.replace(plan, runs=tuple(runs)), dropped


def validate_plan_configs(plan: Plan) -> None:
    """Fail before any training if a run's config does not validate (strategy options included)."""
    for spec in plan.runs:
        config_from_dict(spec.config)
