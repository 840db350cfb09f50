"""The one round loop of FedEnt and its baselines, shared by the simulator and the cluster aggregator.

``RoundEngine`` runs sample → probe → payload → fit → aggregate → evaluate → record; *where* the client
steps run is a ``ClientExecutor``: in this process one after another (``SequentialExecutor``), or on
remote workers (``server.engine.ClusterRun``). Nothing here knows about gRPC.
"""

from fedent.rounds.engine import RoundEngine, RoundPolicy, RunError, is_eval_round, weighted_train_loss
from fedent.rounds.executor import ClientExecutor, Gathered
from fedent.rounds.sequential import SequentialExecutor

__all__ = ["ClientExecutor", "Gathered", "RoundEngine", "RoundPolicy", "RunError", "SequentialExecutor",
           "is_eval_round", "weighted_train_loss"]
