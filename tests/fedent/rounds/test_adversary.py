"""Simulated attackers (fedent.rounds.adversary), ALIE above all: Baruch et al.'s z_max, the forged upload
w(t) + μ − z·σ of the coalition's honest deltas, and the host that holds a fit call's attackers back until the
coalition is complete (sequential and vectorised alike)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import pytest
import torch
from sim_support import tiny_inputs
from torch import Tensor

from fedent.config import AdversaryConfig
from fedent.rounds.adversary import Adversary, alie_z, attackers
from fedent.rounds.host import ClientHost, ClientTraining
from fedent.rounds.vectorised import VectorisedHost
from fedent.strategies.base import ClientUpdate, RoundPayload
from fedent.strategies.fedavg import FedAvg
from fedent.trainer import LocalTrainer


def test_alie_z_is_the_papers_z_max() -> None:
    # n = 50, m = 12: s = 26 - 12 = 14 supporters, Φ(z) < 36/50 -> z = 0.5828 (Baruch et al.'s own example setting)
    assert alie_z(50, 12) == pytest.approx(0.582842, abs=1e-6)
    # n = 100, m = 20: s = 31, Φ⁻¹(0.69) = 0.4959
    assert alie_z(100, 20) == pytest.approx(NormalDist().inv_cdf(0.69), abs=1e-12)
    assert alie_z(100, 20) == pytest.approx(0.495850, abs=1e-6)
    # odd n: s = floor(10.5 + 1) - 3 = 8, Φ⁻¹(13/21)
    assert alie_z(21, 3) == pytest.approx(NormalDist().inv_cdf(13 / 21), abs=1e-12)
    # one attacker in ten wins nobody over: (10 - 5)/10 = 1/2 -> 0; no attackers -> 0
    assert alie_z(10, 1) == 0.0 and alie_z(10, 0) == 0.0
    # an attacker majority keeps at least one supporter: Φ⁻¹(9/10)
    assert alie_z(10, 8) == pytest.approx(NormalDist().inv_cdf(0.9), abs=1e-12)
    assert alie_z(10, 3) < alie_z(10, 4) < alie_z(10, 5)  # more colluders, a bolder shift


def _update(cid: int, a: list[float], b: list[float]) -> ClientUpdate:
    return ClientUpdate(cid, [torch.tensor(a), torch.tensor(b)], 10 + cid, 0.5, scalars={"k": float(cid)})


def _alie(z: float | None = None, num_clients: int = 10, clients: Sequence[int] = (1, 4, 7)) -> Adversary:
    return Adversary(AdversaryConfig(attack="alie", z=z), frozenset(clients), 0, num_clients)


def test_collude_uploads_the_mean_minus_z_standard_deviations_of_the_honest_deltas() -> None:
    w = [torch.tensor([1.0, 1.0]), torch.tensor([0.0])]
    honest = [_update(7, [2.0, 1.0], [3.0]), _update(1, [1.0, 3.0], [0.0]), _update(4, [3.0, 2.0], [6.0])]
    forged = _alie(z=1.5).collude(honest, w)
    # deltas: first tensor (1, 0), (0, 2), (2, 1): mean (1, 1), sample std (1, 1); second 3, 0, 6: mean 3, std 3
    expect = [torch.tensor([1.0 + 1 - 1.5, 1.0 + 1 - 1.5]), torch.tensor([3.0 - 1.5 * 3.0])]
    assert [u.cid for u in forged] == [7, 1, 4]  # the callers' order
    for u in forged:
        assert all(torch.allclose(p, e, atol=1e-6) for p, e in zip(u.params, expect, strict=True))
    # each keeps its own count and scalars
    assert [(u.num_samples, u.scalars["k"]) for u in forged] == [(17, 7.0), (11, 1.0), (14, 4.0)]
    assert honest[0].params[0].tolist() == [2.0, 1.0]  # the honest updates are untouched


def test_collude_defaults_to_z_max_of_the_federation_and_a_coalition_of_one_uploads_its_honest_update() -> None:
    w = [torch.zeros(2)]
    honest = [ClientUpdate(0, [torch.tensor([1.0, 0.0])], 5, 0.1), ClientUpdate(3, [torch.tensor([3.0, 4.0])], 5, 0.1)]
    adv = _alie(num_clients=10, clients=(0, 3, 5, 8))  # m = 4 of n = 10: s = 2, z = Φ⁻¹(0.8)
    z = NormalDist().inv_cdf(0.8)
    assert adv.z == pytest.approx(z, abs=1e-12) and z > 0.8
    got = adv.collude(honest, w)[0].params[0]
    sigma = torch.tensor([math.sqrt(2.0), math.sqrt(8.0)])
    assert torch.allclose(got, torch.tensor([2.0, 2.0]) - z * sigma, atol=1e-6)
    alone = adv.collude([honest[1]], w)[0].params[0]
    assert torch.equal(alone, torch.tensor([3.0, 4.0]))
    assert adv.collude([], w) == []


def test_from_config_draws_the_attackers_from_the_seed_and_tamper_leaves_alie_to_the_coalition() -> None:
    adv = Adversary.from_config(AdversaryConfig(attack="alie", fraction=0.3), 5, 10)
    assert adv is not None and sorted(adv.clients) == attackers(5, 10, 0.3) and len(adv.clients) == 3
    assert adv.num_clients == 10 and adv.colludes
    assert adv.z == pytest.approx(alie_z(10, 3))
    u = _update(next(iter(adv.clients)), [5.0, 5.0], [5.0])
    assert adv.tamper(0, u, [torch.zeros(2), torch.zeros(1)]) is u
    assert not Adversary(AdversaryConfig(attack="scale"), frozenset({1}), 0, 10).colludes


def _trainer() -> tuple[LocalTrainer, list[Tensor]]:
    inputs = tiny_inputs(num_clients=6, per_client=20)
    tr = LocalTrainer(inputs.make_model(), inputs.data.x_train, inputs.data.y_train, 8, torch.device("cpu"))
    return tr, [torch.as_tensor(ix) for ix in inputs.client_indices]


@pytest.mark.parametrize("host_cls", [ClientHost, VectorisedHost])
def test_a_host_forges_its_attackers_uploads_from_their_honest_fits(host_cls: type[ClientHost]) -> None:
    """Clients 1, 3 and 4 of six attack with z = 2: the host's uploads of them are μ − 2σ of the honest fits it
    made (the honest host's results), uploaded after the call's last fit; client 2 is untouched."""
    tr, ix = _trainer()
    w0 = [p.detach().clone() for p in tr.params]
    base = ClientTraining(lr=0.05, epochs=1, seed=3, batch_size=8)
    honest = host_cls(tr, ix, base).fit(0, [1, 2, 3, 4], w0, FedAvg(), RoundPayload(0))
    adv = Adversary(AdversaryConfig(attack="alie", z=2.0), frozenset({1, 3, 4}), 3, 6)
    seen: list[int] = []
    host = host_cls(tr, ix, ClientTraining(lr=0.05, epochs=1, seed=3, batch_size=8, adversary=adv),
                    on_update=lambda u: seen.append(u.cid))
    got = host.fit(0, [1, 2, 3, 4], w0, FedAvg(), RoundPayload(0))
    assert sorted(got.results) == [1, 2, 3, 4] and not got.failed and seen == [2, 1, 3, 4]
    assert all(torch.equal(a, b) for a, b in zip(got.results[2].params, honest.results[2].params, strict=True))
    for j, w in enumerate(w0):
        deltas = torch.stack([honest.results[c].params[j] - w for c in (1, 3, 4)])
        expect = w + deltas.mean(0) - 2.0 * deltas.std(0)
        for c in (1, 3, 4):
            assert torch.allclose(got.results[c].params[j], expect, rtol=1e-5, atol=1e-7)
    assert float((got.results[1].params[0] - honest.results[1].params[0]).abs().max()) > 1e-3
    assert host.coalition == []
