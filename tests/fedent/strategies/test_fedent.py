"""FedEnt (Algorithm 2) driven round by round on a tiny linear model, online and offline estimators."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedent.config import AlgorithmConfig, ConfigError
from fedent.meanfield.lr import q_value, solve_eta
from fedent.meanfield.oracle import TrainerOracle
from fedent.params import clone, norm_sq, weighted_sum
from fedent.rng import torch_generator
from fedent.strategies.base import ClientState, ClientTask
from fedent.strategies.fedent import FedEnt, FedEntOptions
from fedent.strategies.registry import build_strategy
from fedent.trainer import LocalTrainer

N_CLIENTS, LR, EPOCHS, SEED = 6, 0.05, 1, 11


def _setup() -> tuple[LocalTrainer, list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(120, 4, generator=gen)
    y = torch.randint(0, 3, (120,), generator=gen)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    trainer = LocalTrainer(model, x, y, batch_size=8, device=torch.device("cpu"))
    sizes = [10, 14, 18, 22, 26, 30]
    bounds = np.cumsum([0, *sizes])
    indices = [torch.arange(int(bounds[i]), int(bounds[i + 1])) for i in range(N_CLIENTS)]
    return trainer, indices, clone(trainer.params)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """torch.testing.assert_close's check for float32 (same shape and dtype, rtol 1.3e-6, atol 1e-5) without its
    first-call import of torch.distributed.tensor (~10 s: it made this file's tests, and each mutant's run, slow)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype == torch.float32
    assert torch.allclose(actual, expected, rtol=1.3e-6, atol=1e-5), (actual, expected)


def _task(cid: int, rnd: int, indices: list[torch.Tensor]) -> ClientTask:
    return ClientTask(cid=cid, round=rnd, indices=indices[cid], lr=LR, epochs=EPOCHS, seed=SEED)


def _run_round(strategy: FedEnt, trainer, indices, w, rnd, cids, states):  # type: ignore[no-untyped-def]
    tasks = {c: _task(c, rnd, indices) for c in cids}
    probes = [strategy.probe(trainer, w, tasks[c], states[c]) for c in cids]
    payload = strategy.round_payload(rnd, w, probes)
    updates = [strategy.fit(trainer, w, payload, tasks[c], states[c]) for c in cids]
    return payload, updates, strategy.aggregate(rnd, w, updates)


