"""The evaluator's validation set and sealed test set (issue 29): what each mode evaluates."""

from __future__ import annotations

import torch
from torch import nn

from fedent.params import clone
from fedent.rounds.evaluation import Evaluator
from fedent.trainer import LocalTrainer


def _evaluator(test: bool, local_models: int = 2) -> tuple[Evaluator, list[torch.Tensor], list[int]]:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 4, generator=gen), torch.randint(0, 3, (60,), generator=gen)
    torch.manual_seed(0)
    trainer = LocalTrainer(nn.Linear(4, 3), x[:40], y[:40], batch_size=8, device=torch.device("cpu"))
    seen: list[int] = []
    real = trainer.evaluate

    def spy(xs: torch.Tensor, ys: torch.Tensor, batch_size: int) -> tuple[float, float]:
        seen.append(int(ys.shape[0]))
        return real(xs, ys, batch_size)

    trainer.evaluate = spy  # type: ignore[method-assign]
    ev = Evaluator(trainer, x[40:], y[40:], 100, 0, local_models, validation=(x[:7], y[:7]), test=test)
    return ev, clone(trainer.params), seen


def test_validation_is_scored_beside_the_test_set() -> None:
    ev, w, seen = _evaluator(test=True)
    loss, acc, diag = ev.evaluate_round(0, w)
    assert seen == [20, 7] and loss is not None and acc is not None and ev.mode == "server"
    val = diag["validation"]
    assert val["samples"] == 7 and 0.0 <= val["acc"] <= 1.0 and val["loss"] > 0
    assert diag["evaluation"] == {"mode": "server", "samples": 20}


def test_a_sealed_test_set_is_never_evaluated() -> None:
    from fedent.strategies.base import ClientUpdate

    ev, w, seen = _evaluator(test=False)
    loss, acc, diag = ev.evaluate_round(0, w)
    assert (loss, acc) == (None, None) and seen == [7] and ev.mode == "sealed"
    assert diag["evaluation"] == {"mode": "sealed", "samples": 0} and diag["validation"]["samples"] == 7
    updates = [ClientUpdate(cid=c, num_samples=5, params=w, train_loss=1.0) for c in range(3)]
    assert ev.evaluate_local(0, updates) == {} and seen == [7]  # no local model on the test set either
    open_ev, _, open_seen = _evaluator(test=True)
    assert set(open_ev.evaluate_local(0, updates)) == {"local_acc", "local_clients"} and open_seen == [20, 20]
