"""The accountant: ε(δ) equals dp-accounting's own RdpAccountant on the event the run really performs."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

from fedent.privacy import accountant


def _rdp_epsilon(event: dp_event.DpEvent, relation: dp_accounting.NeighboringRelation, delta: float) -> float:
    acc = RdpAccountant(neighboring_relation=relation)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("rounds", [1, 7])
def test_central_epsilon_is_dp_accountings_for_sampling_without_replacement(rounds: int) -> None:
    rep = accountant.central_report(num_clients=50, sample_size=10, noise_multiplier=1.3, released=rounds, delta=1e-5)
    # independent: 10 of 50 without replacement, the sum's replace-one sensitivity 2C against noise 1.3·C
    want = _rdp_epsilon(dp_event.SelfComposedDpEvent(
        dp_event.SampledWithoutReplacementDpEvent(50, 10, dp_event.GaussianDpEvent(0.65)), rounds),
        dp_accounting.NeighboringRelation.REPLACE_ONE, 1e-5)
    assert rep["epsilon"] == pytest.approx(want, rel=1e-12)
    assert rep["delta"] == 1e-5 and rep["accountant"] == "rdp" and rep["relation"] == "replace_one"
    assert rep["event"] == {"type": "SelfComposedDpEvent", "count": rounds, "event": {
        "type": "SampledWithoutReplacementDpEvent", "source_dataset_size": 50, "sample_size": 10,
        "event": {"type": "GaussianDpEvent", "noise_multiplier": 0.65}}}


def test_central_epsilon_grows_with_rounds_and_shrinks_with_noise() -> None:
    eps = [accountant.central_report(50, 10, z, k, 1e-5)["epsilon"] for z, k in ((1.0, 1), (1.0, 5), (3.0, 5))]
    assert eps[0] < eps[1] and eps[2] < eps[1]
    assert accountant.central_report(50, 10, 1.0, 0, 1e-5)["epsilon"] == 0.0


def test_everyone_every_round_is_a_plain_gaussian_and_no_noise_no_guarantee() -> None:
    rep = accountant.central_report(10, 10, 2.0, 3, 1e-5)
    assert rep["event"]["event"] == {"type": "GaussianDpEvent", "noise_multiplier": 1.0}
    want = _rdp_epsilon(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.0), 3),
                        dp_accounting.NeighboringRelation.REPLACE_ONE, 1e-5)
    assert rep["epsilon"] == pytest.approx(want, rel=1e-12)
    assert math.isinf(accountant.central_report(10, 5, 0.0, 3, 1e-5)["epsilon"])


def test_local_epsilon_is_the_worst_clients_dp_sgd_steps() -> None:
    sizes = [100, 40, 100, 64]
    joined = {0: 3, 1: 2, 2: 1}  # client 3 never trained
    rep = accountant.local_report(sizes, joined, batch_size=16, epochs=2, noise_multiplier=1.1, delta=1e-5)

    def eps(n: int, rounds: int) -> float:
        steps = rounds * 2 * math.ceil(n / 16)
        return _rdp_epsilon(dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(16 / n, dp_event.GaussianDpEvent(1.1)), steps),
            dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, 1e-5)

    each = {c: eps(sizes[c], r) for c, r in joined.items()}
    worst = max(each, key=lambda c: each[c])
    assert rep["client"] == worst
    assert rep["epsilon"] == pytest.approx(each[worst], rel=1e-12)
    assert rep["event"]["count"] == joined[worst] * 2 * math.ceil(sizes[worst] / 16)


def test_steps_per_round_match_the_batch_plan() -> None:
    assert accountant.steps_per_round(40, 16, 3) == 9 and accountant.steps_per_round(32, 16, 1) == 2
    assert accountant.local_step_event(10, 16, 1.0) == dp_event.GaussianDpEvent(1.0)  # one batch holds them all