@pytest.mark.parametrize("phi2_rate,eta_max", [("used", 1.0), ("star", None)])
def test_rounds_follow_prop1_decay_and_aggregation(phi2_rate: str, eta_max: float | None) -> None:
    trainer, indices, w = _setup()
    opts = FedEntOptions(beta=0.99, gamma=0.5, phi2_rate=phi2_rate, eta_max=eta_max)  # type: ignore[arg-type]
    strategy = FedEnt(opts)
    states = {c: strategy.init_client_state(c, int(indices[c].numel())) for c in range(N_CLIENTS)}
    schedule = [[0, 1, 2], [3, 4, 5], [0, 3]]  # client 0 skips round 1
    etas: dict[tuple[int, int], float] = {}
    positive = 0
    for rnd, cids in enumerate(schedule):
        payload, updates, agg = _run_round(strategy, trainer, indices, w, rnd, cids, states)
        c = norm_sq(w)
        assert payload.scalars["c"] == pytest.approx(c, rel=1e-12)
        total = sum(int(indices[i].numel()) for i in cids)
        assert payload.scalars["total_samples"] == total
        rec = agg.diagnostics["fedent"]
        logged = rec["clients"]
        assert [r["client"] for r in logged] == cids
        th = np.array([r["theta"] for r in logged])
        a, b = np.array([r["a"] for r in logged]), np.array([r["b"] for r in logged])
        assert th.sum() == pytest.approx(1.0)
        phi2 = payload.scalars["phi2_next"]
        # φ2' is the online fixed point: φ2' = Σθ q(η(φ2')) from the logged scalars, with η the rate used
        # (phi2_rate used: the decayed rate each client trained with) or η* (star)
        star = np.array([r["eta_star"] for r in logged])
        used = np.array([r["eta"] for r in logged])
        positive += int(np.count_nonzero(star))
        mf_rate = used if phi2_rate == "used" else star
        assert phi2 == pytest.approx(float(np.sum(th * q_value(mf_rate, a, b, c))), rel=1e-9)
        assert rec["phi2_rate"] == phi2_rate and rec["eta_max"] == eta_max
        assert rec["estimate"]["mode"] == "online" and rec["estimate"]["phi2_rate"] == phi2_rate
        for r in logged:
            # the logged η* is Prop. 1's solution given the logged scalars (recomputable from the log)
            assert r["eta_max"] == eta_max and r["phi2_rate"] == phi2_rate
            sol = solve_eta(r["a"], r["b"], r["c"], r["theta"], r["phi2_next"], r["beta"], r["variant"],
                            eta_max=r["eta_max"])
            if eta_max is not None:
                assert r["eta_star"] <= eta_max
            assert r["eta_star"] == sol.eta_star[0]
            if 0 < r["eta_star"] < sol.bound[0]:
                e = r["eta_star"]
                k = r["beta"] * r["theta"] / ((1 - r["beta"]) * r["phi2_next"])
                q = r["c"] - 2 * e * r["a"] + e * e * r["b"]
                h = k * (r["a"] - e * r["b"]) * (1 + math.log(r["theta"] * q / r["phi2_next"]))
                assert e == pytest.approx(h, rel=1e-9)
            prev = etas.get((r["client"], -1), LR)
            assert r["eta_prev"] == prev
            assert r["eta"] == pytest.approx(0.5 * prev + 0.5 * r["eta_star"], rel=1e-15)
            etas[(r["client"], -1)] = r["eta"]
            etas[(r["client"], rnd)] = r["eta"]
        # aggregation: θ-weighted mean of the uploads; φ2 actual and entropy recorded
        expected = weighted_sum([u.params for u in updates], th.tolist())
        for p, e in zip(agg.params, expected, strict=True):
            _assert_close(p, e)
        actual = float(np.sum(th * np.array([norm_sq(u.params) for u in updates])))
        assert rec["phi2_actual"] == pytest.approx(actual, rel=1e-12)
        assert rec["entropy"] <= 0 and rec["phi2_pred"] == phi2
        w = agg.params
    # client 0's round-2 rate decays from its own round-0 rate (it skipped round 1)
    assert states[0].scalars["eta"] == etas[(0, 2)]
    assert positive > 0, "degenerate test: every eta* was zero"


def test_fit_trains_at_the_decayed_rate_and_recomputes_a_missing_probe() -> None:
    trainer, indices, w = _setup()
    strategy = FedEnt(FedEntOptions(gamma=0.9))
    states = {c: ClientState() for c in (1, 2)}
    tasks = {c: _task(c, 0, indices) for c in (1, 2)}
    probes = [strategy.probe(trainer, w, tasks[c], states[c]) for c in (1, 2)]
    payload = strategy.round_payload(0, w, probes)
    fresh = ClientState()  # as after a worker restart between probe and fit
    up_fresh = strategy.fit(trainer, w, payload, tasks[1], fresh)
    up = strategy.fit(trainer, w, payload, tasks[1], states[1])
    assert up.scalars["a"] == up_fresh.scalars["a"] and up.scalars["eta"] == up_fresh.scalars["eta"]
    trainer.load(w)
    trainer.train(indices[1], up.scalars["eta"], EPOCHS, torch_generator(SEED, "train", 0, 1))
    for p, q in zip(up.params, trainer.params, strict=True):
        _assert_close(p, q)


