"""Evaluation of the global model (every ``eval_every`` rounds) and of a seeded sample of local models.

Two worlds (``train.evaluation``): ``server`` evaluates on a held-out set where the round loop runs;
``federated`` asks every client to evaluate the global model on its local test split (the executor gathers
``ClientEval``s) and reports the sample-weighted mean. Each eval round's metrics line says which, with how
many samples and clients, under ``diagnostics.evaluation``.

A validation set (``data.validation_fraction``, fedent.data.validation) is scored server-side on every eval
round besides, into the line's ``val_acc``/``val_loss``; with ``train.evaluate_test: false`` (tuning runs) the
test set is never evaluated at all: not the global model, not the local models, not federated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from fedent.rng import numpy_rng
from fedent.rounds.robust import capped_shares, eval_problem
from fedent.strategies.base import ClientUpdate
from fedent.trainer import LocalTrainer

if TYPE_CHECKING:
    from fedent.config import RobustConfig
    from fedent.rounds.executor import Gathered


@dataclass(frozen=True)
class ClientEval:
    """One client's evaluation of the global model on its local test split."""

    cid: int
    num_samples: int
    loss: float
    accuracy: float


# (round, global params) -> each client's evaluation (the executor runs it where the clients are)
FederatedEval = Callable[[int, Sequence[Tensor]], "Gathered[ClientEval]"]


