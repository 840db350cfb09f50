"""``fedent tune``: each algorithm's rate and options from a bracketed grid, scored on a validation split only.

Writes tuned.json (read by ``fedent compare --tuned``) and tune.md; the test set is never evaluated here
(fedent.experiments.tuning).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from fedent.commands.errors import check_device, input_error_types, one_line, set_threads
from fedent.config import ConfigError, load_config

DEFAULT_ALGORITHMS = "fedavg,fedadam,fedprox,feddyn,fedent"
HELP = "tune each algorithm on a validation split (bracketed grids) -> tuned.json for fedent compare --tuned"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "tune", help=HELP,
        description="Tune each algorithm's rate (and FedEnt's β, γ; FedProx's μ; FedDyn's α; FedAdam's server rate) "
                    "on a validation split carved from every client's training data, never on the test set. A "
                    "grid whose best value is at an edge is extended in that direction (--max-extend times).")
    p.add_argument("--config", required=True, help="experiment YAML (the setting to tune for)")
    p.add_argument("--algorithms", default=DEFAULT_ALGORITHMS, help=f"comma-separated (default {DEFAULT_ALGORITHMS})")
    p.add_argument("--seeds", default="0", help="comma-separated tuning seeds; a point's score is their mean")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for every run (repeatable)")
    p.add_argument("--grid", action="append", default=[], metavar="[ALGO.]KEY=V1,V2,...",
                   help="a starting grid, e.g. train.lr=0.01,0.03,0.1 or fedprox.algorithm.mu=0.001,0.01 "
                        "(repeatable)")
    p.add_argument("--knobs", default=None, metavar="KEY[,KEY...]",
                   help="tune only these knobs, e.g. train.lr; the others stay at the config's (the paper's) value "
                        "and the report says they were not tuned (default: every knob of each algorithm)")
    p.add_argument("--validation-fraction", type=float, default=0.1,
                   help="share of every client's training samples held out for validation (default 0.1)")
    p.add_argument("--max-extend", type=int, default=2, help="extensions of a grid past an edge (default 2)")
    p.add_argument("--tail-k", type=int, default=5, metavar="K",
                   help="score: mean validation accuracy of the last K evaluated rounds (default 5)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    p.add_argument("--out", default=None, help="output directory (default: <out_dir>/tune-<name>)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for torch (per worker with --workers > 1, default 1 there)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run the tuning in N worker processes: the algorithms at once, and a knob's untried values "
                        "(x the seeds) at once; each worker loads the data itself; the chosen values do not "
                        "depend on N (default 1: one run at a time in this process)")
    p.add_argument("--reuse", action="append", default=[], metavar="DIR",
                   help="an earlier search's --out (repeatable): a point whose run is absent here is read back from "
                        "a finished or diverged run there with the same config (copied in, files unchanged), not "
                        "trained; e.g. a search that adds a knob reuses the runs trained at its default")
    p.add_argument("--stack", type=int, default=1, metavar="K",
                   help="up to K runs of a knob's untried values (x the seeds) train side by side in one process, "
                        "their clients in one vectorised step (train.executor: vectorised); the scores do not "
                        "depend on K (default 1)")


def parse_grids(texts: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for t in texts:
        key, eq, values = t.partition("=")
        try:
            out[key.strip()] = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"--grid {t!r}: values must be numbers") from None
        if not eq or not key.strip():
            raise ConfigError(f"--grid {t!r}: expected [ALGO.]KEY=V1,V2,...")
    return out


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from fedent.experiments.compare import parse_list
    from fedent.experiments.tuning import Tuner, check_knobs, tune_table, write_tuned
    from fedent.sim.simulator import SimulationError

    cfg = load_config(args.config, args.overrides)
    if args.device:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=args.device))
    algorithms = parse_list(args.algorithms, "algorithms", str)
    seeds = parse_list(args.seeds, "seeds", int)
    grids = parse_grids(args.grid)
    knobs = None if args.knobs is None else parse_list(args.knobs, "knobs", str)
    if args.tail_k < 1:
        raise ConfigError("--tail-k: must be >= 1")
    if args.workers < 1:
        raise ConfigError("--workers: must be >= 1")
    check_device(cfg, args.device)
    if knobs is not None:  # before a pool of workers starts
        check_knobs(algorithms, grids, knobs)
    out = Path(args.out) if args.out else Path(cfg.out_dir) / f"tune-{cfg.name}"
    errors: tuple[type[BaseException], ...] = (*input_error_types(), SimulationError)
    with contextlib.ExitStack() as stack:
        pool = None
        if args.workers > 1:
            from fedent.experiments.placement import visible_gpus
            from fedent.experiments.reproduce import process_pool

            if args.threads is not None and args.threads < 1:
                raise ConfigError("--threads: must be >= 1")
            pool = stack.enter_context(process_pool(args.workers, args.threads or 1, visible_gpus()))
        else:
            set_threads(args.threads)
        tuner = Tuner(cfg, seeds, out, fraction=args.validation_fraction, tail_k=args.tail_k,
                      max_extend=args.max_extend, log=lambda line: print(line, file=sys.stderr, flush=True),
                      pool=pool, stack=args.stack, reuse=[Path(d) for d in args.reuse])
        try:
            results = tuner.tune_all(algorithms, grids, knobs)
        except errors as e:
            print(f"fedent tune: {one_line(e)}", file=sys.stderr)
            return 2
    write_tuned(out / "tuned.json", tuner, results)
    print("\n".join(tune_table(results, tuner)))
    print(f"wrote {out / 'tuned.json'} and {out / 'tune.md'} ({tuner.runs} runs)")
    return 0
