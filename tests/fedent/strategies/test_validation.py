"""fedent.strategies.validation: every strategy's real probe and update pass its PayloadSpec; each kind of
violation (missing/unknown/non-finite scalar, NaN train_loss, missing/unknown/misshapen/non-finite tensor group,
bad params, lying sample count) is a one-line StrategyError."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedent.config import AlgorithmConfig
from fedent.meanfield.oracle import TrainerOracle
from fedent.params import clone
from fedent.strategies.base import ClientTask, ClientUpdate, PayloadSpec, Probe, Strategy, StrategyError
from fedent.strategies.registry import STRATEGIES, build_strategy
from fedent.strategies.validation import check_probe, check_update
from fedent.trainer import LocalTrainer

N = 4

EXPECTED_SPECS = {
    "fedavg": PayloadSpec(), "fedadam": PayloadSpec(), "fedyogi": PayloadSpec(), "fedprox": PayloadSpec(),
    "fedcos": PayloadSpec(),
    "feddyn": PayloadSpec(update_scalars=("alpha_k",)),
    "fednorm": PayloadSpec(update_scalars=("eta_star", "eta", "g_dot_delta", "b", "guarded")),
    "fedent": PayloadSpec(probe_scalars=("a", "b", "eta_prev"),
                          update_scalars=("eta_star", "eta", "eta_prev", "a", "b", "c", "theta", "phi2_next",
                                          "guarded")),
    "scaffold": PayloadSpec(update_tensors=("delta_c",)),
}


def _real(name: str) -> tuple[Strategy, list[torch.Tensor], list[Probe], list[ClientUpdate]]:
    """One round of ``name`` as the simulator runs it: real probes (if any) and real fits. Computed once per
    strategy and process (the round is seeded, so every call would give the same); each caller gets its own copy
    of the model, probes and updates, so no test sees another's changes."""
    strategy, w, probes, ups = _real_round(name)
    return strategy, copy.deepcopy(w), copy.deepcopy(probes), copy.deepcopy(ups)


@functools.cache
def _real_round(name: str) -> tuple[Strategy, list[torch.Tensor], list[Probe], list[ClientUpdate]]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 1, 2, 2, generator=g), torch.randint(0, 3, (24,), generator=g)
    torch.manual_seed(0)
    trainer = LocalTrainer(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), x, y, 4, torch.device("cpu"))
    shards = [torch.arange(c, 24, N) for c in range(N)]
    sizes = [int(s.numel()) for s in shards]
    strategy = build_strategy(AlgorithmConfig(name=name))
    w = clone(trainer.params)
    strategy.setup(w, sizes)
    strategy.prepare(TrainerOracle(trainer, shards, 0, 4), w, sizes, 1)
    states = {c: strategy.init_client_state(c, sizes[c]) for c in range(N)}
    tasks = {c: ClientTask(c, 0, shards[c], 0.05, 1, 0) for c in range(N)}
    probes = [strategy.probe(trainer, w, tasks[c], states[c]) for c in range(N)] if strategy.needs_probe else []
    payload = strategy.round_payload(0, w, probes)
    ups = [strategy.fit(trainer, w, payload, tasks[c], states[c]) for c in range(N)]
    return strategy, w, probes, ups


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_declares_what_it_sends_and_its_real_uploads_pass(name: str) -> None:
    strategy, w, probes, ups = _real(name)
    assert dataclasses.replace(strategy.payload_spec, ranges=()) == EXPECTED_SPECS[name]
    assert len(probes) == (N if strategy.capabilities.probe else 0)
    for p in probes:
        assert set(p.scalars) == set(strategy.payload_spec.probe_scalars)
        check_probe(strategy, p, 6)
    for u in ups:
        assert set(u.scalars) == set(strategy.payload_spec.update_scalars)
        assert set(u.tensors) == set(strategy.payload_spec.update_tensors)
        check_update(strategy, u, w, 6)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_update_violation_is_a_strategy_error(name: str) -> None:
    strategy, w, _, ups = _real(name)
    u = ups[0]
    spec = strategy.payload_spec

    def bad(needle: str, **changes: object) -> None:
        with pytest.raises(StrategyError, match=needle) as e:
            check_update(strategy, dataclasses.replace(u, **changes), w, 6)  # type: ignore[arg-type]
        assert "\n" not in str(e.value) and f"client {u.cid}" in str(e.value)

    bad("non-finite train_loss", train_loss=float("nan"))
    bad("non-finite train_loss", train_loss=float("inf"))
    nan = clone(u.params)
    nan[0].view(-1)[0] = float("nan")
    bad("not finite", params=nan)
    bad("expected", params=[w[0][:, :2].clone(), w[1].clone()])
    bad("expected", params=u.params[:1])
    bad("samples, expected 6", num_samples=7)
    bad("unknown scalars \\['rogue'\\]", scalars={**u.scalars, "rogue": 1.0})
    bad("unknown tensor groups \\['rogue'\\]", tensors={**u.tensors, "rogue": clone(w)})
    for k in spec.update_scalars:
        bad(f"lacks scalars \\['{k}'\\]", scalars={s: v for s, v in u.scalars.items() if s != k})
        bad(f"non-finite scalars \\['{k}'\\]", scalars={**u.scalars, k: float("nan")})
    for k in spec.update_tensors:
        bad(f"lacks tensor groups \\['{k}'\\]", tensors={t: v for t, v in u.tensors.items() if t != k})
        group = clone(u.tensors[k])
        group[-1].view(-1)[-1] = float("nan")
        bad(f"'{k}' is not finite", tensors={**u.tensors, k: group})
        bad(f"'{k}'.*expected", tensors={**u.tensors, k: group[:1]})
        bad(f"'{k}'.*expected", tensors={**u.tensors, k: [t.double() for t in u.tensors[k]]})


