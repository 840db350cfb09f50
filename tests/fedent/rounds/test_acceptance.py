"""The engine's one acceptance rule (fedent.rounds.acceptance) on hand-made uploads: a client's own, in the run,
with its sample count, finite and exactly what the strategy declares; the reason names what was wrong."""

from __future__ import annotations

import torch

from fedent.rounds.acceptance import REJECTED, Acceptance, diverged
from fedent.rounds.executor import Gathered
from fedent.strategies.base import ClientUpdate, Probe
from fedent.strategies.fedavg import FedAvg
from fedent.strategies.fedent import FedEnt

MODEL = [torch.zeros(3, 2), torch.zeros(2)]
SIZES = [10, 20, 30]


def rule(strategy: object = None) -> Acceptance:
    s = strategy or FedAvg()
    return Acceptance(lambda: s, lambda: MODEL, lambda: SIZES)  # type: ignore[arg-type,return-value]


def update(cid: int, samples: int, fill: float = 0.5) -> ClientUpdate:
    return ClientUpdate(cid, [torch.full_like(p, fill) for p in MODEL], samples, 0.1)


def test_a_clients_own_finite_declared_update_is_accepted() -> None:
    assert rule().update_problem(1, update(1, 20)) is None


def test_each_violation_is_rejected_with_its_reason() -> None:
    r = rule()
    assert r.update_problem(0, update(1, 20)) == f"{REJECTED}update of client 1 gathered for client 0"
    assert r.update_problem(1, update(1, 21)) == f"{REJECTED}update of client 1 claims 21 samples, expected 20"
    assert r.update_problem(2, update(2, 30, float("nan"))) == f"{REJECTED}update of client 2 is not finite (NaN/inf)"
    assert r.update_problem(7, update(7, 30)) == f"{REJECTED}client 7 is not one of this run's 3 clients"
    assert r.update_problem(-1, update(-1, 30)) == f"{REJECTED}client -1 is not one of this run's 3 clients"
    extra = update(0, 10)
    extra.scalars["eta"] = 0.1
    assert r.update_problem(0, extra) == f"{REJECTED}update of client 0 has unknown scalars ['eta']"


def test_probes_are_held_to_the_same_rule() -> None:
    r = rule(FedEnt())
    good = Probe(2, 30, {"a": -0.1, "b": 0.2, "eta_prev": 0.01})
    assert r.probe_problem(2, good) is None
    assert r.probe_problem(1, good) == f"{REJECTED}probe of client 2 gathered for client 1"
    assert r.probe_problem(2, Probe(2, 31, dict(good.scalars))) == \
        f"{REJECTED}probe of client 2 claims 31 samples, expected 30"
    assert r.probe_problem(5, Probe(5, 30, dict(good.scalars))) == \
        f"{REJECTED}client 5 is not one of this run's 3 clients"
    assert "lacks scalars ['a']" in str(r.probe_problem(2, Probe(2, 30, {"b": 0.2, "eta_prev": 0.01})))


def test_screen_moves_rejections_to_failed_and_keeps_earlier_failures() -> None:
    got = rule().updates(Gathered({0: update(0, 10), 1: update(1, 20, float("inf"))}, {2: "deadline"}))
    assert list(got.results) == [0]
    assert got.failed == {1: f"{REJECTED}update of client 1 is not finite (NaN/inf)", 2: "deadline"}
    assert diverged(got.failed) == [1]
    assert diverged({3: f"{REJECTED}update of client 3 has a non-finite train_loss (nan)", 4: "not finite"}) == [3]


def test_an_absurd_probe_scalar_rejects_its_client() -> None:
    """A finite FedEnt probe far outside its declared range (eta_prev = -1e300) is that client's rejection."""
    r = rule(FedEnt())
    why = r.probe_problem(2, Probe(2, 30, {"a": -0.1, "b": 0.2, "eta_prev": -1e300}))
    assert why == f"{REJECTED}probe of client 2: scalar eta_prev=-1e+300 is outside its range [0, 1e+06]"


def test_the_first_and_last_clients_are_in_the_run_and_the_one_after_is_not() -> None:
    r = rule()
    assert r.update_problem(0, update(0, 10)) is None
    assert r.update_problem(2, update(2, 30)) is None
    assert r.update_problem(3, update(3, 30)) == f"{REJECTED}client 3 is not one of this run's 3 clients"
    assert r.probe_problem(3, Probe(3, 30, {"a": -0.1, "b": 0.2, "eta_prev": 0.01})) == \
        f"{REJECTED}client 3 is not one of this run's 3 clients"


def test_diverged_counts_only_rejections_for_nan_or_inf() -> None:
    failed = {
        0: f"{REJECTED}update of client 0 is not finite (NaN/inf)",
        1: f"{REJECTED}update of client 1 claims 21 samples, expected 20",  # rejected, but not for NaN/inf
        2: "deadline",
        3: f"{REJECTED}probe of client 3 has non-finite scalars ['a']",
        5: "worker crashed: not finite",  # a failure, not a rejection
    }
    assert diverged(failed) == [0, 3]
    assert diverged({}) == []