def test_offline_estimator_prepare_and_checkpoint_roundtrip() -> None:
    trainer, indices, w = _setup()
    opts = FedEntOptions(estimator="offline", max_sweeps=5, offline_clients="population")
    strategy = FedEnt(opts)
    with pytest.raises(Exception, match="prepare"):
        strategy.round_payload(0, w, [])
    sizes = [int(i.numel()) for i in indices]
    oracle = TrainerOracle(trainer, indices, SEED, 8)
    with pytest.raises(Exception, match="base rate"):  # phi2_rate used needs η_i(−1)
        strategy.prepare(oracle, w, sizes, rounds=2)
    strategy.set_run_plan([[1, 4], [2, 3]], LR)
    report = strategy.prepare(oracle, w, sizes, rounds=2)
    assert report["stop_reason"] in ("converged", "max_sweeps") and 1 <= report["sweeps"] <= 5
    assert report["gradient_evaluations"] == report["sweeps"] * 2 * N_CLIENTS
    assert len(report["phi2"]) == 3 and report["phi2"][0] == pytest.approx(norm_sq(w))
    states = {c: ClientState() for c in range(N_CLIENTS)}
    payload, _, _ = _run_round(strategy, trainer, indices, w, 0, [1, 4], states)
    assert payload.scalars["phi2_next"] == report["phi2"][1]
    restored = FedEnt(opts)
    restored.load_server_state(strategy.server_state())
    probes = [restored.probe(trainer, w, _task(c, 1, indices), ClientState()) for c in (2, 3)]
    assert restored.round_payload(1, w, probes).scalars["phi2_next"] == report["phi2"][2]
    with pytest.raises(Exception, match="outside"):
        restored.round_payload(2, w, probes)


def test_offline_simulates_the_rounds_participants_and_flags_a_changed_sample() -> None:
    """Spec §5 "One θ": Algorithm 1 steps each round with exactly that round's sampled clients (θ over them);
    a round run with other clients keeps the planned estimate and its diagnostics say so."""
    trainer, indices, w = _setup()
    sizes = [int(i.numel()) for i in indices]
    schedule = [[1, 4], [2, 3]]
    strategy = FedEnt(FedEntOptions(estimator="offline", max_sweeps=1, gamma=0.5))
    with pytest.raises(Exception, match="schedule"):
        strategy.prepare(TrainerOracle(trainer, indices, SEED, 8), w, sizes, rounds=2)
    strategy.set_run_plan(schedule, LR)

    class Counting(TrainerOracle):
        asked: list[tuple[int, int]] = []

        def gradient(self, t, cid, point):  # type: ignore[no-untyped-def]
            self.asked.append((t, cid))
            return super().gradient(t, cid, point)

    oracle = Counting(trainer, indices, SEED, 8)
    report = strategy.prepare(oracle, w, sizes, rounds=2)
    assert oracle.asked == [(0, 1), (0, 4), (1, 2), (1, 3)]
    assert report["gradient_evaluations"] == 4 and report["offline_clients"] == "participants"
    # training's θ is Algorithm 1's θ: over the round's participants
    th = np.array([sizes[1], sizes[4]], dtype=float) / (sizes[1] + sizes[4])
    states = {c: ClientState() for c in range(N_CLIENTS)}
    payload, _, agg = _run_round(strategy, trainer, indices, w, 0, [1, 4], states)
    rec = agg.diagnostics["fedent"]
    assert [r["theta"] for r in rec["clients"]] == pytest.approx(th.tolist())
    assert payload.scalars["phi2_next"] == report["phi2"][1]
    assert rec["estimate"]["sample"] == "planned"
    _, _, agg2 = _run_round(strategy, trainer, indices, agg.params, 1, [2, 5], states)  # a retry's clients
    est = agg2.diagnostics["fedent"]["estimate"]
    assert est["sample"] == "changed" and est["planned"] == [2, 3]


def test_options_are_validated_through_the_registry() -> None:
    s = build_strategy(AlgorithmConfig("fedent", {"beta": 0.9, "variant": "paper", "probe_batch_size": 4}))
    assert isinstance(s, FedEnt) and s.options.variant == "paper"
    for bad in ({"beta": 1.0}, {"variant": "nope"}, {"estimator": "x"}, {"eps1": 0}, {"unknown": 1},
                {"probe_batch_size": 0}, {"gamma": 2}):
        with pytest.raises(ConfigError):
            build_strategy(AlgorithmConfig("fedent", bad))


