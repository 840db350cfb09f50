"""Reduced rounds (``DistributedExecutor.fit_sum``) against the gathered path, in one process: the weighted sum
with the weight cap and the acceptance rule applied as the engine applies them, uniform weights and tensor groups,
FedEnt's record from the sum, and which runs ``sum_blocker`` keeps on the gathered path."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sim_support import tiny_config, write_tiny_config_file
from torch import Tensor

from fedent.config import PrivacyConfig, RobustConfig
from fedent.distributed import World
from fedent.params import norm_sq
from fedent.rounds import robust
from fedent.rounds.acceptance import Acceptance
from fedent.rounds.distributed import DistributedExecutor, Summed, sum_blocker
from fedent.rounds.executor import Gathered
from fedent.strategies.base import ClientUpdate, RoundPayload, SecureSum, Strategy
from fedent.strategies.fedavg import FedAvg
from fedent.strategies.fedent import UPDATE_SCALARS, FedEnt
from fedent.strategies.scaffold import DELTA_C, Scaffold


class StubHost:
    """What ``DistributedExecutor`` reads of an in-process executor: its host and ``fit``."""

    def __init__(self, updates: dict[int, ClientUpdate]) -> None:
        self.host = SimpleNamespace(on_update=None, hosted=[])
        self.updates = updates

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        return Gathered({c: self.updates[c] for c in cids})


def model(seed: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 2, generator=g), torch.randn(4, generator=g)]


def summed(updates: dict[int, ClientUpdate], strategy: Strategy, accept: Any, cap: float | None) -> Summed:
    ex = DistributedExecutor(StubHost(updates), World(), sums=True)  # type: ignore[arg-type]
    return ex.fit_sum(0, sorted(updates), model(99), strategy, RoundPayload(0), accept, cap)


def test_a_reduced_round_is_the_capped_weighted_mean_of_the_accepted_updates() -> None:
    """One client holds 100 of 130 samples (the 0.4 cap binds) and one uploads NaN (rejected by the rule)."""
    w = model(99)
    counts = {0: 100, 1: 10, 2: 10, 3: 10, 4: 10}
    updates = {c: ClientUpdate(c, model(c), n, 0.1 * c) for c, n in counts.items()}
    updates[4].params[1][0] = float("nan")
    strategy = FedAvg()
    accept = Acceptance(lambda: strategy, lambda: w, lambda: [counts[c] for c in sorted(counts)]).updates
    got = summed(updates, strategy, accept, 0.4)
    assert sorted(got.updates.results) == [0, 1, 2, 3] and "not finite" in got.updates.failed[4]
    assert all(u.params == [] for u in got.updates.results.values())  # clear parts only
    assert [u.num_samples for u in got.updates.results.values()] == [100, 10, 10, 10]  # as reported
    kept = [updates[c] for c in range(4)]
    weighed, diag = robust.apply(RobustConfig(max_weight_share=0.4), w, kept)
    assert got.diagnostics == diag and diag["robust"]["capped_weights"] == [0]
    assert [u.num_samples for u in got.total.clients] == [u.num_samples for u in weighed]
    assert got.total.weight == sum(u.num_samples for u in weighed)
    want = strategy.aggregate(0, w, weighed).params
    have = strategy.aggregate_sum(0, w, got.total).params
    assert all(h.dtype == torch.float32 for h in have)
    assert max(float((a - b).abs().max()) for a, b in zip(have, want, strict=True)) <= 1e-6
    assert got.total.norms == {c: norm_sq(updates[c].params) for c in range(4)}


def test_without_a_binding_cap_the_sum_weighs_by_the_reported_counts() -> None:
    updates = {c: ClientUpdate(c, model(c), 10 * (c + 1), 0.0) for c in range(3)}
    got = summed(updates, FedAvg(), lambda g: g, None)
    assert got.diagnostics == {} and got.total.weight == 60.0
    want = [sum(10 * (c + 1) * model(c)[i].double() for c in range(3)) for i in range(2)]
    assert all(torch.allclose(a.double(), b, atol=1e-5) for a, b in zip(got.total.params, want, strict=True))


def test_uniform_weights_sum_the_models_and_every_tensor_group() -> None:
    """SCAFFOLD: Σ y_i and Σ Δc_i, weight |S| (the counts do not weigh)."""
    updates = {c: ClientUpdate(c, model(c), 7 * (c + 1), 0.0, tensors={DELTA_C: model(10 + c)}) for c in range(3)}
    got = summed(updates, Scaffold(), lambda g: g, None)
    assert got.total.weight == 3.0
    for i in range(2):
        assert torch.allclose(got.total.params[i], sum(model(c)[i] for c in range(3)), atol=1e-6)
        assert torch.allclose(got.total.tensors[DELTA_C][i], sum(model(10 + c)[i] for c in range(3)), atol=1e-6)


def fedent_update(cid: int, n: int) -> ClientUpdate:
    scalars = {k: 0.01 * (cid + 1) for k in UPDATE_SCALARS}
    scalars.update(guarded=0.0, phi2_next=3.0)
    return ClientUpdate(cid, model(cid), n, 0.5, scalars=scalars)


def test_fedent_records_phi2_actual_and_entropy_from_a_sum_with_norms() -> None:
    updates = [fedent_update(c, 10 + c) for c in range(3)]
    w = model(99)
    plain = FedEnt().aggregate(0, w, updates)
    total = SecureSum(0, [sum(u.num_samples * u.params[i] for u in updates) for i in range(2)], {},
                      float(sum(u.num_samples for u in updates)),
                      [ClientUpdate(u.cid, [], u.num_samples, u.train_loss, scalars=u.scalars) for u in updates],
                      norms={u.cid: norm_sq(u.params) for u in updates})
    reduced = FedEnt().aggregate_sum(0, w, total)
    assert reduced.diagnostics["fedent"] == plain.diagnostics["fedent"]
    assert plain.diagnostics["fedent"]["phi2_actual"] is not None
    blind = FedEnt().aggregate_sum(0, w, dataclasses.replace(total, norms=None))  # secure aggregation's sum
    assert blind.diagnostics["fedent"]["phi2_actual"] is None and blind.diagnostics["fedent"]["entropy"] is None


@pytest.mark.parametrize(("change", "why"), [
    ({"algorithm": "fedcos"}, "fedcos needs more than the updates' weighted sum"),
    ({"privacy": PrivacyConfig(secure_aggregation=True)}, "secure aggregation"),
    ({"privacy": PrivacyConfig(dp="central")}, "central DP"),
    ({"robust": RobustConfig(aggregator="median")}, "robust.aggregator median"),
    ({"robust": RobustConfig(clip_norm=1.0)}, "robust.clip_norm"),
    ({"local_eval": 2}, "train.local_eval"),
])
def test_sum_blocker_keeps_runs_that_look_at_single_updates_gathered(change: dict[str, Any], why: str) -> None:
    from fedent.strategies.registry import strategy_class

    cfg = tiny_config(change.get("algorithm", "fedavg"))
    cfg = dataclasses.replace(cfg, **{k: v for k, v in change.items() if k in ("privacy", "robust")})
    assert sum_blocker(tiny_config("fedavg"), FedAvg, 0) is None
    got = sum_blocker(cfg, strategy_class(cfg.algorithm.name), int(change.get("local_eval", 0)))
    assert got is not None and why in got


def test_reduce_sum_on_a_run_that_needs_every_update_is_refused(tmp_path: Path) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml", algorithm="fedcos")
    res = subprocess.run([sys.executable, "-m", "fedent", "simulate", "--config", str(cfg), "--reduce", "sum",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--reduce sum: this run cannot be reduced to sums: fedcos" in res.stderr
    assert not list(tmp_path.glob("tiny*"))  # refused before a run directory was made
