"""``fedent simulate``: one experiment in this process, written to a run directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fedent.commands.errors import check_device, input_error_types, one_line, set_threads
from fedent.config import EXECUTORS, ConfigError, load_config
from fedent.runlog import new_run_id
from fedent.signals import Stopped, stop_reason

if TYPE_CHECKING:
    from fedent.config import ExperimentConfig
    from fedent.distributed import World

HELP = "run one experiment in-process (the simulator)"
REDUCE_CHOICES = ("auto", "gather", "sum")  # fedent.distributed.REDUCE_CHOICES, without importing torch here


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("simulate", help=HELP,
                              description="Run one federated experiment in this process and write a run directory.")
    p.add_argument("--config", required=True, help="experiment YAML (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.rounds=5 (repeatable)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                   help="where to train (default: train.device from the config; auto = CUDA if present)")
    p.add_argument("--executor", choices=EXECUTORS, default=None,
                   help="how a round's clients run (default: train.executor; auto = vectorised on CUDA)")
    p.add_argument("--max-parallel-clients", type=int, default=None, metavar="N",
                   help="vectorised executor: at most N clients per step (default: from free device memory)")
    p.add_argument("--out", default=None, help="directory for run directories (default: out_dir of the config)")
    p.add_argument("--run-id", default=None,
                   help="name of the run directory (default: name-algorithm-seed-time); an unfinished run of the same "
                        "config there is resumed from its last checkpoint, a finished one is reported")
    p.add_argument("--local-eval", type=int, default=None, metavar="K",
                   help="evaluate K uploaded local models per eval round (deviation analysis)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for torch (default: torch's choice; 1 is fastest on a busy machine)")
    p.add_argument("--quorum", type=float, default=1.0, metavar="Q",
                   help="fraction of a round's participants whose uploads must be accepted (default 1.0: a "
                        "rejected upload, e.g. a non-finite model, ends the run; the cluster's default is 0.5)")
    p.add_argument("--round-retries", type=int, default=0, metavar="N",
                   help="a round that missed its quorum: -1 skips it, N >= 0 retries it with fresh clients N "
                        "times before the run fails (default 0)")
    p.add_argument("--checkpoint-keep", type=int, default=2, metavar="K",
                   help="checkpoints kept in RUN_DIR/checkpoint/, one written after every round, so a run stopped by "
                        "SIGTERM/SIGINT or killed resumes on the same --out/--run-id (default 2; 0: none, no resume)")
    p.add_argument("--procs", type=int, default=None, metavar="P",
                   help="split each round's clients over P processes on this machine (gloo on the CPU, NCCL on "
                        "GPUs; the same model as one process at the same threads per process); torchrun "
                        "--nproc-per-node P -m fedent simulate ... does the same across machines")
    p.add_argument("--reduce", choices=REDUCE_CHOICES, default="auto",
                   help="with --procs or torchrun: how the processes combine a round's updates: sum all-reduces "
                        "their weighted sum (one model's traffic; the one-process model to float rounding), gather "
                        "all-gathers every update (the one-process model bit for bit), auto (default) sums "
                        "wherever the strategy and options allow and gathers elsewhere")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="skip writing plots/*.png at the end")


def executor_overrides(args: argparse.Namespace) -> list[str]:
    """--executor and --max-parallel-clients as config overrides, so config.yaml records what ran."""
    out = [f"train.executor={args.executor}"] if args.executor else []
    if args.max_parallel_clients is not None:
        out.append(f"train.max_parallel_clients={args.max_parallel_clients}")
    return out


def child_argv(args: argparse.Namespace, run_id: str, threads: int) -> list[str]:
    """The ``fedent simulate`` arguments of one process of a ``--procs`` launch: this command's, without
    ``--procs``, with the run id fixed (every rank must name the same run) and the threads split."""
    argv = ["simulate", "--config", str(args.config), "--run-id", run_id, "--threads", str(threads),
            "--quorum", repr(args.quorum), "--round-retries", str(args.round_retries),
            "--checkpoint-keep", str(args.checkpoint_keep), "--reduce", args.reduce]
    for o in args.overrides:
        argv += ["--set", o]
    for flag, value in (("--device", args.device), ("--executor", args.executor),
                        ("--max-parallel-clients", args.max_parallel_clients), ("--out", args.out),
                        ("--local-eval", args.local_eval)):
        if value is not None:
            argv += [flag, str(value)]
    argv += [flag for flag, on in (("--no-progress", args.no_progress), ("--no-plots", args.no_plots)) if on]
    return argv


def launch(args: argparse.Namespace, run_id: str) -> int:
    """``--procs P``: start P ranks of this command (what torchrun would) and wait for them all; when one
    fails the others are stopped (they would wait for it in a collective)."""
    import os
    import subprocess
    import time

    from fedent.distributed import free_port, rank_env

    procs = int(args.procs)
    threads = args.threads or max(1, (os.cpu_count() or 1) // procs)
    port = free_port()
    children = [subprocess.Popen([sys.executable, "-m", "fedent", *child_argv(args, run_id, threads)],
                                 env=rank_env(r, procs, port)) for r in range(procs)]
    try:
        while True:
            codes = [c.poll() for c in children]
            bad = [rc for rc in codes if rc not in (None, 0)]
            if bad or all(rc == 0 for rc in codes):
                break
            time.sleep(0.1)
    finally:
        for c in children:
            if c.poll() is None:
                c.terminate()
        for c in children:
            try:
                c.wait(timeout=30)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
    ends = [int(c.returncode) for c in children]
    failed = [rc for rc in ends if rc > 0] + [rc for rc in ends if rc < 0]  # an error before a signal
    return failed[0] if failed else 0


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, [*args.overrides, *executor_overrides(args)])
    if args.local_eval is not None and args.local_eval < 0:
        raise ConfigError("--local-eval: must be >= 0")
    check_device(cfg, args.device)
    if not 0.0 <= args.quorum <= 1.0:
        raise ConfigError(f"--quorum: must be in [0, 1], got {args.quorum}")
    if args.round_retries < -1:
        raise ConfigError(f"--round-retries: must be >= -1, got {args.round_retries}")
    if args.checkpoint_keep < 0:
        raise ConfigError(f"--checkpoint-keep: must be >= 0, got {args.checkpoint_keep}")
    if args.procs is not None and args.procs < 1:
        raise ConfigError(f"--procs: must be >= 1, got {args.procs}")
    if args.reduce == "sum":
        from fedent.rounds.distributed import sum_blocker
        from fedent.strategies.registry import strategy_class

        local_eval = cfg.train.local_eval if args.local_eval is None else args.local_eval
        why = sum_blocker(cfg, strategy_class(cfg.algorithm.name), local_eval)
        if why is not None:
            raise ConfigError(f"--reduce sum: this run cannot be reduced to sums: {why} (use --reduce auto or gather)")
    set_threads(args.threads)
    out = Path(args.out if args.out is not None else cfg.out_dir)
    run_id = args.run_id or new_run_id(cfg.name, cfg.algorithm.name, cfg.train.seed)
    if args.procs is not None and args.procs > 1:
        return launch(args, run_id)
    from fedent.distributed import World, WorldError
    from fedent.trainer import resolve_device

    try:
        world = World.from_env(device=resolve_device(args.device or cfg.train.device).type, reduce=args.reduce)
    except (WorldError, RuntimeError, ValueError) as e:
        print(f"fedent simulate: {one_line(e)}", file=sys.stderr)
        return 2
    try:
        return _simulate(args, cfg, out, world.broadcast(run_id), world)
    finally:
        world.close()


def _simulate(args: argparse.Namespace, cfg: ExperimentConfig, out: Path, run_id: str, world: World) -> int:
    """One process's run (the only one, or rank ``world.rank`` of several)."""
    from fedent.distributed import WorldError
    from fedent.rounds import RoundPolicy
    from fedent.rounds.rundir import RunFinished
    from fedent.sim.simulator import SimulationError, run_simulation

    resumable = args.checkpoint_keep > 0
    if not resumable and (out / run_id / "metrics.jsonl").exists():
        raise ConfigError(f"--run-id: {out / run_id} already holds a run; choose another --run-id or --out")
    try:
        res = run_simulation(cfg, out / run_id, device=args.device, progress=not args.no_progress,
                             local_eval=args.local_eval, plots=not args.no_plots,
                             policy=RoundPolicy(args.quorum, args.round_retries, args.checkpoint_keep),
                             resume=resumable, banner=True, world=world)
    except RunFinished as e:
        if world.leader:  # rank r > 0 found its .ranks/r copy finished too: one line is enough
            print(f"fedent simulate: {e}")
        return 0
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM (fedent.signals): status.json says stopped, and why
        again = "" if args.run_id else f" --run-id {run_id}"
        hint = f"; the same command{again} resumes it" if resumable else ""
        print(f"fedent simulate: {stop_reason(e)} ({out / run_id}){hint}", file=sys.stderr)
        return e.exit_code if isinstance(e, Stopped) else 130
    except (SimulationError, WorldError) as e:
        print(f"fedent simulate: run failed: {one_line(e)} (see {out / run_id}/status.json)", file=sys.stderr)
        return 1
    except input_error_types() as e:
        print(f"fedent simulate: {one_line(e)}", file=sys.stderr)
        return 2
    if not world.leader:
        return 0
    final = f"{res.final_acc:.4f}" if res.final_acc is not None else "n/a"
    best = f"{res.best_acc:.4f}" if res.best_acc is not None else "n/a"
    print(f"{res.algorithm}: final test accuracy {final} (best {best}) after {cfg.train.rounds} rounds "
          f"in {res.wall_s:.1f}s on {res.device}; run dir {res.run_dir}")
    return 0
