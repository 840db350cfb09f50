"""One federated run on remote workers: the core's round engine over the registry and the remote executor.

``ClusterRun`` builds the three and runs the rounds (in a thread): ``registry`` (server.registry: register,
ready, heartbeats, identity, the one ownership check), ``remote`` (server.remote: the ``ClientExecutor`` that
dispatches tasks and gathers answers) and ``engine`` (fedent.rounds.RoundEngine, the same loop the simulator
runs, which alone decides what it accepts). The servicer talks to ``registry`` and ``remote``; the run is
stopped through ``stop``. Domain errors carry their kind (``ClusterError.code``) for the servicer to map to
gRPC status codes. No gRPC here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fedent import runlog
from fedent.config import ExperimentConfig
from fedent.inputs import RunInputs
from fedent.rounds import RoundEngine, RoundPolicy
from fedent.rounds.evaluation import Evaluator
from fedent.signals import stop_reason
from fedent.strategies.base import Strategy
from fedent.trainer import LocalTrainer
from server.registry import WorkerRegistry
from server.remote import OfflineRunner, RemoteExecutor
from server.settings import AggregatorSettings


class ClusterRun:
    """The registry, the remote executor and the round engine of one run."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        settings: AggregatorSettings,
        paths: runlog.RunPaths,
        inputs: RunInputs,
        strategy: Strategy,
        device: torch.device,
        worker_config: Mapping[str, Any],
        on_phase: Callable[[str], None] | None = None,
        offline: OfflineRunner | None = None,
        rebuild_strategy: Callable[[Any], Strategy] | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        run_key: str = "",
    ) -> None:
        self.cfg, self.settings, self.paths = cfg, settings, paths
        sizes = inputs.client_sizes()
        data = inputs.data  # the aggregator holds the test set only; training data lives with the workers
        trainer = LocalTrainer(inputs.make_model(), data.x_test[:0], data.y_test[:0], cfg.train.batch_size, device,
                               cfg.train.precision)
        local_data = cfg.data.placement == "workers"  # sizes are what the workers report at Ready
        self.registry = WorkerRegistry(settings, sizes, str(inputs.partition_info.get("md5", "")), local_data,
                                       int(inputs.partition_info.get("num_classes") or 0), cfg.train.seed,
                                       run_key or paths.run_id, worker_config)
        self.remote = RemoteExecutor(self.registry, settings, offline, rebuild_strategy)
        federated = (self.remote.evaluate_clients if cfg.train.evaluation == "federated" and cfg.train.evaluate_test
                     else None)
        # train.evaluate_test false seals the test set here too; the validation split is scored in the simulator
        evaluator = Evaluator(trainer, data.x_test, data.y_test, cfg.train.eval_batch_size, cfg.train.seed,
                              int(getattr(cfg.train, "local_eval", 0) or 0), federated, test=cfg.train.evaluate_test)
        policy = RoundPolicy(settings.quorum, settings.round_retries, settings.checkpoint_keep)
        self.engine = RoundEngine(cfg, paths, strategy, self.remote, evaluator, trainer.params, sizes,
                                  dict(inputs.partition_info), policy, on_phase=on_phase, on_round=on_round)
        self.registry.on_waiting = lambda hosted, total: self.engine.status("starting", None, clients_hosted=hosted,
                                                                            clients=total)
        self.registry.done = lambda: self.engine.phase == "done"
        self.stopped: str | None = None  # "stopped by SIGTERM" when stop(signame) ended the run

    @property
    def finished(self) -> threading.Event:
        """Set when the run is over, whatever the outcome (``error`` says why it failed)."""
        return self.registry.finished

    @property
    def error(self) -> str | None:
        return self.registry.error

    def run(self) -> None:
        """The whole run; sets ``finished`` at the end whatever happens (``error`` says why it failed)."""
        error = None
        try:
            self.engine.run()
        except KeyboardInterrupt as e:  # stop(signame): the engine wrote status.json "stopped" with the reason
            self.stopped = stop_reason(e)
            error = self.stopped
        except Exception as e:  # the engine wrote status.json "failed" and released the workers
            error = f"{type(e).__name__}: {e}"
        finally:
            self.registry.close(error)

    def stop(self, signame: str | None = None) -> None:
        """End the run now: the round loop wakes from any wait (a phase, the workers, a retry) and fails, or,
        with ``signame`` (the aggregator got SIGTERM / SIGINT), ends ``stopped`` with that reason."""
        if signame is not None:
            self.engine.stop_signal = signame
        self.engine.stop.set()
        self.remote.wake()
        with self.registry.changed:
            self.registry.changed.notify_all()