def test_offline_prepare_passes_every_option_to_algorithm_1() -> None:
    """prepare() is Algorithm 1 called with the strategy's options and the run's base rate: its φ2 equals a
    hand-built solve_fixed_point call, and each of eta_max, phi2_rate, gamma and base_lr changes it (so an
    option dropped from the call, falling back to solve_fixed_point's default, is caught)."""
    from fedent.meanfield.fixed_point import solve_fixed_point

    trainer, indices, w = _setup()
    sizes = [int(i.numel()) for i in indices]
    schedule = [[1, 4], [2, 3], [0, 5]]
    # every value differs from solve_fixed_point's default (eta_max None, star, gamma 0.99, base_lr 0.01)
    opts = dict(estimator="offline", max_sweeps=3, beta=0.99, gamma=0.5, phi2_rate="used", eta_max=0.02,
                eps1=1e-9, eps2=1e-9)

    def offline(base_lr: float = LR, **change: object) -> list[float]:
        strategy = FedEnt(FedEntOptions(**{**opts, **change}))  # type: ignore[arg-type]
        strategy.set_run_plan(schedule, base_lr)
        return strategy.prepare(TrainerOracle(trainer, indices, SEED, 8), w, sizes, rounds=3)["phi2"]

    got = offline()
    total = float(sum(sizes))
    ref = solve_fixed_point(TrainerOracle(trainer, indices, SEED, 8), w, list(range(N_CLIENTS)),
                            [n / total for n in sizes], 3, 0.99, "exact", 1e-9, 1e-9, 3, schedule=schedule,
                            eta_max=0.02, phi2_rate="used", gamma=0.5, base_lr=LR)
    assert got == [float(v) for v in ref.phi2]
    for changed in (offline(eta_max=None), offline(phi2_rate="star"), offline(gamma=0.99), offline(base_lr=0.01)):
        assert changed[0] == got[0] and changed[1:] != got[1:]


def test_probe_and_fit_use_the_probe_batch_the_cached_probe_and_upload_every_scalar() -> None:
    """The probe is g_i at w(t) on the seeded ("probe", round, cid) batch of probe_batch_size; fit takes (a, b)
    from the client's state when it probed this round (else recomputes them), and uploads exactly UPDATE_SCALARS."""
    from fedent.params import dot
    from fedent.strategies.fedent import UPDATE_SCALARS

    trainer, indices, w = _setup()
    strategy = FedEnt(FedEntOptions(probe_batch_size=4, eta_max=1e-4, gamma=0.5))
    state = ClientState()
    task = _task(4, 2, indices)
    probe = strategy.probe(trainer, w, task, state)
    trainer.load(w)
    g = trainer.gradient(indices[4], torch_generator(SEED, "probe", 2, 4), 4)
    assert (probe.cid, probe.num_samples) == (4, 26)
    assert probe.scalars == {"a": dot(w, g), "b": norm_sq(g), "eta_prev": LR}
    payload = strategy.round_payload(2, w, [probe, strategy.probe(trainer, w, _task(5, 2, indices), ClientState())])
    fresh = strategy.fit(trainer, w, payload, task, ClientState())  # recomputed: the same seeded batch
    assert (fresh.scalars["a"], fresh.scalars["b"]) == (probe.scalars["a"], probe.scalars["b"])
    assert set(fresh.scalars) == set(UPDATE_SCALARS)
    # eta_max binds (the unconstrained η* is 0.36 here): the upload's η* is the cap, decayed with γ = 0.5
    assert fresh.scalars["eta_star"] == 1e-4 and fresh.scalars["eta"] == pytest.approx(0.5 * LR + 0.5 * 1e-4)
    assert fresh.scalars["theta"] == 26 / 56 and fresh.scalars["c"] == payload.scalars["c"]
    # a probe cached for this round is used as it is (not recomputed)
    state.scalars.update({"a": 0.125, "b": 0.5})
    cached = strategy.fit(trainer, w, payload, task, state)
    assert (cached.scalars["a"], cached.scalars["b"]) == (0.125, 0.5)
    assert state.scalars["eta"] == cached.scalars["eta"]
    stale = ClientState(scalars={"a": 0.125, "b": 0.5, "probe_round": 1.0})  # probed in an earlier round
    assert strategy.fit(trainer, w, payload, task, stale).scalars["a"] == probe.scalars["a"]


