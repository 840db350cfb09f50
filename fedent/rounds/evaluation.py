"""Evaluation of the global model (every ``eval_every`` rounds) and of a seeded sample of local models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from fedent.rng import numpy_rng
from fedent.strategies.base import ClientUpdate
from fedent.trainer import LocalTrainer


class Evaluator:
    """The test set on the device once and a trainer to load models into (the simulator shares its own)."""

    def __init__(self, trainer: LocalTrainer, x_test: Tensor, y_test: Tensor, batch_size: int, seed: int,
                 local_models: int = 0) -> None:
        self.trainer = trainer
        self.x_test = x_test.to(trainer.device)
        self.y_test = y_test.to(trainer.device)
        self.batch_size = batch_size
        self.seed = seed
        self.local_models = local_models

    def evaluate(self, params: Sequence[Tensor]) -> tuple[float, float]:
        """(test loss, test accuracy) of ``params``."""
        self.trainer.load(params)
        return self.trainer.evaluate(self.x_test, self.y_test, self.batch_size)

    def evaluate_local(self, rnd: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """The deviation analysis (paper Fig. client_dev): a seeded sample of uploaded local models on the test set."""
        k = min(self.local_models, len(updates))
        if k <= 0:
            return {}
        pick = sorted(int(i) for i in numpy_rng(self.seed, "eval", rnd).choice(len(updates), size=k, replace=False))
        accs = [self.evaluate(updates[i].params)[1] for i in pick]
        return {"local_acc": accs, "local_clients": [updates[i].cid for i in pick]}
