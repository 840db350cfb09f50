"""The in-process simulator: the round engine (``fedent.rounds``) over the sequential or vectorised executor.

The round loop is the cluster aggregator's, with the same seeded streams, so a cluster run reproduces a
simulation; this module only assembles the inputs, checks the run directory and draws the progress bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedent import runlog
from fedent.config import ExperimentConfig, with_device
from fedent.distributed import World
from fedent.inputs import RunInputs, load_inputs, with_validation
from fedent.params import Params
from fedent.perf import apply_host, apply_trainer, batched_federated
from fedent.rounds import RoundEngine, RoundPolicy, RunError
from fedent.rounds.distributed import RANKS_DIR, DistributedExecutor, distributed_engine_parts
from fedent.rounds.evaluation import Evaluator, central_federated
from fedent.rounds.host import ClientStates, ClientTraining
from fedent.rounds.inprocess import InProcessExecutor, make_executor
from fedent.rounds.rundir import SIMULATOR, RunFinished, has_run, lock_run_dir, plan_run_dir, run_kind
from fedent.rounds.stacking import StackSeat, stack_key
from fedent.sim.progress import ProgressBar, format_duration
from fedent.strategies.base import Strategy
from fedent.strategies.registry import build_strategy
from fedent.trainer import LocalTrainer, resolve_device

SimulationError = RunError  # the name the simulator's callers catch


@dataclass(frozen=True)
class SimResult:
    run_dir: Path
    algorithm: str
    seed: int
    device: str
    params: Params  # the final global model, on the CPU
    records: list[dict[str, Any]] = field(repr=False)  # the metrics.jsonl lines
    wall_s: float

    @property
    def final_acc(self) -> float | None:
        return runlog.final_accuracy(self.records)

    @property
    def best_acc(self) -> float | None:
        accs = [r["test_acc"] for r in self.records if r.get("test_acc") is not None]
        return max(accs) if accs else None


def build_engine(cfg: ExperimentConfig, paths: runlog.RunPaths, inputs: RunInputs, device: torch.device,
                 strategy: Strategy, local_eval: int, on_round: Callable[[dict[str, Any]], None] | None = None,
                 policy: RoundPolicy | None = None, world: World | None = None,
                 seat: StackSeat | None = None) -> RoundEngine:
    """The round engine over the in-process executor: one trainer trains every client and evaluates.

    When the run checkpoints (``policy.checkpoint_keep``) a strategy's per-client state (FedDyn λ, SCAFFOLD c_i,
    FedEnt η) is kept on disk under ``client_state/``, as a worker keeps it, so a resumed round gets the state
    the client had before it. ``world``: one of P processes sharing the run (``fedent.rounds.distributed``).
    ``seat``: the run trains side by side with others in this process (``fedent.rounds.stacking``)."""
    tr = cfg.train
    data = inputs.data
    trainer = LocalTrainer(inputs.make_model(), data.x_train, data.y_train, tr.batch_size, device, tr.precision)
    apply_trainer(tr.perf, trainer)  # train.perf's levers (fedent.perf); all off by default
    states = None
    if policy is not None and policy.checkpoint_keep > 0 and strategy.keeps_client_state:
        from fedent.client_store import ClientStateStore

        # written in the background (off the round's critical path); flushed before every checkpoint below
        store = ClientStateStore(paths.root / "client_state", keep=policy.checkpoint_keep + 1, background=True)
        states = ClientStates(store, trainer.device)
    executor = make_executor(tr.executor, trainer, inputs.client_indices, ClientTraining.from_config(cfg),
                             tr.max_parallel_clients, tr.conv, states=states,
                             stack=(seat, stack_key(cfg)) if seat is not None else None)
    apply_host(tr.perf, executor.host)
    if world is not None and world.distributed:
        executor_, evaluator = distributed_engine_parts(world, executor, cfg, inputs, trainer, local_eval,
                                                        strategy)
        engine = RoundEngine(cfg, paths, strategy, executor_, evaluator, trainer.params, inputs.client_sizes(),
                             dict(inputs.partition_info), policy, on_round=on_round)
        return _durable(engine, states)
    federated = None
    if tr.evaluation == "federated" and tr.evaluate_test:
        make = batched_federated if tr.perf.eval_batched else central_federated
        federated = make(trainer, data.x_test, data.y_test, inputs.num_clients, tr.seed, tr.eval_batch_size)
    evaluator = Evaluator(trainer, data.x_test, data.y_test, tr.eval_batch_size, tr.seed, local_eval, federated,
                          validation=validation_set(inputs), test=tr.evaluate_test)
    engine = RoundEngine(cfg, paths, strategy, executor, evaluator, trainer.params, inputs.client_sizes(),
                         dict(inputs.partition_info), policy, on_round=on_round)
    return _durable(engine, states)


def _durable(engine: RoundEngine, states: ClientStates | None) -> RoundEngine:
    """The engine flushes the background client-state writes before each checkpoint and closes them at the end."""
    if states is not None and states.store is not None:
        engine.before_checkpoint.append(states.store.flush)
        engine.after_run.append(states.store.close)
    return engine


def validation_set(inputs: RunInputs) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The held-out validation samples of ``inputs`` (data.validation_fraction), or None."""
    ix = inputs.validation_indices
    if ix is None:
        return None
    sel = torch.from_numpy(ix)
    return inputs.data.x_train[sel], inputs.data.y_train[sel]


