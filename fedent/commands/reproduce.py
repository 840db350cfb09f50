"""``fedent reproduce``: the paper's experiments (Section VI) end to end -> tables, figures, results.md.

Runs every section's runs (resuming: complete runs are skipped), then writes OUT/report.md, OUT/summary.json
and OUT/figures/. ``--publish DIR`` also writes DIR/results.md (the generated part between markers, keeping
hand-written text around it) and copies the figures to DIR/results/.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedent import runlog
from fedent.commands.errors import input_error_types, one_line
from fedent.config import ConfigError
from fedent.experiments.profiles import PROFILES

if TYPE_CHECKING:
    from fedent.experiments.budget import TimeBudget
    from fedent.experiments.plan import Plan
    from fedent.experiments.reproduce import RunOutcome

HELP = "run the paper's experiments and write the results report"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "reproduce", help=HELP,
        description="Run the paper's Section VI experiments (Table III rows, participation, distance metric, "
                    "local-model deviation, β/γ sweeps) on identical partitions and client sampling per seed, "
                    "then write report.md, summary.json and figures. Complete runs are skipped (resume).")
    p.add_argument("--profile", default="cpu", choices=list(PROFILES),
                   help="cpu: reduced, about an hour on 2 cores (default); medium: full client data, one seed, the "
                        "controls, ~90 min on 2 cores; full: Table IV on the Fashion-MNIST twins with every "
                        "algorithm and control, 3 seeds, for one GPU call; mnist: Table IV's MNIST pathological "
                        "row on the real MNIST (fedent data fetch mnist), every algorithm and FedEnt's rate "
                        "controls, 3 seeds, for a GPU; paper: Table IV, every analysis; robust: "
                        "attack x defence x accuracy for FedAvg and FedEnt (docs/security.md), 54 runs, ~35 min on 2 "
                        "shared cores")
    p.add_argument("--paper-datasets", action="store_true",
                   help="with --profile paper: the paper's datasets instead of the Fashion-MNIST twins")
    p.add_argument("--out", default="results/reproduce", help="output directory (default results/reproduce)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--only", default=None, metavar="SECTION[,SECTION]",
                   help="run only these sections: main, deviation, distance, beta, gamma, participation")
    p.add_argument("--settings", default=None, metavar="SETTING[,SETTING]",
                   help="only these settings of the chosen sections (e.g. pathological): the one a --tuned file "
                        "was made for, or the one a check needs")
    p.add_argument("--rows", default=None, metavar="ROW[,ROW]",
                   help="only these rows of the chosen sections (e.g. fedavg,fedavg-lr5,fedent); a replay row "
                        "also runs the row it replays")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="override every run's train.rounds (a smoke test of a profile; use another --out)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every setting (repeatable), e.g. train.precision=tf32; "
                        "recorded in each run's config.yaml")
    p.add_argument("--tuned", action="append", default=[], metavar="SETTING=FILE|DIR",
                   help="tuned values per setting from fedent tune (repeatable): SETTING=FILE, or DIR holding "
                        "DIR/<setting>/tuned.json (fedent tune --out DIR/<setting>); each row gets its algorithm's "
                        "tuned values (a control inherits them, its own options win) and the tuning's training part; "
                        "a setting without one runs untuned and the report says so; --report-only needs the same "
                        "--tuned")
    p.add_argument("--workers", type=int, default=2, help="parallel runs in separate processes (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--stack", type=int, default=1, metavar="K",
                   help="up to K ready runs of one setting (seeds, rows, rates; same data, model and training form) "
                        "train side by side in one worker, their clients in one vectorised step "
                        "(train.executor: vectorised); each run's results are the ones it gets alone (default 1)")
    p.add_argument("--gpus", default="auto", metavar="auto|none|ID[,ID]",
                   help="GPUs the pool's workers are spread over, one per worker, round-robin (default auto: every "
                        "visible one, from CUDA_VISIBLE_DEVICES or the driver)")
    p.add_argument("--scheduler", default="pool", choices=["pool", "slurm", "submitit-local", "ray"],
                   help="who runs the runs: this command's process pool (default), a Slurm job array per wave "
                        "through submitit, submitit's local processes, or Ray; resuming is the same")
    p.add_argument("--scheduler-dir", default=None, metavar="DIR",
                   help="submitit's job files and logs (default OUT/scheduler)")
    p.add_argument("--slurm-partition", default=None, help="--scheduler slurm: the partition")
    p.add_argument("--gpus-per-run", type=float, default=0, metavar="G",
                   help="--scheduler slurm/ray: GPUs each run asks for (default 0)")
    p.add_argument("--timeout-min", type=int, default=240, help="--scheduler slurm: a run's time limit (minutes)")
    p.add_argument("--ray-address", default=None, help="--scheduler ray: an existing cluster (default: a local one)")
    p.add_argument("--config-dir", default="configs", help="where the settings' YAML files are (default configs)")
    p.add_argument("--report-only", action="store_true", help="do not train; report the runs already there")
    p.add_argument("--dry-run", action="store_true",
                   help="list the runs the plan needs, their size (client SGD steps) and estimated time, and exit")
    p.add_argument("--steps-per-s", type=float, default=None, metavar="RATE",
                   help="client SGD steps per second of this machine, for the time estimate and --budget-s "
                        "(measure it: a finished run's steps over its wall time)")
    p.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                   help="with --steps-per-s: drop (setting, seed) units in the documented order until the plan "
                        "fits; what is dropped is printed and written to command.json")
    p.add_argument("--publish", default=None, metavar="DOCS_DIR",
                   help="also write DOCS_DIR/results.md and copy figures into DOCS_DIR/results/")


def machine_info() -> dict[str, Any]:
    """CPU model, cores, python and torch versions, for the report (read here, not in the core)."""
    import os

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "gpu": gpu, "platform": platform.platform()}


def git_commit() -> str:
    """fedent.provenance's commit, short, for the report's header."""
    from fedent.provenance import git_commit as commit_of

    info = commit_of()
    commit = str(info["commit"])
    commit = commit[:7] if len(commit) == 40 else commit
    declared = f"; declared by its maker: {info['declared_commit']}" if info.get("declared_commit") else ""
    return commit + (f" (uncommitted changes{declared})" if info.get("dirty") else "")


def outcomes(args: argparse.Namespace, plan: Plan, out: Path, budget: TimeBudget | None) -> Iterator[RunOutcome]:
    """The plan's outcomes from this command's pool (on ``--gpus``) or from ``--scheduler``'s."""
    from fedent.experiments.placement import parse_gpus
    from fedent.experiments.reproduce import run_plan
    from fedent.experiments.schedulers import RayBackend, SubmititBackend, run_external, submitit_executor

    if args.scheduler == "pool":
        yield from run_plan(plan, args.workers, args.threads, budget=budget, gpus=parse_gpus(args.gpus),
                            stack=args.stack)
        return
    if args.stack != 1:
        raise ConfigError("--stack works with the process pool only (--scheduler pool)")
    if budget is not None:
        raise ConfigError("--budget-s works with the process pool only; a scheduler has its own limits "
                          "(--timeout-min)")
    if args.scheduler == "ray":
        backend = RayBackend(args.ray_address, args.gpus_per_run, float(args.threads))
        try:
            yield from run_external(plan, backend)
        finally:
            backend.close()
        return
    folder = Path(args.scheduler_dir) if args.scheduler_dir else out / "scheduler"
    ex = submitit_executor(args.scheduler, folder, partition=args.slurm_partition,
                           gpus_per_run=int(args.gpus_per_run), cpus_per_run=args.threads,
                           timeout_min=args.timeout_min, parallel=args.workers)
    yield from run_external(plan, SubmititBackend(ex))


