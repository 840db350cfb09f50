"""Robust aggregation and bounded trust (fedent.rounds.robust): the rules on hand-made updates, then whole
simulator runs under attack: a 20% ×(−10) scale attack ruins plain averaging and the median keeps the clean
run's accuracy; an attacker that reports 10^12 samples and uploads zeros takes nothing over by default."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sim_support import tiny_config, tiny_inputs

from fedent.config import RobustConfig, config_from_dict
from fedent.rounds import robust
from fedent.rounds.adversary import attackers
from fedent.rounds.evaluation import ClientEval
from fedent.runlog import read_json
from fedent.sim.simulator import run_simulation
from fedent.strategies.base import ClientUpdate

W = [torch.zeros(3), torch.zeros(2)]


def up(cid: int, fill: float | list[float], n: int = 10, **tensors: list[torch.Tensor]) -> ClientUpdate:
    vals = fill if isinstance(fill, list) else [fill] * 5
    return ClientUpdate(cid, [torch.tensor(vals[:3]), torch.tensor(vals[3:])], n, 0.1, tensors=dict(tensors))


# ---- the weight cap -------------------------------------------------------------------------------------------
def test_capped_shares_water_fill_and_keep_the_others_proportional() -> None:
    assert robust.capped_shares([1, 1, 2], None) == [0.25, 0.25, 0.5]
    got = robust.capped_shares([100, 1, 1, 2], 0.4)
    assert got[0] == pytest.approx(0.4)
    assert got[1:] == pytest.approx([0.15, 0.15, 0.3])  # the rest shared 1:1:2
    assert robust.capped_shares([1000, 1, 1], 0.25) == [1 / 3] * 3  # m·cap < 1: uniform
    # a second client pushed over the cap by the first one's excess is capped too
    got = robust.capped_shares([100, 50, 1, 1, 1, 1], 0.3)
    assert got[:2] == pytest.approx([0.3, 0.3]) and got[2:] == pytest.approx([0.1] * 4)


def test_cap_counts_leave_uncapped_rounds_alone_and_keep_honest_counts_exact() -> None:
    assert robust.cap_counts([10, 20, 30, 40], 0.5) is None
    assert robust.cap_counts([10, 20, 30, 40], None) is None
    got = robust.cap_counts([10**12, 600, 600, 600, 600], 0.25)
    assert got is not None and got[1:] == [600] * 4
    assert got[0] / sum(got) == pytest.approx(0.25, abs=1e-3)
    assert robust.cap_counts([10**12, 600], 0.25) == [600, 600]  # m·cap < 1: uniform, at the smallest count


# ---- the rules --------------------------------------------------------------------------------------------------
def test_coordinatewise_median_and_trimmed_mean() -> None:
    x = torch.tensor([[1.0, -5.0], [2.0, 0.0], [100.0, 1.0], [3.0, 2.0]])
    assert robust.coordinatewise(x, "median", 0.0).tolist() == [2.5, 0.5]  # mean of the two middle values
    assert robust.coordinatewise(x[:3], "median", 0.0).tolist() == [2.0, 0.0]
    assert robust.coordinatewise(x, "trimmed-mean", 0.25).tolist() == [2.5, 0.5]
    assert robust.coordinatewise(x, "trimmed-mean", 0.0).tolist() == pytest.approx([26.5, -0.5])


def test_krum_keeps_the_update_closest_to_its_neighbours() -> None:
    honest = [[torch.tensor([v, 1.0])] for v in (1.0, 1.1, 1.15, 1.2, 1.4)]
    bad = [[torch.tensor([-10.0, -10.0])], [torch.tensor([9.0, -3.0])]]
    # f = 2 of 7: each score sums the 3 nearest squared distances; 1.1's (0.0225) is the lowest
    assert robust.krum_select(honest + bad, None, None, multi=False) == [1]
    assert robust.krum_select(honest + bad, 2, None, multi=True) == [0, 1, 2, 3, 4]
    assert robust.krum_select(honest + bad, 2, 2, multi=True) == [1, 2]


def test_clip_delta_bounds_the_norm_only_when_above() -> None:
    d = [torch.tensor([3.0, 4.0])]
    got, was = robust.clip_delta(d, 1.0)
    assert was and got[0].tolist() == pytest.approx([0.6, 0.8])
    same, was = robust.clip_delta(d, 10.0)
    assert not was and same is d


def test_apply_median_substitutes_one_model_and_one_tensor_group_for_everyone() -> None:
    cfg = RobustConfig(aggregator="median", max_weight_share=None)
    ups = [up(c, float(c), dc=[torch.full((3,), 10.0 * c), torch.full((2,), 1.0)]) for c in range(5)]
    ups[4] = up(4, 1e6, dc=[torch.full((3,), -1e6), torch.full((2,), 1.0)])
    got, diag = robust.apply(cfg, W, ups)
    assert [u.cid for u in got] == [0, 1, 2, 3, 4]
    assert all(u.params[0].tolist() == [2.0] * 3 and u.params[1].tolist() == [2.0] * 2 for u in got)
    assert all(u.tensors["dc"][0].tolist() == [10.0] * 3 for u in got)
    assert diag == {"robust": {"rule": "median"}}
    assert ups[4].params[0].tolist() == [1e6] * 3  # the originals are untouched


def test_apply_krum_drops_and_clip_bounds_the_delta() -> None:
    ups = [up(c, v) for c, v in enumerate((1.0, 1.1, 1.15, 1.2, 1.4))] + [up(5, -50.0)]
    got, diag = robust.apply(RobustConfig(aggregator="krum", max_weight_share=None), W, ups)
    assert [u.cid for u in got] == [1] and diag["robust"]["kept"] == [1]
    got, diag = robust.apply(RobustConfig(aggregator="multi-krum", max_weight_share=None), W, ups)
    assert diag["robust"]["kept"] == [0, 1, 2, 3, 4]  # m − f = 5 of 6 (f = 1)
    got, diag = robust.apply(RobustConfig(clip_norm=1.0, max_weight_share=None), W, [up(0, 0.1), up(1, 3.0)])
    assert diag == {"robust": {"clipped": [1]}}
    assert got[0].params[0].tolist() == pytest.approx([0.1] * 3)
    assert math.sqrt(sum(float(p.square().sum()) for p in got[1].params)) == pytest.approx(1.0)


def test_apply_mean_passes_the_updates_through_and_caps_an_inflated_count() -> None:
    ups = [up(c, 1.0, n=10) for c in range(4)]
    got, diag = robust.apply(RobustConfig(), W, ups)
    assert diag == {} and all(a is b for a, b in zip(got, ups, strict=True))
    ups.append(up(9, 0.0, n=10**12))
    got, diag = robust.apply(RobustConfig(), W, ups)
    assert diag == {"robust": {"capped_weights": [9]}}
    assert [u.num_samples for u in got][:4] == [10] * 4 and got[4].num_samples / sum(u.num_samples for u in got) \
        == pytest.approx(0.25, abs=0.02)


def test_reports_and_evaluations_out_of_bounds_are_rejected_with_a_reason() -> None:
    assert robust.report_problem(3, 600, 100, 10**8) is None
    assert robust.report_problem(3, 10**12, 100, 10**8) == \
        "rejected: client 3: reported sample count 1000000000000 is outside [1, 100000000]"
    assert "test count -1" in str(robust.report_problem(3, 600, -1, 10**8))
    assert robust.check_reports([600, 10**12, 5], [1, 2, 10**9], RobustConfig()) == {
        1: "rejected: client 1: reported sample count 1000000000000 is outside [1, 100000000]",
        2: "rejected: client 2: reported test count 1000000000 is outside [0, 100000000]"}
    assert robust.eval_problem(2, ClientEval(2, 50, 0.3, 0.9), 100) is None
    assert "accuracy 1.5" in str(robust.eval_problem(2, ClientEval(2, 50, 0.3, 1.5), 100))
    assert "loss -1.0" in str(robust.eval_problem(2, ClientEval(2, 50, -1.0, 0.5), 100))
    assert "test count 101" in str(robust.eval_problem(2, ClientEval(2, 101, 0.3, 0.5), 100))
    assert "of client 1 gathered for client 2" in str(robust.eval_problem(2, ClientEval(1, 5, 0.3, 0.5), 100))


# ---- whole runs under attack ---------------------------------------------------------------------------------------
def attacked(attack: str, aggregator: str = "mean", rounds: int = 6, **adversary: Any) -> Any:
    raw = tiny_config("fedavg", rounds=rounds, fraction=1.0).to_dict()
    raw["adversary"] = {"attack": attack, "fraction": 0.2, **adversary}
    raw["robust"] = {"aggregator": aggregator}
    return config_from_dict(raw)


def iid_inputs() -> Any:
    """The tiny problem cut IID (the coordinate-wise median is biased on 2-class shards; docs/security.md)."""
    inputs = tiny_inputs(10)
    perm = np.random.default_rng(0).permutation(400)
    return dataclasses.replace(inputs, client_indices=tuple(np.sort(p) for p in np.array_split(perm, 10)))


def test_a_scale_attack_ruins_the_mean_and_the_median_keeps_the_clean_accuracy(tmp_path: Path) -> None:
    inputs = iid_inputs()
    assert attackers(0, 10, 0.2) == [0, 6]

    def acc(name: str, cfg: Any) -> float:
        got = run_simulation(cfg, tmp_path / name, progress=False, inputs=inputs, plots=False).final_acc
        assert got is not None
        return float(got)

    clean = acc("clean", attacked("none", rounds=5))
    ruined = acc("mean", attacked("scale", rounds=5, scale=-10.0))
    defended = acc("median", attacked("scale", "median", rounds=5, scale=-10.0))
    assert clean > 0.9
    assert ruined < 0.5
    assert defended > clean - 0.03


def test_an_inflated_count_with_a_zero_model_takes_nothing_over(tmp_path: Path) -> None:
    """Clients 0 and 6 report 10^12 samples and upload zeros: out of bounds, they are rejected (clients.json says
    why) and the run ends with a model near the clean run's; one that reports just under the bound is capped."""
    inputs = iid_inputs()
    clean = run_simulation(attacked("none", rounds=4), tmp_path / "clean", progress=False, inputs=inputs,
                           plots=False)
    big = run_simulation(attacked("inflate-count", rounds=4), tmp_path / "big", progress=False, inputs=inputs,
                         plots=False)
    rows = {r["cid"]: r for r in read_json(tmp_path / "big" / "clients.json")["clients"]}
    assert rows[0]["state"] == "rejected" and "sample count 1000000000000 is outside" in rows[0]["last_failure"]
    assert rows[6]["participation"] == 0 and rows[1]["participation"] == 4
    assert big.final_acc is not None and clean.final_acc is not None
    assert big.final_acc > clean.final_acc - 0.05
    under = run_simulation(attacked("inflate-count", rounds=4, inflated_count=10**8), tmp_path / "under",
                           progress=False, inputs=inputs, plots=False)
    assert under.records[0]["diagnostics"]["robust"] == {"capped_weights": [0, 6]}
    # two capped clients still hold half of every mean (a coalition gets k·cap; the model shrinks each round): damaged,
    # not taken over (uncapped, the zeros would be the model: every logit equal, chance 0.25 on 4 classes) ...
    assert under.final_acc is not None and under.final_acc > 0.6
    assert all(bool(p.abs().sum() > 0) for p in under.params)
    # ... and the median, which weighs no counts, keeps the clean accuracy
    median = run_simulation(attacked("inflate-count", "median", rounds=4, inflated_count=10**8),
                            tmp_path / "median", progress=False, inputs=inputs, plots=False)
    assert median.final_acc is not None and median.final_acc > clean.final_acc - 0.05


def test_a_cap_does_not_change_a_run_where_it_does_not_bind(tmp_path: Path) -> None:
    inputs = tiny_inputs(10)
    a = run_simulation(attacked("none", rounds=2), tmp_path / "a", progress=False, inputs=inputs, plots=False)
    raw = attacked("none", rounds=2).to_dict()
    raw["robust"]["max_weight_share"] = None
    b = run_simulation(config_from_dict(raw), tmp_path / "b", progress=False, inputs=inputs, plots=False)
    assert all(torch.equal(x, y) for x, y in zip(a.params, b.params, strict=True))
    assert dataclasses.asdict(RobustConfig())["max_weight_share"] == 0.25
