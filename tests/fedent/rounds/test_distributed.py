"""P processes reproduce one: a 2-rank gloo run of FedAvg, FedEnt (online, federated evaluation; reduced to
sums and gathered), FedEnt's offline Algorithm 1 on the vectorised host, SCAFFOLD, FedDyn, FedCos and FedAvg under
secure aggregation equals the one-process run (model within 1e-5, same records); the secure one is also the plain
model within the fixed-point resolution. In one process: a reduced round (``fit_sum``) against the gathered
path (the weight cap and the acceptance rule as the engine applies them, uniform weights and tensor groups),
FedEnt's record from a sum, and which runs ``sum_blocker`` keeps on the gathered path."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from distributed_support import COMBINED, POLICIES, case_inputs, cases, fault_main, rank_main
from sim_support import tiny_config, tiny_inputs, write_tiny_config_file
from torch import Tensor

from fedent.config import PrivacyConfig, RobustConfig
from fedent.distributed import World, free_port
from fedent.params import norm_sq
from fedent.rounds import robust
from fedent.rounds.acceptance import Acceptance
from fedent.rounds.distributed import RANKS_DIR, DistributedExecutor, Summed, _slice, merge, sum_blocker
from fedent.rounds.executor import Gathered
from fedent.sim.simulator import run_simulation
from fedent.strategies.base import ClientUpdate, RoundPayload, SecureSum, Strategy
from fedent.strategies.fedavg import FedAvg
from fedent.strategies.fedcos import FedCos
from fedent.strategies.fedent import UPDATE_SCALARS, FedEnt
from fedent.strategies.scaffold import DELTA_C, Scaffold


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(rank_main, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return out


@pytest.mark.slow  # two spawned ranks (~35 s on a busy 2-core box) and three one-process runs
@pytest.mark.parametrize("name", [n for n, _ in cases()])
def test_two_processes_give_the_one_process_run(two_ranks: Path, tmp_path: Path, name: str) -> None:
    cfg = dict(cases())[name]
    one = run_simulation(cfg, tmp_path / name, progress=False, inputs=case_inputs(name), plots=False,
                         policy=POLICIES.get(name))
    two = torch.load(two_ranks / f"{name}.pt")
    diff = max(float((a - b).abs().max()) for a, b in zip(one.params, two["params"], strict=True))
    assert diff <= 1e-5
    recs = json.loads(two["records"])
    assert [r["clients"] for r in recs] == [r["clients"] for r in one.records]
    assert [r["test_acc"] for r in recs] == [r["test_acc"] for r in one.records]
    for a, b in zip(recs, one.records, strict=True):
        for k in ("skipped", "failed_clients", "robust", "cos_fallback"):  # rejections, skips, the cap, FedCos
            assert a["diagnostics"].get(k) == b["diagnostics"].get(k), k
        assert a["diagnostics"].get("cos_weights") == pytest.approx(b["diagnostics"].get("cos_weights"), abs=1e-6)
        assert a["test_loss"] == pytest.approx(b["test_loss"], abs=1e-5)
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        if b["fedent"] is not None:
            assert [c["eta"] for c in a["fedent"]["clients"]] == pytest.approx(
                [c["eta"] for c in b["fedent"]["clients"]], abs=1e-7)
            # a reduced round still records φ2_actual and the entropy term (each client's ‖w_i‖² travels beside)
            for k in ("phi2_actual", "entropy"):
                assert a["fedent"][k] == pytest.approx(b["fedent"][k], rel=1e-6), k
    # rank 0 booked every client's uploads (its own and rank 1's), as one process does
    rows_two = json.loads((two_ranks / name / "clients.json").read_text())["clients"]
    rows_one = json.loads((tmp_path / name / "clients.json").read_text())["clients"]
    assert [(r["participation"], r["bytes"]) for r in rows_two] == [(r["participation"], r["bytes"]) for r in rows_one]
    assert [r["worker"] for r in rows_two][:2] == ["simulator rank 0/2", "simulator rank 1/2"]
    seen = {k for r in one.records for k in r["diagnostics"]}
    if name == "fedavg-rejected":  # the case exercises what it is for
        assert {"failed_clients", "robust"} <= seen and "skipped" not in seen
    if name == "fedavg-skipped":
        assert "skipped" in seen and any("not finite" in w for r in one.records
                                         for w in r["diagnostics"].get("failed_clients", {}).values())
    status = json.loads((two_ranks / name / "status.json").read_text())
    assert status["phase"] == "done" and status["state"]["processes"] == 2 and status["state"]["gather_s"] > 0
    assert status["state"]["reduce"] == COMBINED[name]
    assert status["state"]["gather_cpu_s"] > 0
    assert (two_ranks / name / RANKS_DIR / "1" / "status.json").is_file()  # rank 1 wrote only under .ranks/


@pytest.mark.slow  # shares the two spawned ranks above
def test_secure_aggregation_over_two_processes_gives_the_plain_one_process_model(two_ranks: Path,
                                                                                  tmp_path: Path) -> None:
    """Each rank runs its own clients' protocol sessions and masks their updates; the masked vectors and the
    protocol's answers are all-gathered, so every rank's server step unmasks the same sum (the masked vectors
    must survive the gather: a gather that dropped them made the round fail with "not masked")."""
    cfg = dict(cases())["fedavg-secure"]
    plain = run_simulation(dataclasses.replace(cfg, privacy=PrivacyConfig()), tmp_path / "plain", progress=False,
                           inputs=tiny_inputs(), plots=False)
    two = torch.load(two_ranks / "fedavg-secure.pt")
    num = sum(float((a.double() - b.double()).norm() ** 2) for a, b in zip(two["params"], plain.params, strict=True))
    rel = num ** 0.5 / sum(float(b.double().norm() ** 2) for b in plain.params) ** 0.5
    assert 0 < rel <= 1e-4  # the fixed-point rounding, nothing more
    recs = json.loads(two["records"])
    assert len(recs) == 2 and all("skipped" not in r["diagnostics"] for r in recs)
    assert [r["clients"] for r in recs] == [r["clients"] for r in plain.records]


def test_owner_is_a_fixed_round_robin_and_one_process_owns_all() -> None:
    w = World(rank=1, size=3)
    assert [w.owner(c) for c in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert w.mine([0, 1, 4, 5, 7]) == [1, 4, 7]
    assert World().mine([3, 1]) == [3, 1] and World().all_gather("x") == ["x"]


def test_test_set_slices_cover_it_once() -> None:
    parts = [_slice(10, World(rank=r, size=3)) for r in range(3)]
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 7), (7, 10)]


@pytest.mark.slow  # two spawned ranks, a few steps of tiny stub updates (a few seconds)
def test_a_rank_failing_in_its_own_part_makes_every_rank_raise_instead_of_waiting(tmp_path: Path) -> None:
    """Rank 1 fails in its own part of a step (not a client's): before the gather (reduced and gathered rounds,
    probes), while adding its clients into the reduced sum, in Algorithm 1's oracle, in the split evaluation and
    when its checkpoint fails to load on a resume (where ranks at different rounds are refused too).
    Both ranks raise at once, rank 1 its own error and rank 0 ``RanksFailed`` naming it (not gloo's timeout after
    waiting, here 20 s), and the next step runs on both."""
    mp.spawn(fault_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # FedAvg's sum: 10 samples each, client c's tensors c and -c
    healthy = [40.0, [60.0] * 6, [-60.0] * 4]
    assert r0[0] == r1[0] == healthy and r0[5] == r1[5] == healthy
    assert r0[1] == r1[1] == [0, 1, 2, 3]
    assert r0[7] == r1[7] == [0.0, 1.0, 2.0, 3.0]  # probes, after rank 1's failed one
    injected = {2: "rank 1 ran out of memory (injected)", 3: None, 4: "rank 1 ran out of memory (injected)",
                6: "rank 1's probe failed (injected)"}
    for i, why in injected.items():
        assert r1[i][0] == "RuntimeError" and (why is None or r1[i][1] == why), r1[i]
        assert r0[i] == ["RanksFailed", f"rank 1 of 2 failed: RuntimeError: {r1[i][1]}"], r0[i]
    # Algorithm 1's oracle (batched, then client 3 alone, owned by rank 1) and the split evaluation
    healthy_runs = ([0.0, 1.0, 2.0, 3.0], [3.0, 3.0], [1.0, 0.6])
    for k, (healthy_run, why) in enumerate(zip(healthy_runs, ("gradient", "gradient", "evaluation"), strict=True)):
        at = 8 + 3 * k
        assert r0[at] == r1[at] == healthy_run and r0[at + 2] == r1[at + 2] == healthy_run
        assert r1[at + 1] == ["RuntimeError", f"rank 1's {why} failed (injected)"]
        assert r0[at + 1] == ["RanksFailed", f"rank 1 of 2 failed: RuntimeError: rank 1's {why} failed (injected)"]
    # the resume (engine.resumed): agreed at round 3; rank 1's checkpoint unreadable (named to rank 0, which would
    # otherwise wait in round 1's gather); the ranks at rounds 3 and 2 refused on both; agreed again
    assert r0[17] == r1[17] == 3 and r0[20] == r1[20] == 3
    assert r1[18] == ["RuntimeError", "rank 1's checkpoint is unreadable (injected)"]
    assert r0[18] == ["RanksFailed", "rank 1 of 2 failed: RuntimeError: rank 1's checkpoint is unreadable (injected)"]
    different = "the ranks would start at different rounds [3, 2] (their checkpoints differ)"
    assert r0[19][0] == r1[19][0] == "WorldError" and r0[19][1].startswith(different) and r1[19] == r0[19]
    assert len(r0) == len(r1) == 21


def test_merge_alone_raises_the_ranks_own_error() -> None:
    boom = MemoryError("out of memory")
    with pytest.raises(MemoryError, match="out of memory"):
        merge(World(), Gathered({1: "a"}), error=boom)


def test_merge_of_one_rank_sorts_by_client() -> None:
    got = merge(World(), Gathered({3: "c", 1: "a"}, {2: "why"}))
    assert list(got.results) == [1, 3] and got.failed == {2: "why"}


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
    return ex.fit_sum(0, sorted(updates), model(99), strategy, RoundPayload(0), accept,
                      RobustConfig(max_weight_share=cap))


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


class Whole(FedAvg):
    """A strategy (e.g. a plug-in) that declares no way to aggregate a sum: its rounds stay gathered."""

    name = "whole"
    secure_weighting = None


class Squared(FedCos):
    """A plug-in on FedCos with its own weights in ``aggregate`` only: the inherited sum would not be it."""

    name = "squared"

    def aggregate(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]) -> Any:
        raise AssertionError("never called here")


class HalfStat(FedAvg):
    name = "halfstat"
    secure_weighting = None
    reduce_by_statistic = True


@pytest.mark.parametrize(("change", "why"), [
    ({"algorithm": Whole}, "whole needs more than the updates' weighted sum"),
    ({"algorithm": Squared}, "squared overrides aggregate (Squared) without its own aggregate_sum (FedCos's)"),
    ({"algorithm": HalfStat}, "halfstat sets reduce_by_statistic but does not define reduce_statistic"),
    ({"privacy": PrivacyConfig(secure_aggregation=True)}, "secure aggregation"),
    ({"privacy": PrivacyConfig(dp="central")}, "central DP"),
    ({"robust": RobustConfig(aggregator="median")}, "robust.aggregator median"),
    ({"robust": RobustConfig(clip_norm=1.0)}, "robust.clip_norm"),
    ({"local_eval": 2}, "train.local_eval"),
])
def test_sum_blocker_keeps_runs_that_look_at_single_updates_gathered(change: dict[str, Any], why: str) -> None:
    from fedent.strategies.registry import strategy_class

    cfg = dataclasses.replace(tiny_config(), **{k: v for k, v in change.items() if k in ("privacy", "robust")})
    for name in ("fedavg", "fedadam", "fedyogi", "fedprox", "feddyn", "fedcos", "fednorm", "fedent", "scaffold"):
        assert sum_blocker(tiny_config(name), strategy_class(name), 0) is None, name  # every built-in sums
    got = sum_blocker(cfg, change.get("algorithm", FedAvg), int(change.get("local_eval", 0)))
    assert got is not None and why in got


def test_reduce_sum_on_a_run_that_needs_every_update_is_refused(tmp_path: Path) -> None:
    cfg = write_tiny_config_file(tmp_path / "c.yaml", algorithm="fedcos")
    res = subprocess.run([sys.executable, "-m", "fedent", "simulate", "--config", str(cfg), "--reduce", "sum",
                          "--set", "robust.aggregator=median", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "--reduce sum: this run cannot be reduced to sums: robust.aggregator median" in res.stderr
    assert not list(tmp_path.glob("tiny*"))  # refused before a run directory was made


def test_feddyn_takes_its_lambda_increment_from_the_float64_differences() -> None:
    """Σ (w_k − w_srv) from Σ w_k − |S| w_srv in float32 cancels (relative error ~1e-4 for |Δ| ~ 1e-3 |w|); the
    reduced round's ``deltas`` keep it as exact as the gathered path's per-client differences."""
    from fedent.strategies.feddyn import FedDyn

    g = torch.Generator().manual_seed(0)
    w = [torch.randn(20000, generator=g)]
    updates = {k: ClientUpdate(k, [w[0] + 1e-3 * torch.randn(20000, generator=g)], 10, 0.0) for k in range(10)}
    exact = sum(u.params[0].double() - w[0].double() for u in updates.values())
    gathered, reduced = FedDyn(), FedDyn()
    for s in (gathered, reduced):
        s.setup(w, [10] * 100)
    want = gathered.aggregate(0, w, list(updates.values())).params
    ex = DistributedExecutor(StubHost(updates), World(), sums=True)  # type: ignore[arg-type]
    total = ex.fit_sum(0, sorted(updates), w, reduced, RoundPayload(0), lambda got: got,
                       RobustConfig(max_weight_share=None)).total
    new = reduced.aggregate_sum(0, w, total).params
    for s in (gathered, reduced):
        lam = s.server_state()["lambda_sum"][0].double()
        assert float((lam - exact).abs().max() / exact.abs().max()) <= 1e-6
    assert float((new[0] - want[0]).abs().max()) <= 1e-6


@pytest.mark.parametrize("against", [1.0, -1.0], ids=["cosine", "fallback"])
def test_fedcos_reduced_weighs_by_the_cosines_its_ranks_took(against: float) -> None:
    """Each cosine with w(t) taken where its client trained, normalised over the round; updates pointing away from
    w(t) (every cosine clipped to 0) fall back to the (capped) sample weights, as the gathered path does."""
    w = model(99)
    updates = {c: ClientUpdate(c, [against * p + 0.3 * q for p, q in zip(w, model(c), strict=True)], 10 + 5 * c, 0.0)
               for c in range(4)}
    strategy = FedCos()
    got = summed(updates, strategy, lambda g: g, 0.3)
    weighed, _ = robust.apply(RobustConfig(max_weight_share=0.3), w, list(updates.values()))
    want = strategy.aggregate(0, w, weighed)
    have = strategy.aggregate_sum(0, w, got.total)
    assert have.diagnostics["cos_fallback"] is want.diagnostics["cos_fallback"] is (against < 0)
    assert have.diagnostics["cos_weights"] == pytest.approx(want.diagnostics["cos_weights"], abs=1e-12)
    assert max(float((a - b).abs().max()) for a, b in zip(have.params, want.params, strict=True)) <= 1e-6
    assert got.total.stats is not None and len(got.total.stats) == 4