def test_scaffold_nan_delta_c_with_finite_params_is_rejected() -> None:
    """The issue's case: finite parameters, NaN only in Δc (it used to reach the server's c)."""
    strategy, w, _, ups = _real("scaffold")
    u = ups[1]
    dc = clone(u.tensors["delta_c"])
    dc[0].view(-1)[0] = float("nan")
    with pytest.raises(StrategyError, match="'delta_c' is not finite"):
        check_update(strategy, dataclasses.replace(u, tensors={"delta_c": dc}), w)


def test_probe_violations_are_strategy_errors() -> None:
    strategy, _, probes, _ = _real("fedent")
    p = probes[0]

    def bad(needle: str, **changes: object) -> None:
        with pytest.raises(StrategyError, match=needle):
            check_probe(strategy, dataclasses.replace(p, **changes), 6)  # type: ignore[arg-type]

    bad("lacks scalars \\['a'\\]", scalars={"b": 1.0, "eta_prev": 0.01})
    bad("lacks scalars \\['a', 'b', 'eta_prev'\\]", scalars={})
    bad("lacks scalars \\['eta_prev'\\]", scalars={"a": 0.1, "b": 1.0})  # η_i(t−1), for phi2_rate used
    bad("unknown scalars \\['z'\\]", scalars={**p.scalars, "z": 0.0})
    bad("non-finite scalars \\['b'\\]", scalars={**p.scalars, "b": float("inf")})
    bad("samples, expected 6", num_samples=60)
    fedavg, _, _, _ = _real("fedavg")
    with pytest.raises(StrategyError, match="no probe step"):
        check_probe(fedavg, p)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_declared_scalar_has_a_range_its_real_uploads_keep(name: str) -> None:
    strategy, _, probes, ups = _real(name)
    spec = strategy.payload_spec
    declared = set(spec.probe_scalars) | set(spec.update_scalars)
    assert {n for n, _, _ in spec.ranges} == declared
    assert all(lo < hi for _, lo, hi in spec.ranges)
    for values in [p.scalars for p in probes] + [u.scalars for u in ups]:
        for k, v in values.items():
            lo, hi = spec.range_of(k) or (None, None)
            assert lo is not None and hi is not None and lo <= v <= hi, (k, v)


def test_a_finite_but_absurd_scalar_is_out_of_range() -> None:
    strategy, w, probes, ups = _real("fedent")
    bad = Probe(probes[0].cid, probes[0].num_samples, {**probes[0].scalars, "eta_prev": -1e300})
    with pytest.raises(StrategyError, match=r"probe of client 0: scalar eta_prev=-1e\+300 is outside its range "
                                            r"\[0, 1e\+06\]"):
        check_probe(strategy, bad, probes[0].num_samples)
    up = dataclasses.replace(ups[1], scalars={**ups[1].scalars, "guarded": 7.0})
    with pytest.raises(StrategyError, match=r"scalar guarded=7 is outside its range \[0, 1\]"):
        check_update(strategy, up, w, up.num_samples)


# ---- secure aggregation: a masked upload (one uint64 ring vector instead of the clear model) -----------------