def test_malformed_payloads_probes_and_states_raise_strategy_errors_that_say_what() -> None:
    from fedent.strategies.base import Probe, RoundPayload, StrategyError

    trainer, indices, w = _setup()
    strategy = FedEnt()
    task = _task(1, 0, indices)
    good = {"phi2_next": 1.0, "c": 1.0, "total_samples": 10.0}
    with pytest.raises(StrategyError, match=r"^fedent: the round payload lacks 'c'$"):
        strategy.fit(trainer, w, RoundPayload(0, scalars={"phi2_next": 1.0, "total_samples": 1.0}), task,
                     ClientState())
    with pytest.raises(StrategyError, match=r"^fedent: payload total_samples must be > 0$"):
        strategy.fit(trainer, w, RoundPayload(0, scalars={**good, "total_samples": 0.0}), task, ClientState())
    with pytest.raises(StrategyError, match=r"^fedent: round_payload needs the participants' probes$"):
        strategy.round_payload(0, w, [])
    with pytest.raises(StrategyError, match=r"^fedent: the round's participants hold no samples$"):
        strategy.round_payload(0, w, [Probe(1, 0, {"a": 0.0, "b": 1.0, "eta_prev": 0.1})])
    with pytest.raises(StrategyError, match=r"^fedent: a probe lacks scalar 'b'$"):
        strategy.round_payload(0, w, [Probe(1, 3, {"a": 0.0, "eta_prev": 0.1})])
    with pytest.raises(StrategyError, match=r"^fedent: unknown server state keys \['bogus'\]$"):
        strategy.load_server_state({"bogus": 1})
    offline = FedEnt(FedEntOptions(estimator="offline", offline_clients="population"))
    oracle = TrainerOracle(trainer, indices, SEED, 8)
    with pytest.raises(StrategyError, match=r"^offline estimator: the clients hold no samples$"):
        offline.prepare(oracle, w, [0] * N_CLIENTS, rounds=2)
    with pytest.raises(StrategyError, match=r"^fedent phi2_rate 'used' needs the base rate η_i\(−1\) \(set_run_plan\) "
                                            r"before prepare$"):
        offline.prepare(oracle, w, [10] * N_CLIENTS, rounds=2)
    with pytest.raises(StrategyError, match=r"^fedent offline_clients 'participants' needs the run's client schedule "
                                            r"\(set_run_plan\) before prepare$"):
        FedEnt(FedEntOptions(estimator="offline")).prepare(oracle, w, [10] * N_CLIENTS, rounds=2)
    offline.set_run_plan([[0, 1]], LR)
    with pytest.raises(StrategyError, match=r"^fedent offline estimator: \w"):
        offline.prepare(oracle, w, [10] * N_CLIENTS, rounds=0)


def test_offline_population_reports_its_options_and_round_trips_its_state() -> None:
    """Population mode: every client with samples (one sample is enough) in every round, no schedule; a star-rate
    run without set_run_plan uses base rate 0; the report names the options; the state restores exactly."""
    from fedent.meanfield.fixed_point import solve_fixed_point

    trainer, indices, w = _setup()
    sizes = [1, 14, 0, 22, 26, 30]  # client 2 holds nothing: left out of Algorithm 1; client 0 holds one sample
    opts = FedEntOptions(estimator="offline", offline_clients="population", phi2_rate="star", eta_max=0.02,
                         max_sweeps=2, gamma=0.5)
    strategy = FedEnt(opts)
    report = strategy.prepare(TrainerOracle(trainer, indices, SEED, 8), w, sizes, rounds=2)
    cids = [0, 1, 3, 4, 5]
    ref = solve_fixed_point(TrainerOracle(trainer, indices, SEED, 8), w, cids, [sizes[c] / 93 for c in cids], 2,
                            opts.beta, opts.variant, opts.eps1, opts.eps2, 2, eta_max=0.02, phi2_rate="star",
                            gamma=0.5, base_lr=0.0)
    assert report["phi2"] == [float(v) for v in ref.phi2]
    assert report["gradient_evaluations"] == report["sweeps"] * 2 * len(cids)  # client 2 is never asked
    assert (report["offline_clients"], report["phi2_rate"], report["eta_max"]) == ("population", "star", 0.02)
    state = strategy.server_state()
    assert "schedule" not in state["offline"]  # population: no schedule
    restored = FedEnt(opts)
    restored.load_server_state(state)
    assert restored.server_state() == state
    planned = FedEnt(FedEntOptions(estimator="offline", max_sweeps=1))
    planned.set_run_plan([[1, 4], [2, 3]], LR)
    planned.prepare(TrainerOracle(trainer, indices, SEED, 8), w, [int(i.numel()) for i in indices], rounds=2)
    again = FedEnt(FedEntOptions(estimator="offline", max_sweeps=1))
    again.load_server_state(planned.server_state())
    assert again.server_state() == planned.server_state() and planned.server_state()["offline"]["schedule"]