def start_banner(cfg: ExperimentConfig, inputs: RunInputs, device: torch.device, engine: RoundEngine) -> str:
    """One line saying what is about to run, printed before round 1 (a long first round is not silent)."""
    d, tr = cfg.data, cfg.train
    scheme = str(inputs.partition_info.get("scheme", d.partition))
    alpha = f" alpha={d.alpha}" if scheme == "dirichlet" else ""
    host = getattr(engine.executor, "host", None)
    executor = getattr(host, "kind", tr.executor)
    return (f"fedent simulate: {d.name} ({len(inputs.data.y_train)} train / {len(inputs.data.y_test)} test), "
            f"{scheme}{alpha} over {inputs.num_clients} clients, model {cfg.model.name}, {engine.strategy.name}, "
            f"device {device}, executor {executor}, {tr.rounds} rounds x {tr.local_epochs} local epoch(s), "
            f"fraction {tr.fraction}; run dir {engine.paths.root}")


def _checked(cfg: ExperimentConfig, run_dir: str | Path, inputs: RunInputs | None, strategy: Strategy | None,
             local_eval: int | None, policy: RoundPolicy | None,
             resume: bool) -> tuple[RunInputs, Strategy, int]:
    """run_simulation's checks before any file is written: the inputs, strategy and local-eval count to use."""
    if inputs is None:
        inputs = load_inputs(cfg)
    inputs = with_validation(inputs, cfg)  # injected inputs (a comparison's, a test's) get the split too
    if inputs.num_clients != cfg.data.num_clients:
        raise SimulationError(f"the partition has {inputs.num_clients} clients but data.num_clients is "
                              f"{cfg.data.num_clients}")
    if strategy is None:
        strategy = build_strategy(cfg.algorithm)
    k = getattr(cfg.train, "local_eval", 0) if local_eval is None else local_eval
    if has_run(Path(run_dir)):  # any run's files, not only a logged round: never write into a cluster run
        if not resume or policy is None or policy.checkpoint_keep <= 0:
            kind = run_kind(runlog.RunPaths(Path(run_dir))) or "started"
            raise SimulationError(f"{run_dir} already holds a {kind} run; choose another run directory")
        plan = plan_run_dir(run_dir, cfg, SIMULATOR)  # refuses another kind of run, another config, ...
        if plan.action == "finished":
            raise RunFinished(plan.detail)
        if plan.action == "resume":
            print(f"fedent: resuming {run_dir} {plan.detail}", file=sys.stderr, flush=True)
    return inputs, strategy, int(k)