def _masked(name: str) -> tuple[Strategy, list[torch.Tensor], ClientUpdate]:
    """A real update of ``name`` turned into what a secure-aggregation client sends: no clear model or groups, one
    uint64 vector of the model's length times (1 + the strategy's tensor groups); sample count, loss, scalars clear."""
    strategy, w, _, ups = _real(name)
    u = ups[0]
    size = sum(p.numel() for p in w) * (1 + len(strategy.payload_spec.update_tensors))
    vec = np.arange(size, dtype=np.uint64)
    return strategy, w, dataclasses.replace(u, params=[], tensors={}, masked=vec)


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_a_masked_update_of_the_right_length_passes(name: str) -> None:
    strategy, w, u = _masked(name)
    check_update(strategy, u, w, u.num_samples)
    check_update(strategy, u, w)


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_every_masked_update_violation_is_a_strategy_error(name: str) -> None:
    strategy, w, u = _masked(name)
    want = u.masked.size
    clear = "a masked update must not carry a clear model or tensor groups"

    def bad(needle: str, **changes: object) -> None:
        with pytest.raises(StrategyError, match=needle) as e:
            check_update(strategy, dataclasses.replace(u, **changes), w, u.num_samples)  # type: ignore[arg-type]
        assert "\n" not in str(e.value) and str(e.value).startswith(f"update of client {u.cid}")

    bad(clear, params=clone(w))
    bad(clear, tensors={"delta_c": clone(w)})
    bad(clear, params=clone(w), tensors={"delta_c": clone(w)})
    bad(rf"the masked vector is uint64 \({want - 1},\), expected uint64 \({want},\)", masked=u.masked[:-1])
    bad(rf"the masked vector is uint64 \({want + 1},\), expected uint64 \({want},\)",
        masked=np.zeros(want + 1, dtype=np.uint64))
    bad(rf"the masked vector is int64 \({want},\), expected uint64 \({want},\)", masked=u.masked.astype(np.int64))
    bad(rf"the masked vector is uint64 \(1, {want}\), expected uint64 \({want},\)", masked=u.masked[None, :])
    bad(rf"the masked vector is list, expected uint64 \({want},\)", masked=u.masked.tolist())
    # what stays in the clear is still checked: the sample count, the loss, the scalars
    bad("samples, expected", num_samples=u.num_samples + 1)
    bad("non-finite train_loss", train_loss=float("nan"))
    bad(r"unknown scalars \['rogue'\]", scalars={**u.scalars, "rogue": 1.0})


def test_a_masked_fedent_update_still_has_its_scalars_checked() -> None:
    strategy, w, u = _masked("fedent")
    check_update(strategy, u, w, u.num_samples)
    with pytest.raises(StrategyError, match=r"lacks scalars \['eta'\]"):
        check_update(strategy, dataclasses.replace(u, scalars={k: v for k, v in u.scalars.items() if k != "eta"}), w)
    with pytest.raises(StrategyError, match=r"scalar guarded=7 is outside its range"):
        check_update(strategy, dataclasses.replace(u, scalars={**u.scalars, "guarded": 7.0}), w)


@pytest.mark.parametrize("name", ["fedent", "fednorm", "feddyn"])
def test_a_scalar_at_either_end_of_its_range_is_inside_it(name: str) -> None:
    """Both ends of a declared range are allowed (PayloadSpec: ``[lo, hi]``, both included); just past one is not."""
    strategy, w, probes, ups = _real(name)
    spec = strategy.payload_spec
    for k in spec.update_scalars:
        lo, hi = spec.range_of(k) or (None, None)
        assert lo is not None and hi is not None
        for v in (lo, hi):
            check_update(strategy, dataclasses.replace(ups[0], scalars={**ups[0].scalars, k: v}), w, 6)
        for v in (math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)):
            if math.isfinite(v):
                with pytest.raises(StrategyError, match=f"scalar {k}=.* is outside its range"):
                    check_update(strategy, dataclasses.replace(ups[0], scalars={**ups[0].scalars, k: v}), w, 6)
    for k in spec.probe_scalars:
        lo, hi = spec.range_of(k) or (None, None)
        assert lo is not None and hi is not None
        for v in (lo, hi):
            check_probe(strategy, dataclasses.replace(probes[0], scalars={**probes[0].scalars, k: v}), 6)


def test_a_missing_and_an_unknown_name_are_both_named_in_one_line() -> None:
    strategy, w, probes, ups = _real("fedent")
    scalars = {k: v for k, v in probes[0].scalars.items() if k != "a"} | {"z": 0.0}
    with pytest.raises(StrategyError) as e:
        check_probe(strategy, dataclasses.replace(probes[0], scalars=scalars), 6)
    assert str(e.value) == "probe of client 0 lacks scalars ['a'] and has unknown scalars ['z']"
    strategy, w, _, ups = _real("scaffold")
    with pytest.raises(StrategyError) as e:
        check_update(strategy, dataclasses.replace(ups[2], tensors={"rogue": clone(w)}), w, 6)
    assert str(e.value) == "update of client 2 lacks tensor groups ['delta_c'] and has unknown tensor groups ['rogue']"


def test_without_an_expected_sample_count_any_count_passes() -> None:
    strategy, w, probes, ups = _real("fedent")
    check_probe(strategy, dataclasses.replace(probes[1], num_samples=1234))
    check_update(strategy, dataclasses.replace(ups[1], num_samples=1234), w)
