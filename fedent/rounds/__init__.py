"""The one round loop of FedEnt and its baselines, shared by the simulator and the cluster aggregator.

``RoundEngine`` runs sample → probe → payload → fit → accept → aggregate → evaluate → record; *where* the
client steps run is a ``ClientExecutor``: in this process over a ``ClientHost`` of every client
(``InProcessExecutor``, one by one or vectorised), or on remote workers, each of which runs a ``ClientHost``
of its own clients (``server.remote``). Nothing here knows about gRPC.
"""

from fedent.rounds.engine import RoundEngine, RoundPolicy, RunError, is_eval_round, weighted_train_loss
from fedent.rounds.executor import ClientExecutor, Gathered
from fedent.rounds.host import ClientHost, ClientStates, ClientTraining
from fedent.rounds.inprocess import InProcessExecutor, make_executor

__all__ = ["ClientExecutor", "ClientHost", "ClientStates", "ClientTraining", "Gathered", "InProcessExecutor",
           "RoundEngine", "RoundPolicy", "RunError", "is_eval_round", "make_executor", "weighted_train_loss"]
