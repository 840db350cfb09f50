"""The in-process simulator: drives a strategy through T rounds exactly as docs/architecture.md says.

One ``LocalTrainer`` (one model object, the data moved to the device once, one index tensor per client
built once) trains every client in turn; client state lives in a dict that persists across rounds. The
round protocol (sample, probe, payload, fit in cid order, aggregate) is the one the cluster aggregator
runs, with the same seeded streams, so a cluster run reproduces a simulation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedent import runlog
from fedent.config import ExperimentConfig
from fedent.params import Params, all_finite, clone, num_elements
from fedent.rng import numpy_rng, sample_clients
from fedent.sim.inputs import SimInputs, load_inputs
from fedent.sim.progress import ProgressBar
from fedent.strategies.base import ClientState, ClientTask, ClientUpdate, Probe, Strategy
from fedent.strategies.registry import build_strategy
from fedent.trainer import LocalTrainer, resolve_device


class SimulationError(RuntimeError):
    """A run that cannot go on (e.g. the global model diverged to NaN); the message is one line."""


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


def is_eval_round(rnd: int, rounds: int, every: int) -> bool:
    """Every ``every`` rounds (counting from 1) and always the last round."""
    return (rnd + 1) % every == 0 or rnd == rounds - 1


def weighted_train_loss(updates: Sequence[ClientUpdate]) -> float | None:
    total = sum(u.num_samples for u in updates)
    if total <= 0:
        return None
    return sum(u.train_loss * u.num_samples for u in updates) / total


def has_prepare(strategy: Strategy) -> bool:
    """True when the strategy overrides the base ``prepare`` hook (FedEnt offline mode, Algorithm 1)."""
    own = getattr(type(strategy), "prepare", None)
    base = getattr(Strategy, "prepare", None)
    return own is not None and own is not base


class _Run:
    """The state of one simulation (kept in one object so each step is a small method)."""

    def __init__(self, cfg: ExperimentConfig, paths: runlog.RunPaths, inputs: SimInputs, device: torch.device,
                 strategy: Strategy, local_eval: int, progress: bool, label: str) -> None:
        self.cfg, self.paths, self.inputs, self.device = cfg, paths, inputs, device
        self.strategy = strategy
        self.local_eval = local_eval
        self.seed = cfg.train.seed
        self.rounds = cfg.train.rounds
        model = inputs.make_model()
        data = inputs.data
        self.trainer = LocalTrainer(model, data.x_train, data.y_train, cfg.train.batch_size, device)
        self.x_test = data.x_test.to(device)
        self.y_test = data.y_test.to(device)
        self.indices: list[Tensor] = [torch.tensor(np.asarray(ix), dtype=torch.int64) for ix in inputs.client_indices]
        self.sizes = inputs.client_sizes()
        self.states: dict[int, ClientState] = {}
        self.global_params: Params = clone(self.trainer.params)
        self.model_bytes = num_elements(self.global_params) * self.global_params[0].element_size()
        self.clients: list[dict[str, Any]] = [
            runlog.client_row(cid, worker="simulator", state="idle", device=str(device), samples=n,
                              participation=0, bytes=0)
            for cid, n in enumerate(self.sizes)
        ]
        self.metrics = runlog.MetricsLog(paths.metrics)
        self.records: list[dict[str, Any]] = []
        self.estimator_report: dict[str, Any] = {}
        self.trajectory: list[dict[str, Any]] = []
        self.started_at = time.time()
        self.t_start = time.perf_counter()
        self.bar = ProgressBar(self.rounds, label=label, enabled=progress)

    # ---- bookkeeping -------------------------------------------------------------------------
    def status(self, phase: str, rnd: int | None, **state: Any) -> None:
        runlog.atomic_write_json(self.paths.status, runlog.status_record(
            self.paths.run_id, self.strategy.name, phase, rnd, self.rounds, self.started_at,
            {"device": str(self.device), **state}))

    def state_of(self, cid: int) -> ClientState:
        st = self.states.get(cid)
        if st is None:
            st = self.strategy.init_client_state(cid, self.sizes[cid])
            self.states[cid] = st
        return st

    def write_start_files(self) -> None:
        runlog.write_config(self.paths.config, self.cfg.to_dict())
        runlog.atomic_write_json(self.paths.partition, self.inputs.partition_info)
        runlog.write_clients(self.paths.clients, self.clients)
        self.status("starting", None)

    # ---- steps ---------------------------------------------------------------------------------
    def setup(self) -> None:
        self.strategy.setup(self.global_params, self.sizes)
        if has_prepare(self.strategy):
            from fedent.meanfield.oracle import TrainerOracle

            self.status("estimating", None)
            oracle = TrainerOracle(self.trainer, self.indices, self.seed, self.cfg.train.batch_size)
            report = self.strategy.prepare(oracle, self.global_params, self.sizes,  # type: ignore[attr-defined]
                                           self.rounds)
            self.estimator_report = dict(report or {})
            if self.estimator_report:
                self.write_estimator()

    def write_estimator(self) -> None:
        runlog.atomic_write_json(self.paths.estimator, {
            "algorithm": self.strategy.name, "report": self.estimator_report, "trajectory": self.trajectory})

    def train_round(self, rnd: int, participants: list[int]) -> list[ClientUpdate]:
        tr = self.cfg.train
        tasks = [ClientTask(cid, rnd, self.indices[cid], tr.lr, tr.local_epochs, self.seed) for cid in participants]
        states = [self.state_of(cid) for cid in participants]
        probes: list[Probe] = []
        if self.strategy.needs_probe:
            probes = [self.strategy.probe(self.trainer, self.global_params, task, st)
                      for task, st in zip(tasks, states, strict=True)]
        payload = self.strategy.round_payload(rnd, self.global_params, probes)
        return [self.strategy.fit(self.trainer, self.global_params, payload, task, st)
                for task, st in zip(tasks, states, strict=True)]

    def evaluate(self, params: Sequence[Tensor]) -> tuple[float, float]:
        self.trainer.load(params)
        return self.trainer.evaluate(self.x_test, self.y_test, self.cfg.train.eval_batch_size)

    def evaluate_local(self, rnd: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """The deviation analysis (paper Fig. client_dev): a seeded sample of uploaded local models on the test set."""
        k = min(self.local_eval, len(updates))
        pick = sorted(int(i) for i in numpy_rng(self.seed, "eval", rnd).choice(len(updates), size=k, replace=False))
        accs = [self.evaluate(updates[i].params)[1] for i in pick]
        return {"local_acc": accs, "local_clients": [updates[i].cid for i in pick]}

    def record_clients(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        now = time.time()
        taken = {u.cid: u for u in updates}
        for row in self.clients:
            u = taken.get(row["cid"])
            if u is None:
                row["state"] = "idle"
                continue
            row["state"] = "done"
            row["participation"] += 1
            row["bytes"] += 2 * self.model_bytes  # model down + local model up, as the cluster would send
            row["eta"] = u.scalars.get("eta", row["eta"])
            row["eta_star"] = u.scalars.get("eta_star", row["eta_star"])
            row["last_heartbeat"] = now
            row["last_round"] = rnd
        runlog.write_clients(self.paths.clients, self.clients)

    def run_round(self, rnd: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        participants = sample_clients(self.seed, rnd, len(self.sizes), self.cfg.train.fraction)
        self.status("training", rnd)
        updates = self.train_round(rnd, participants)
        self.status("aggregating", rnd)
        result = self.strategy.aggregate(rnd, self.global_params, updates)
        if not all_finite(result.params):
            raise SimulationError(f"the global model is not finite after round {rnd} ({self.strategy.name}); "
                                  "lower train.lr")
        self.global_params = list(result.params)
        diagnostics = dict(result.diagnostics)
        fedent_diag = diagnostics.pop("fedent", None)
        test_loss = test_acc = None
        if is_eval_round(rnd, self.rounds, self.cfg.train.eval_every):
            self.status("evaluating", rnd)
            if self.local_eval > 0:
                diagnostics.update(self.evaluate_local(rnd, updates))
            test_loss, test_acc = self.evaluate(self.global_params)
        now = time.perf_counter()
        rec = runlog.metrics_record(
            round=rnd, algorithm=self.strategy.name, test_acc=test_acc, test_loss=test_loss,
            train_loss=weighted_train_loss(updates), clients=participants, num_clients=len(participants),
            wall_s=now - t0, elapsed_s=now - self.t_start, fedent=fedent_diag, diagnostics=diagnostics)
        self.metrics.append(rec)
        self.records.append(rec)
        self.record_clients(rnd, updates)
        if isinstance(fedent_diag, dict):
            self.trajectory.append({"round": rnd, **{k: fedent_diag.get(k) for k in
                                                     ("phi2_pred", "phi2_actual", "entropy", "guards")}})
            self.write_estimator()
        return rec

    def run(self) -> SimResult:
        self.write_start_files()
        try:
            self.setup()
            last_acc: float | None = None
            for rnd in range(self.rounds):
                rec = self.run_round(rnd)
                if rec["test_acc"] is not None:
                    last_acc = rec["test_acc"]
                self.bar.update(rnd + 1, last_acc)
            torch.save([p.detach().cpu() for p in self.global_params], self.paths.model)
            self.status("done", self.rounds - 1, final_acc=last_acc)
        except KeyboardInterrupt:
            self.status("failed", None, error="interrupted")
            raise
        except Exception as e:
            self.status("failed", None, error=f"{type(e).__name__}: {e}")
            raise
        finally:
            self.bar.close()
        return SimResult(self.paths.root, self.strategy.name, self.seed, str(self.device),
                         [p.detach().cpu() for p in self.global_params], self.records,
                         time.perf_counter() - self.t_start)


def with_device(cfg: ExperimentConfig, device: str | None) -> ExperimentConfig:
    """The config with ``train.device`` replaced by an explicit --device, so config.yaml says what ran."""
    if device is None:
        return cfg
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=device))


def run_simulation(
    cfg: ExperimentConfig,
    run_dir: str | Path,
    device: str | None = None,
    progress: bool = True,
    *,
    inputs: SimInputs | None = None,
    strategy: Strategy | None = None,
    local_eval: int | None = None,
    plots: bool = True,
    label: str = "",
) -> SimResult:
    """Run ``cfg`` in this process and write a complete run directory at ``run_dir``.

    ``inputs`` (data, partition, model factory) defaults to the configured dataset; a comparison passes
    the same inputs to every algorithm. ``local_eval`` overrides ``train.local_eval``.
    """
    cfg = with_device(cfg, device)
    dev = resolve_device(cfg.train.device)
    if inputs is None:
        inputs = load_inputs(cfg)
    if inputs.num_clients != cfg.data.num_clients:
        raise SimulationError(f"the partition has {inputs.num_clients} clients but data.num_clients is "
                              f"{cfg.data.num_clients}")
    if strategy is None:
        strategy = build_strategy(cfg.algorithm)
    k = getattr(cfg.train, "local_eval", 0) if local_eval is None else local_eval
    if runlog.RunPaths(Path(run_dir)).metrics.exists():
        raise SimulationError(f"{run_dir} already holds a run (metrics.jsonl); choose another run directory")
    paths = runlog.create_run_dir(run_dir, exist_ok=True)
    result = _Run(cfg, paths, inputs, dev, strategy, int(k), progress, label).run()
    if plots:
        from fedent.plots import plot_run

        plot_run(paths.root)
    return result