def run(args: argparse.Namespace) -> int:
    from fedent.experiments.budget import TimeBudget
    from fedent.experiments.compare import parse_list
    from fedent.experiments.plan import build_plan, client_steps, read_tuned, trim_plan, validate_plan_configs
    from fedent.experiments.profiles import get_profile
    from fedent.experiments.reproduce import is_complete
    from fedent.experiments.reproduce_report import publish, write_report

    profile = get_profile(args.profile, args.paper_datasets)
    seeds = parse_list(args.seeds, "seeds", int)
    only = parse_list(args.only, "only", str) if args.only else None
    if args.workers < 1 or args.threads < 1 or args.stack < 1:
        raise ConfigError("--workers/--threads/--stack: must be >= 1")
    out = Path(args.out)
    rows = parse_list(args.rows, "rows", str) if args.rows else None
    chosen = parse_list(args.settings, "settings", str) if args.settings else None
    tuned = read_tuned(args.tuned, profile)
    plan = build_plan(profile, seeds, out, args.config_dir, only, rows, rounds=args.rounds,
                      overrides=args.overrides, tuned=tuned, settings=chosen)
    validate_plan_configs(plan)
    dropped: list[tuple[str, int]] = []
    budget = None
    if args.budget_s is not None:
        if not args.steps_per_s or args.steps_per_s <= 0 or args.budget_s <= 0:
            raise ConfigError("--budget-s needs a positive budget and --steps-per-s")
        if args.dry_run:
            plan, dropped = trim_plan(plan, int(args.budget_s * args.steps_per_s))
        else:  # re-planned while it runs, at the measured rate (fedent.experiments.budget)
            # runs going at once: --stack K puts K runs in a worker, each with its share of the rate
            budget = TimeBudget(plan, args.budget_s, args.steps_per_s, args.workers * args.stack)
            dropped = list(budget.dropped)
        for st, sd in dropped:
            print(f"dropped to fit --budget-s {args.budget_s:g} at {args.steps_per_s:g} steps/s: setting {st}, "
                  f"seed {sd}")
    if args.dry_run:
        total = 0
        for spec in plan.runs:
            steps = client_steps(spec.config)
            total += steps
            after = f"  after {', '.join(spec.after)}" if spec.after else ""
            print(f"{spec.key}  rounds={spec.rounds}  client_steps={steps}{after}  -> {spec.run_dir}")
        est = f", about {total / args.steps_per_s / 60:.1f} min at {args.steps_per_s:g} steps/s" \
            if args.steps_per_s else ""
        print(f"{len(plan.runs)} runs in sections {', '.join(s.key for s in plan.sections)}: {total} client SGD "
              f"steps{est}")
        return 0
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: {one_line(e)}") from None
    started = time.time()
    failed = 0
    command = {"argv": ["fedent", "reproduce", *sys.argv[2:]] if sys.argv[1:2] == ["reproduce"]
               else ["fedent", "reproduce"], "workers": args.workers, "threads": args.threads, "started": started,
               "dropped": [{"setting": st, "seed": sd} for st, sd in dropped],
               "tuned": {k: {"file": t.source, "sha256": t.sha256} for k, t in plan.tuned.items()}}
    if not args.report_only:
        command.update(machine=machine_info(), commit=git_commit())
    if not args.report_only:
        runlog.atomic_write_json(out / "command.json", command)  # what trained the runs (a report-only pass reads it)
        print(f"fedent reproduce: {len(plan.runs)} runs, profile {profile.name}, {args.workers} worker(s) x "
              f"{args.threads} thread(s), out {out}", flush=True)
        not_run: dict[str, str] = {}
        started_runs: list[str] = []  # kept with the call in commands.jsonl: what it trained (reports credit it)
        try:
            for i, o in enumerate(outcomes(args, plan, out, budget), start=1):
                acc = "—" if o.final_acc is None else f"{o.final_acc:.4f}"
                extra = f" {o.error}" if o.error else ""
                if o.status not in ("not run", "skipped"):
                    started_runs.append(o.key)
                if o.status == "not run":
                    not_run[o.key] = str(o.error)
                    continue  # summarised below: with a tight budget these are most of the plan
                print(f"[{i}/{len(plan.runs)}] {o.status} {o.key} final_acc {acc} ({o.wall_s:.0f} s){extra}",
                      flush=True)
                failed += o.status == "failed"
        except input_error_types() as e:
            print(f"fedent reproduce: {one_line(e)}", file=sys.stderr)
            return 2
        if budget is not None:
            final = list(budget.dropped)
            measured = budget.measured()
            rate = "no run finished" if measured is None else f"a measured {measured:.0f} client steps/s"
            print(f"--budget-s {args.budget_s:g}: {len(plan.runs) - len(not_run)} of {len(plan.runs)} runs started "
                  f"in {budget.elapsed():.0f} s ({rate}); not run: {len(not_run)}; (setting, seed) units dropped in "
                  f"the documented order: {', '.join(f'{st}/s{sd}' for st, sd in final) or 'none'}", flush=True)
            reasons: dict[str, list[str]] = {}
            for key, why in not_run.items():
                if (key.split("/")[0], int(key.rsplit("-s", 1)[1])) not in final:
                    reasons.setdefault(why if "would not finish" not in why else "would not finish in the time "
                                       "left", []).append(key)
            for why, keys in reasons.items():
                more = f" and {len(keys) - 6} more (command.json)" if len(keys) > 6 else ""
                print(f"not run ({why}): {', '.join(keys[:6])}{more}")
            command["dropped"] = [{"setting": st, "seed": sd} for st, sd in final]
            command["not_run"] = not_run
            command["measured_steps_per_s"] = None if measured is None else round(measured, 1)
            runlog.atomic_write_json(out / "command.json", command)
        # command.json is the latest call; the history of every call that trained into --out (a GPU study resumed
        # over several device calls) is kept beside it, so no call's measured rate or budget is overwritten
        command["ended"] = time.time()
        command["started_runs"] = started_runs
        with open(out / "commands.jsonl", "a", encoding="utf-8") as history:
            history.write(json.dumps(runlog.jsonable(command), sort_keys=True) + "\n")
    trained = runlog.read_json(out / "command.json", default=None)
    mine = {st for sec in plan.sections for st in sec.settings}  # a report of fewer sections checks only theirs
    was = {k: v for k, v in ((trained.get("tuned") or {}) if isinstance(trained, dict) else {}).items() if k in mine}
    if args.report_only and {k: v["sha256"] for k, v in was.items()} != {k: t.sha256 for k, t in plan.tuned.items()}:
        shown = " ".join(f"{k}={v['file']}" for k, v in was.items()) or "(none)"  # else it reports other runs
        print(f"fedent reproduce: the runs in {out} were trained with --tuned {shown}; report them with the same "
              "tuned files", file=sys.stderr)
        return 2
    # runs a budget never started are not the report's business (command.json lists them), unless done since
    left_out = set(trained.get("not_run") or {}) if isinstance(trained, dict) else set()
    plan = replace(plan, runs=tuple(s for s in plan.runs if s.key not in left_out or is_complete(s.run_dir, s.rounds)))
    # where the runs trained comes from command.json (written when training starts); this machine only wrote the report
    meta = {"report_machine": machine_info(), "report_commit": git_commit(),
            **(trained if isinstance(trained, dict) else command),
            "report_command": command["argv"], "finished": time.time()}
    report = write_report(plan, out, meta)
    print(f"wrote {report}")
    if args.publish:
        md = publish(out, Path(args.publish))
        print(f"published {md}")
    return 1 if failed else 0
