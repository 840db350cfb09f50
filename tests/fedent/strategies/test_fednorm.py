"""FedNorm: the rate minimises (1−β)η² + β‖Δ − ηg‖² with Δ the last global step; decay; checkpoint state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedent.config import AlgorithmConfig, ConfigError
from fedent.params import clone, dot, norm_sq, sub
from fedent.rng import torch_generator
from fedent.strategies.base import ClientState, ClientTask
from fedent.strategies.fednorm import DELTA_KEY, FedNorm, FedNormOptions
from fedent.strategies.registry import build_strategy
from fedent.trainer import LocalTrainer

LR, SEED = 0.1, 3


def _setup() -> tuple[LocalTrainer, list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(60, 5, generator=gen)
    y = torch.randint(0, 3, (60,), generator=gen)
    torch.manual_seed(1)
    trainer = LocalTrainer(nn.Linear(5, 3), x, y, batch_size=10, device=torch.device("cpu"))
    return trainer, [torch.arange(0, 20), torch.arange(20, 60)], clone(trainer.params)


def _round(strategy: FedNorm, trainer: LocalTrainer, indices, w, rnd, states):  # type: ignore[no-untyped-def]
    payload = strategy.round_payload(rnd, w, [])
    tasks = [ClientTask(c, rnd, indices[c], LR, 1, SEED) for c in range(2)]
    updates = [strategy.fit(trainer, w, payload, t, states[t.cid]) for t in tasks]
    return payload, updates, strategy.aggregate(rnd, w, updates)


def test_rate_minimises_per_step_objective_with_last_global_step() -> None:
    trainer, indices, w0 = _setup()
    beta, gamma = 0.9, 0.5
    strategy = FedNorm(FedNormOptions(beta=beta, gamma=gamma))
    states = [ClientState(), ClientState()]
    payload, updates, agg = _round(strategy, trainer, indices, w0, 0, states)
    assert all(norm_sq(d) == 0 for d in [payload.tensors[DELTA_KEY]])  # Δ = 0 in round 0
    assert [u.scalars["eta"] for u in updates] == [gamma * LR] * 2
    w1 = agg.params
    payload, updates, agg = _round(strategy, trainer, indices, w1, 1, states)
    delta = payload.tensors[DELTA_KEY]
    for a, b in zip(delta, sub(w0, w1), strict=True):
        torch.testing.assert_close(a, b)
    positive = 0
    for cid, u in enumerate(updates):
        trainer.load(w1)
        g = trainer.gradient(indices[cid], torch_generator(SEED, "probe", 1, cid))
        eta = u.scalars["eta_star"]
        positive += eta > 0
        grid = np.linspace(0.0, 3 * max(eta, 1e-3), 601)

        def cost(e: float, g=g) -> float:  # (1−β)η² + β‖Δ − ηg‖², with the vectors themselves
            return (1 - beta) * e * e + beta * norm_sq([d - e * gi for d, gi in zip(delta, g, strict=True)])

        best = min(cost(float(e)) for e in grid)
        assert cost(eta) <= best + 1e-9 * max(1.0, best)
        assert u.scalars["g_dot_delta"] == pytest.approx(dot(g, delta), rel=1e-9)
        assert u.scalars["eta"] == pytest.approx(gamma * gamma * LR + (1 - gamma) * eta, rel=1e-12)
        assert states[cid].scalars["eta"] == u.scalars["eta"]
    assert positive > 0, "degenerate test: every rate was 0"


def test_server_state_roundtrip_keeps_delta() -> None:
    trainer, indices, w0 = _setup()
    strategy = FedNorm()
    states = [ClientState(), ClientState()]
    _, _, agg = _round(strategy, trainer, indices, w0, 0, states)
    restored = FedNorm()
    restored.load_server_state(strategy.server_state())
    a = restored.round_payload(1, agg.params, []).tensors[DELTA_KEY]
    b = strategy.round_payload(1, agg.params, []).tensors[DELTA_KEY]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y)
    assert norm_sq(a) > 0


def test_options_validated() -> None:
    assert isinstance(build_strategy(AlgorithmConfig("fednorm", {"beta": 0.5})), FedNorm)
    for bad in ({"beta": 0.0}, {"gamma": -0.1}, {"probe_batch_size": 0}, {"variant": "exact"}):
        with pytest.raises(ConfigError):
            build_strategy(AlgorithmConfig("fednorm", bad))