def test_aggregate_sum_keeps_the_rates_record_without_the_model_norms() -> None:
    """Under secure aggregation the server step is the secure sum's mean; the record is the clear one's but for
    φ2_actual and the entropy (they need each ‖w_i(t+1)‖²), with the round's estimate attached."""
    from fedent.strategies.base import SecureSum, StrategyError

    trainer, indices, w = _setup()
    strategy = FedEnt(FedEntOptions(gamma=0.5, eta_max=0.5, variant="paper", phi2_rate="used"))
    states = {c: ClientState() for c in (1, 3)}
    payload, updates, clear = _run_round(strategy, trainer, indices, w, 0, [1, 3], states)
    strategy.round_payload(0, w, [strategy.probe(trainer, w, _task(c, 0, indices), ClientState()) for c in (1, 3)])
    sizes = [u.num_samples for u in updates]
    total = SecureSum(0, weighted_sum([u.params for u in updates], [float(n) for n in sizes]), {}, float(sum(sizes)),
                      [dataclasses.replace(u, params=[]) for u in updates])
    got = strategy.aggregate_sum(0, w, total)
    for p, q in zip(got.params, total.mean(), strict=True):
        assert torch.equal(p, q)
    rec, ref = got.diagnostics["fedent"], clear.diagnostics["fedent"]
    assert rec["phi2_actual"] is None and rec["entropy"] is None and rec["estimate"] == ref["estimate"]
    assert rec["clients"] == ref["clients"] and rec["phi2_pred"] == ref["phi2_pred"]
    assert [c["variant"] for c in rec["clients"]] == ["paper", "paper"] and rec["phi2_rate"] == "used"
    assert rec["eta_max"] == 0.5 and {c["gamma"] for c in rec["clients"]} == {0.5}
    lacking = dataclasses.replace(total, clients=[dataclasses.replace(updates[0], params=[], scalars={
        k: v for k, v in updates[0].scalars.items() if k != "eta"})])
    with pytest.raises(StrategyError, match=r"^fedent: an update lacks scalar 'eta'$"):
        strategy.aggregate_sum(0, w, lacking)
    with pytest.raises(StrategyError, match=r"^fedent: an update lacks scalar 'eta'$"):
        strategy.aggregate(0, w, [dataclasses.replace(updates[0], scalars=lacking.clients[0].scalars)])
    fixed = FedEnt(FedEntOptions(rates="fixed"))  # a rate control is named in the secure record too
    assert fixed.aggregate_sum(0, w, total).diagnostics["fedent"]["rates"] == "fixed"
    # without a payload for the round there is no estimate to attach (aggregate and aggregate_sum alike)
    assert "estimate" not in strategy.aggregate_sum(7, w, total).diagnostics["fedent"]
    assert "estimate" not in strategy.aggregate(7, w, updates).diagnostics["fedent"]
    assert "estimate" not in FedEnt().aggregate(0, w, updates).diagnostics["fedent"]


