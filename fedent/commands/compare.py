"""``fedent compare``: several algorithms x seeds on identical partitions and sampling -> compare.md + figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedent.commands.errors import check_device, input_error_types, one_line, set_threads
from fedent.config import ConfigError, load_config

DEFAULT_ALGORITHMS = "fedavg,fedadam,fedprox,feddyn,fedent"
HELP = "compare algorithms on identical partitions and client sampling"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "compare", help=HELP,
        description="Run several algorithms for several seeds on identical data, partitions and client sampling; "
                    "write compare.md (final/best accuracy, rounds to target) and paper-style figures.")
    p.add_argument("--config", required=True, help="experiment YAML (its algorithm section is the default options)")
    p.add_argument("--algorithms", default=DEFAULT_ALGORITHMS,
                   help=f"comma-separated (default {DEFAULT_ALGORITHMS}); LABEL=ALGORITHM adds a control row, e.g. "
                        "fedent-fixed=fedent with --algo-set fedent-fixed.rates=fixed")
    p.add_argument("--tuned", default=None, metavar="FILE",
                   help="a tuned.json of fedent tune: each algorithm's chosen values and the validation split "
                        "they were tuned on (a LABEL=ALGORITHM row inherits its algorithm's values)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for every run (repeatable)")
    p.add_argument("--algo-set", dest="algo_overrides", action="append", default=[], metavar="ALGO.KEY=VALUE",
                   help="an option of one algorithm, e.g. fedprox.mu=0.1 (repeatable)")
    p.add_argument("--target", type=float, default=None,
                   help="accuracy for 'rounds to reach' (default: train.target_accuracy)")
    p.add_argument("--local-eval", type=int, default=None, metavar="K",
                   help="evaluate K uploaded local models per eval round (deviation figure)")
    p.add_argument("--tail-k", type=int, default=None, metavar="K",
                   help="end point of the paired comparison: mean test accuracy of the last K evaluated rounds "
                        "(default 5)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    p.add_argument("--out", default=None, help="output directory (default: <out_dir>/compare-<name>)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run N of the comparison's runs at once, each in its own process (default 1)")
    p.add_argument("--stack", type=int, default=1, metavar="K",
                   help="up to K consecutive runs (a seed's algorithms, then the next seed's) train side by side in "
                        "one process, their clients in one vectorised step (train.executor: vectorised); the "
                        "results are the same (default 1)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from fedent.experiments.compare import parse_list, run_comparison

    cfg = load_config(args.config, args.overrides)
    algorithms = parse_list(args.algorithms, "algorithms", str)
    seeds = parse_list(args.seeds, "seeds", int)
    if args.target is not None and not 0.0 < args.target <= 1.0:
        raise ConfigError("--target: must be an accuracy in (0, 1]")
    if args.local_eval is not None and args.local_eval < 0:
        raise ConfigError("--local-eval: must be >= 0")
    if args.workers < 1:
        raise ConfigError("--workers: must be >= 1")
    if args.tail_k is not None and args.tail_k < 1:
        raise ConfigError("--tail-k: must be >= 1")
    check_device(cfg, args.device)
    set_threads(args.threads)
    from fedent.experiments.tuning import Tuned

    tuned = Tuned.read(args.tuned) if args.tuned else None
    out = Path(args.out) if args.out else Path(cfg.out_dir) / f"compare-{cfg.name}"
    if (out / "runs").exists() and any((out / "runs").iterdir()):  # an interrupted comparison: continue it
        print(f"fedent compare: continuing the comparison in {out} (finished runs are kept, an interrupted one "
              "resumes)", file=sys.stderr)
    try:
        res = run_comparison(cfg, algorithms, seeds, out, target=args.target, algo_overrides=args.algo_overrides,
                             device=args.device, progress=not args.no_progress, local_eval=args.local_eval,
                             workers=args.workers, tuned=tuned, stack=args.stack,
                             **({} if args.tail_k is None else {"tail_k": args.tail_k}))
    except input_error_types() as e:
        print(f"fedent compare: {one_line(e)}", file=sys.stderr)
        return 2
    from fedent.experiments.compare import markdown_table

    print(markdown_table(res.summaries, res.target))
    print(f"wrote {out / 'compare.md'} and {len(res.figures)} figures in {out / 'figures'}")
    failed = sum(s.failed for s in res.summaries)
    return 1 if failed else 0