def run_simulation(
    cfg: ExperimentConfig,
    run_dir: str | Path,
    device: str | None = None,
    progress: bool = True,
    *,
    inputs: RunInputs | None = None,
    strategy: Strategy | None = None,
    local_eval: int | None = None,
    plots: bool = True,
    label: str = "",
    bar: bool = True,
    policy: RoundPolicy | None = None,
    resume: bool = False,
    banner: bool = False,
    world: World | None = None,
    seat: StackSeat | None = None,
) -> SimResult:
    """Run ``cfg`` in this process and write a complete run directory at ``run_dir``.

    ``inputs`` (data, partition, model factory) defaults to the configured dataset; a comparison passes
    the same inputs to every algorithm. ``local_eval`` overrides ``train.local_eval``. ``progress``: a bar
    on a terminal, else one line per round on stdout; ``bar=False`` keeps only the lines (see ProgressBar).
    ``policy``: how a round copes with failed or rejected clients (default: every participant must be
    accepted, no retry, so a rejected upload ends the run; the cluster's is its aggregator's settings).
    ``resume``: a run directory holding this config's unfinished simulator run is continued from its newest
    checkpoint (needs ``policy.checkpoint_keep``); a finished one raises ``RunFinished``; anything else is
    refused (``RunDirError``) before a file is written. Without it any existing run is refused.
    ``banner``: a start line (dataset, partition, model, device, executor, rounds) and, once the
    first round is done, the estimated duration; the bar (or the plain lines) also counts clients within a round.
    ``world``: this process is one of P running the run together (``fedent.rounds.distributed``); rank 0 writes
    ``run_dir``, prints and plots, rank r > 0 keeps its engine's files under ``run_dir/.ranks/r``.
    ``seat``: this run's seat in a ``fedent.rounds.stacking.TrainerStack``: its clients train in one step with
    the other runs of the stack (this call runs in a thread of its own; the seat is left when the run ends).
    """
    try:
        return _run_simulation(cfg, run_dir, device, progress, inputs=inputs, strategy=strategy,
                               local_eval=local_eval, plots=plots, label=label, bar=bar, policy=policy,
                               resume=resume, banner=banner, world=world, seat=seat)
    finally:
        if seat is not None:
            seat.leave()


def _run_simulation(cfg: ExperimentConfig, run_dir: str | Path, device: str | None, progress: bool, *,
                    inputs: RunInputs | None, strategy: Strategy | None, local_eval: int | None, plots: bool,
                    label: str, bar: bool, policy: RoundPolicy | None, resume: bool, banner: bool,
                    world: World | None, seat: StackSeat | None) -> SimResult:
    if seat is not None and world is not None and world.distributed:
        raise SimulationError("stacked runs train in one process; they cannot also split over processes")
    cfg = with_device(cfg, device)
    if world is not None and world.distributed and not world.leader:
        run_dir = Path(run_dir) / RANKS_DIR / str(world.rank)
        progress = plots = banner = False
    lock = lock_run_dir(run_dir)  # one owner at a time: refused while another process runs here
    try:
        if cfg.data.placement != "central":
            raise SimulationError("data.placement: workers keeps each client's data on its worker; the simulator reads "
                                  "the dataset centrally: use --set data.placement=central (or fedent cluster up)")
        dev = resolve_device(cfg.train.device)
        try:
            inputs, strategy, k = _checked(cfg, run_dir, inputs, strategy, local_eval, policy, resume)
        except Exception as e:
            if world is None or not world.distributed:
                raise
            world.agree(e)
            raise  # agree re-raised it already
        if world is not None:
            world.agree(None)
        paths = runlog.create_run_dir(run_dir, exist_ok=True)
        progress_bar = ProgressBar(cfg.train.rounds, label=label, enabled=progress, bar=bar)
        last_acc: list[float | None] = [None]

        first_round: list[int | None] = [None]

        def on_round(rec: dict[str, Any]) -> None:
            if rec["test_acc"] is not None:
                last_acc[0] = rec["test_acc"]
            progress_bar.update(rec["round"], last_acc[0])
            if banner and first_round[0] is None:
                first_round[0] = rec["round"]
                left = cfg.train.rounds - rec["round"]
                progress_bar.note(f"estimated {format_duration(rec['wall_s'] * left)} to go: {left} more round(s) at "
                                  f"{format_duration(rec['wall_s'])} each", always=True)
                if progress_bar.enabled:  # the note cleared the bar
                    progress_bar.update(rec["round"], last_acc[0])

        engine = build_engine(cfg, paths, inputs, dev, strategy, k, on_round, policy, world, seat)
        if banner:
            progress_bar.note(start_banner(cfg, inputs, dev, engine), always=True)
            if isinstance(engine.executor, InProcessExecutor | DistributedExecutor):
                engine.executor.on_client = progress_bar.client
        try:
            records = engine.run()
        finally:
            progress_bar.close()
            if seat is not None:  # the other runs of the stack stop waiting for this one now, not after the plots
                seat.leave()
        params = [p.detach().cpu() for p in engine.global_params]
        result = SimResult(paths.root, engine.strategy.name, cfg.train.seed, str(dev), params, records,
                           time.perf_counter() - engine.t_start)
        if plots:
            from fedent.plots import plot_run

            plot_run(paths.root)
        return result
    finally:
        lock.release()