def test_shards(n: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """A test set of ``n`` samples cut IID among the clients (sorted indices; seeded by (seed, "test-split")):
    each client's local test split when the data is central, the same in the simulator and on every worker."""
    perm = numpy_rng(seed, "test-split").permutation(n)
    return [np.sort(part).astype(np.int64) for part in np.array_split(perm, num_clients)]


def weighted_mean(results: Sequence[ClientEval], cap: float | None = None) -> tuple[float | None, float | None, int]:
    """(loss, accuracy, samples): the sample-weighted means over the clients that had test samples, no client's
    share above ``cap`` (fedent.rounds.robust.capped_shares; None: plain sample weights)."""
    n = sum(r.num_samples for r in results)
    if n <= 0:
        return None, None, 0
    if cap is not None:
        shares = capped_shares([r.num_samples for r in results], cap)
        if any(s * n != r.num_samples for s, r in zip(shares, results, strict=True)):
            return (sum(r.loss * s for r, s in zip(results, shares, strict=True)),
                    sum(r.accuracy * s for r, s in zip(results, shares, strict=True)), n)
    return (sum(r.loss * r.num_samples for r in results) / n,
            sum(r.accuracy * r.num_samples for r in results) / n, n)


class Evaluator:
    """The test set on the device once and a trainer to load models into (the simulator shares its own)."""

    def __init__(self, trainer: LocalTrainer, x_test: Tensor, y_test: Tensor, batch_size: int, seed: int,
                 local_models: int = 0, federated: FederatedEval | None = None, *,
                 validation: tuple[Tensor, Tensor] | None = None, test: bool = True) -> None:
        self.trainer = trainer
        self.federated = federated
        self.test = test
        self.mode = ("server" if federated is None else "federated") if test else "sealed"
        self.validation = None if validation is None else (validation[0].to(trainer.device),
                                                           validation[1].to(trainer.device))
        self.x_test = x_test.to(trainer.device)
        self.y_test = y_test.to(trainer.device)
        self.batch_size = batch_size
        self.seed = seed
        self.local_models = local_models
        self.bounds: RobustConfig | None = None  # set by the engine: range checks and the weight cap
    def evaluate(self, params: Sequence[Tensor]) -> tuple[float, float]:
        """(test loss, test accuracy) of ``params``."""
        self.trainer.load(params)
        return self.trainer.evaluate(self.x_test, self.y_test, self.batch_size)

    def evaluate_round(self, rnd: int, params: Sequence[Tensor]) -> tuple[float | None, float | None, dict[str, Any]]:
        """(loss, accuracy, diagnostics) of the global model for the round's metrics line, in this
        evaluator's mode; server mode without a held-out set measures nothing (None, None). With a validation
        set the diagnostics hold ``validation`` (loss, acc, samples); the engine moves it to val_loss/val_acc."""
        loss, acc, diag = self._test_round(rnd, params)
        if self.validation is not None and int(self.validation[1].shape[0]) > 0:
            self.trainer.load(params)
            v_loss, v_acc = self.trainer.evaluate(self.validation[0], self.validation[1], self.batch_size)
            diag["validation"] = {"loss": float(v_loss), "acc": float(v_acc),
                                  "samples": int(self.validation[1].shape[0])}
        return loss, acc, diag

    def _test_round(self, rnd: int, params: Sequence[Tensor]) -> tuple[float | None, float | None, dict[str, Any]]:
        if not self.test:
            return None, None, {"evaluation": {"mode": "sealed", "samples": 0}}
        if self.federated is None:
            n = int(self.y_test.shape[0])
            if n == 0:
                return None, None, {"evaluation": {"mode": "server", "samples": 0}}
            loss, acc = self.evaluate(params)
            return loss, acc, {"evaluation": {"mode": "server", "samples": n}}
        got = self.federated(rnd, params)
        b = self.bounds
        rejected = {c: why for c, r in got.results.items()
                    if (why := eval_problem(c, r, b.max_client_samples if b else None)) is not None}
        results = [r for c, r in got.results.items() if r.num_samples > 0 and c not in rejected]
        loss_, acc_, n = weighted_mean(results, b.max_weight_share if b else None)
        info: dict[str, Any] = {"mode": "federated", "samples": n, "clients": len(results)}
        if got.failed:
            info["failed"] = {str(c): why for c, why in sorted(got.failed.items())}
        if rejected:
            info["rejected"] = {str(c): why for c, why in sorted(rejected.items())}
        return loss_, acc_, {"evaluation": info}

    def evaluate_local(self, rnd: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """The deviation analysis (paper Fig. client_dev): a seeded sample of uploaded local models on the test set."""
        k = min(self.local_models, len(updates)) if int(self.y_test.shape[0]) and self.test else 0
        if k <= 0:
            return {}
        pick = sorted(int(i) for i in numpy_rng(self.seed, "eval", rnd).choice(len(updates), size=k, replace=False))
        accs = [self.evaluate(updates[i].params)[1] for i in pick]
        return {"local_acc": accs, "local_clients": [updates[i].cid for i in pick]}


def evaluate_shards(trainer: LocalTrainer, x: Tensor, y: Tensor, shards: dict[int, np.ndarray], cids: Sequence[int],
                    params: Sequence[Tensor], batch_size: int) -> dict[int, ClientEval]:
    """Each client's evaluation of ``params`` on its test shard (index arrays into ``x``/``y``); a client
    without test samples answers 0 samples and counts for nothing in the mean."""
    import torch

    trainer.load(params)
    out: dict[int, ClientEval] = {}
    for c in cids:
        ix = shards.get(c)
        if ix is None or len(ix) == 0:
            out[c] = ClientEval(c, 0, 0.0, 0.0)
            continue
        sel = torch.from_numpy(np.asarray(ix, dtype=np.int64)).to(x.device)
        loss, acc = trainer.evaluate(x[sel], y[sel], batch_size)
        out[c] = ClientEval(c, len(ix), float(loss), float(acc))
    return out


def central_federated(trainer: LocalTrainer, x_test: Tensor, y_test: Tensor, num_clients: int, seed: int,
                      batch_size: int) -> FederatedEval:
    """Federated evaluation in process: the test set cut into each client's local split (``test_shards``)."""
    from fedent.rounds.executor import Gathered

    shards = dict(enumerate(test_shards(int(y_test.shape[0]), num_clients, seed)))
    x, y = x_test.to(trainer.device), y_test.to(trainer.device)

    def run(rnd: int, params: Sequence[Tensor]) -> Gathered[ClientEval]:
        return Gathered(evaluate_shards(trainer, x, y, shards, range(num_clients), params, batch_size))

    return run
