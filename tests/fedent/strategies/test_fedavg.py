"""FedAvg: sample-weighted averaging by hand, deterministic local training, no aliasing of inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedent.params import clone
from fedent.strategies.base import ClientState, ClientTask, ClientUpdate, RoundPayload, StrategyError
from fedent.strategies.fedavg import FedAvg
from fedent.trainer import LocalTrainer


def _trainer(n: int = 24, seed: int = 0) -> LocalTrainer:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 2, 2, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    return LocalTrainer(model, x, y, batch_size=5, device=torch.device("cpu"))


def _update(cid: int, values: list[float], n: int) -> ClientUpdate:
    return ClientUpdate(cid, [torch.tensor(values)], n, 0.0)


def test_aggregate_is_sample_weighted_mean() -> None:
    ups = [_update(0, [1.0, 2.0], 1), _update(1, [3.0, -2.0], 3)]
    out = FedAvg().aggregate(0, [torch.zeros(2)], ups).params
    # θ = (1/4, 3/4): 0.25*[1,2] + 0.75*[3,-2] = [2.5, -1.0]
    assert torch.allclose(out[0], torch.tensor([2.5, -1.0]))


def test_aggregate_rejects_empty_and_sampleless_updates() -> None:
    with pytest.raises(StrategyError):
        FedAvg().aggregate(0, [torch.zeros(2)], [])
    with pytest.raises(StrategyError):
        FedAvg().aggregate(0, [torch.zeros(2)], [_update(0, [1.0, 1.0], 0)])


def test_fit_is_deterministic_and_leaves_global_untouched() -> None:
    trainer = _trainer()
    w0 = clone(trainer.params)
    task = ClientTask(cid=1, round=0, indices=torch.arange(12), lr=0.1, epochs=2, seed=7)
    a = FedAvg().fit(trainer, w0, RoundPayload(0), task, ClientState())
    b = FedAvg().fit(trainer, w0, RoundPayload(0), task, ClientState())
    assert all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.params, w0, strict=True))  # it trained
    fresh = _trainer()
    assert all(torch.equal(p, q) for p, q in zip(w0, fresh.params, strict=True))  # w0 not mutated
    assert a.num_samples == 12 and a.cid == 1
    # the upload is a copy: further training of the shared model object must not change it
    snapshot = clone(a.params)
    FedAvg().fit(
        trainer, w0, RoundPayload(0), ClientTask(2, 0, torch.arange(12, 24), 0.1, 1, 7), ClientState()
    )
    assert all(torch.equal(p, q) for p, q in zip(a.params, snapshot, strict=True))


def test_fit_batch_order_depends_on_client_and_round() -> None:
    trainer = _trainer()
    w0 = clone(trainer.params)
    idx = torch.arange(20)
    a = FedAvg().fit(trainer, w0, RoundPayload(0), ClientTask(0, 0, idx, 0.1, 1, 7), ClientState())
    b = FedAvg().fit(trainer, w0, RoundPayload(0), ClientTask(0, 1, idx, 0.1, 1, 7), ClientState())
    assert not all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))