def test_the_online_estimator_gets_every_option_and_an_injected_one_is_used_as_it_is() -> None:
    """The online φ2' is OnlinePhi2Estimator's with the strategy's beta, variant, eta_max, phi2_rate and gamma; an
    injected estimator needs no Algorithm 1 (no oracle capability, prepare a no-op) and is the one asked."""
    from fedent.meanfield.estimator import OnlinePhi2Estimator
    from fedent.strategies.base import StrategyError

    trainer, indices, w = _setup()
    for cap in (None, 1e-3):  # uncapped, the variant shows (paper and exact differ); capped, the cap does
        opts = FedEntOptions(beta=0.9, variant="paper", eta_max=cap, phi2_rate="used", gamma=0.5)
        strategy = FedEnt(opts)
        probes = [strategy.probe(trainer, w, _task(c, 1, indices), ClientState()) for c in (2, 4)]
        payload = strategy.round_payload(1, w, probes)
        total = sum(p.num_samples for p in probes)
        ref = OnlinePhi2Estimator(0.9, "paper", eta_max=cap, phi2_rate="used", gamma=0.5).estimate(
            1, norm_sq(w), [p.num_samples / total for p in probes], [p.scalars["a"] for p in probes],
            [p.scalars["b"] for p in probes], cids=[2, 4], eta_prev=[LR, LR])
        assert payload.round == 1 and payload.scalars["phi2_next"] == ref.phi2_next
        for c in (2, 4):  # each client's η* is Prop. 1's with the strategy's variant and cap
            s = strategy.fit(trainer, w, payload, _task(c, 1, indices), ClientState()).scalars
            assert s["eta_star"] == solve_eta(s["a"], s["b"], s["c"], s["theta"], s["phi2_next"], 0.9, "paper",
                                              eta_max=cap).eta_star[0]
    assert FedEnt().prepare(TrainerOracle(trainer, indices, SEED, 8), w, [10] * N_CLIENTS, rounds=2) == {}

    class Fixed(OnlinePhi2Estimator):
        def estimate(self, *args, **kw):  # type: ignore[no-untyped-def]
            return dataclasses.replace(super().estimate(*args, **kw), phi2_next=0.5)

    injected = FedEnt(FedEntOptions(estimator="offline"), estimator=Fixed(0.9))
    assert not injected.capabilities.oracle and FedEnt(FedEntOptions(estimator="offline")).capabilities.oracle
    assert injected.prepare(TrainerOracle(trainer, indices, SEED, 8), w, [10] * N_CLIENTS, rounds=2) == {}
    assert injected.round_payload(0, w, probes).scalars["phi2_next"] == 0.5
    with pytest.raises(StrategyError, match=r"^fedent: the offline estimator needs prepare\(\) \(Algorithm 1\) before "
                                            r"round 0$"):
        FedEnt(FedEntOptions(estimator="offline")).round_payload(0, w, probes)


def test_one_sample_is_enough_and_a_fit_after_its_probe_computes_no_gradient() -> None:
    from fedent.strategies.base import Probe, RoundPayload

    trainer, indices, w = _setup()
    strategy = FedEnt()
    one = strategy.round_payload(0, w, [Probe(3, 1, {"a": 0.1, "b": 1.0, "eta_prev": LR})])
    assert one.scalars["total_samples"] == 1.0
    task = _task(3, 0, indices)
    up = strategy.fit(trainer, w, RoundPayload(0, scalars={"phi2_next": 1.0, "c": 1.0, "total_samples": 1.0}), task,
                      ClientState())
    assert up.scalars["theta"] == 22.0  # D_i / ΣD with ΣD = 1 as the payload says
    offline = FedEnt(FedEntOptions(estimator="offline", offline_clients="population", phi2_rate="star",
                                   max_sweeps=1))
    report = offline.prepare(TrainerOracle(trainer, indices, SEED, 8), w, [1, 0, 0, 0, 0, 0], rounds=1)
    assert report["gradient_evaluations"] == 1 and len(report["phi2"]) == 2  # only the client with a sample
    calls: list[int] = []
    real = trainer.gradient

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kw)

    trainer.gradient = counted  # type: ignore[method-assign]
    state = ClientState()
    probe = strategy.probe(trainer, w, task, state)
    assert len(calls) == 1
    strategy.fit(trainer, w, strategy.round_payload(0, w, [probe]), task, state)
    assert len(calls) == 1  # the probe's (a, b) were kept in the client's state


def _plans(strategy: FedEnt, rnd: int = 0) -> tuple[list[float], list[float], dict]:  # type: ignore[type-arg]
    """(rates trained with, own η_i(t) logged, the round's fedent record) of one round of clients 0..5."""
    trainer, indices, w = _setup()
    cids = list(range(N_CLIENTS))
    states = {c: ClientState() for c in cids}
    tasks = {c: _task(c, rnd, indices) for c in cids}
    probes = [strategy.probe(trainer, w, tasks[c], states[c]) for c in cids]
    payload = strategy.round_payload(rnd, w, probes)
    fits = [strategy.plan_fit(trainer, w, payload, tasks[c], states[c]) for c in cids]
    updates = [strategy.fit(trainer, w, payload, tasks[c], ClientState(dict(states[c].scalars))) for c in cids]
    record = strategy.aggregate(rnd, w, updates).diagnostics["fedent"]
    return [f.lr for f in fits], [u.scalars["eta"] for u in updates], record


def test_shuffled_rates_are_a_seeded_permutation_of_the_rounds_own_rates() -> None:
    opts = {"gamma": 0.0, "eta_max": None}  # η_i(t) = η*_i, uncapped: rates differ from client to client
    trained, own, record = _plans(FedEnt(FedEntOptions(rates="shuffled", shuffle_seed=3, **opts)))
    _, plain, plain_record = _plans(FedEnt(FedEntOptions(**opts)))
    assert own == plain and len(set(own)) > 2  # the logged η_i(t) are FedEnt's own
    assert sorted(trained) == pytest.approx(sorted(own)) and trained != own  # same multiset, moved
    assert record["rates"] == "shuffled" and "rates" not in plain_record
    assert record["trained_rates"] == {str(c): pytest.approx(r) for c, r in enumerate(trained)}
    again, _, _ = _plans(FedEnt(FedEntOptions(rates="shuffled", shuffle_seed=3, **opts)))
    other, _, _ = _plans(FedEnt(FedEntOptions(rates="shuffled", shuffle_seed=4, **opts)))
    assert again == trained and other != trained


def test_fixed_rates_train_at_the_base_rate_and_still_log_eta() -> None:
    trained, own, record = _plans(FedEnt(FedEntOptions(rates="fixed", gamma=0.0)))
    assert trained == [LR] * N_CLIENTS and any(e != LR for e in own)
    assert record["rates"] == "fixed" and "trained_rates" not in record
    adaptive, _, _ = _plans(FedEnt(FedEntOptions(gamma=0.0)))
    assert adaptive == pytest.approx(own)


def test_a_shuffled_payload_without_the_clients_rate_is_an_error() -> None:
    from fedent.strategies.base import RoundPayload, StrategyError

    trainer, indices, w = _setup()
    strategy = FedEnt(FedEntOptions(rates="shuffled"))
    state = ClientState()
    probe = strategy.probe(trainer, w, _task(0, 0, indices), state)
    payload = strategy.round_payload(0, w, [probe])
    assert set(payload.per_client) == {0}
    bare = RoundPayload(round=0, scalars=payload.scalars)
    with pytest.raises(StrategyError, match="no rate for client 0"):
        strategy.plan_fit(trainer, w, bare, _task(0, 0, indices), state)


def test_rate_controls_stay_out_of_the_config_at_their_default() -> None:
    assert "rates" not in FedEntOptions().to_dict() and "shuffle_seed" not in FedEntOptions().to_dict()
    assert FedEntOptions(rates="fixed").to_dict()["rates"] == "fixed"
    assert AlgorithmConfig.from_mapping({"name": "fedent", "rates": "shuffled"}).options.rates == "shuffled"
    with pytest.raises(ConfigError, match="algorithm.rates"):
        AlgorithmConfig.from_mapping({"name": "fedent", "rates": "random"})
