"""Each ``train.perf`` lever keeps the model of the default run on the CPU, within its stated tolerance.

Tolerances (max |difference| of the final model's parameters after 3 rounds of a small CNN, lr 0.05):
cudnn_benchmark 0 (a CUDA flag: nothing changes on the CPU); channels_last 1e-5 (another kernel order);
compile 1e-4 (inductor fuses and reorders float32 sums); eval_batched: the same accuracy and the loss to 1e-6;
bf16 autocast: 3e-2, and the final accuracy within 0.1 (forward passes round to 8 mantissa bits; the float32
master weights keep the updates from drifting further).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sim_support import tiny_config, tiny_inputs
from torch import nn

from fedent.config import ConfigError, PerfOptions, config_from_dict
from fedent.inputs import RunInputs
from fedent.perf import LEVERS, evaluate_batched, levers_named
from fedent.rounds.evaluation import evaluate_shards
from fedent.sim.simulator import SimResult, run_simulation
from fedent.trainer import LocalTrainer


def conv_inputs() -> RunInputs:
    base = tiny_inputs(num_clients=6, per_client=24)

    def make_model() -> nn.Module:
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 4))

    return dataclasses.replace(base, make_model=make_model)


def run(tmp_path: Path, name: str, executor: str = "sequential", conv: str = "direct", **perf: Any) -> SimResult:
    raw = tiny_config(rounds=3, fraction=0.5, executor=executor, evaluation="federated").to_dict()
    raw["data"]["num_clients"] = 6
    raw["train"]["conv"] = conv
    raw["train"]["perf"] = perf
    return run_simulation(config_from_dict(raw), tmp_path / name, progress=False, inputs=conv_inputs(), plots=False)


def worst(a: SimResult, b: SimResult) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.params, b.params, strict=True))


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimResult]:
    tmp = tmp_path_factory.mktemp("perf")
    return {ex: run(tmp, f"default-{ex}", ex) for ex in ("sequential", "vectorised")}


@pytest.mark.parametrize("executor", ["sequential", "vectorised"])
def test_cudnn_benchmark_changes_nothing_on_the_cpu(default: dict[str, SimResult], tmp_path: Path,
                                                    executor: str) -> None:
    try:
        got = run(tmp_path, "b", executor, cudnn_benchmark=True)
    finally:
        torch.backends.cudnn.benchmark = False
    assert worst(got, default[executor]) == 0.0


@pytest.mark.parametrize("executor", ["sequential", "vectorised"])
def test_channels_last_within_1e_5(default: dict[str, SimResult], tmp_path: Path, executor: str) -> None:
    got = run(tmp_path, "cl", executor, channels_last=True)
    assert worst(got, default[executor]) <= 1e-5
    assert [r["test_acc"] for r in got.records] == [r["test_acc"] for r in default[executor].records]


@pytest.mark.parametrize("executor", ["sequential", "vectorised"])
def test_bf16_autocast_within_3e_2_and_accuracy_within_0_1(default: dict[str, SimResult], tmp_path: Path,
                                                           executor: str) -> None:
    got = run(tmp_path, "bf", executor, autocast="bf16")
    diff = worst(got, default[executor])
    assert 0.0 < diff <= 3e-2  # not exact (so it really ran in bf16), but close
    assert got.final_acc == pytest.approx(default[executor].final_acc, abs=0.1)
    assert all(p.dtype == torch.float32 for p in got.params)  # float32 master weights


@pytest.mark.parametrize("conv", ["unfold", "looped"])
def test_bf16_autocast_trains_through_the_other_convolution_forms(default: dict[str, SimResult], tmp_path: Path,
                                                                  conv: str) -> None:
    """The vectorised trainer's unfold/looped copy of the model autocasts too, and trains its own modules (the
    copy once ran the original's forward, whose parameters functional_call never set: the model never moved)."""
    got = run(tmp_path, f"bf-{conv}", "vectorised", conv, autocast="bf16")
    start = list(conv_inputs().make_model().parameters())
    moved = max(float((p - q).abs().max()) for p, q in zip(got.params, start, strict=True))
    assert moved > 0.05 and 0.0 < worst(got, default["vectorised"]) <= 3e-2


@pytest.mark.slow  # inductor compiles C++ for the CPU (tens of seconds)
def test_compile_of_the_vectorised_step_within_1e_4(default: dict[str, SimResult], tmp_path: Path) -> None:
    got = run(tmp_path, "co", "vectorised", compile=True)
    assert worst(got, default["vectorised"]) <= 1e-4


def test_eval_batched_gives_each_clients_evaluation(default: dict[str, SimResult], tmp_path: Path) -> None:
    got = run(tmp_path, "eb", "sequential", eval_batched=True)
    assert worst(got, default["sequential"]) == 0.0
    for a, b in zip(got.records, default["sequential"].records, strict=True):
        assert a["test_acc"] == b["test_acc"] and a["test_loss"] == pytest.approx(b["test_loss"], abs=1e-6)


def test_evaluate_batched_equals_per_client_passes_including_empty_splits() -> None:
    inp = conv_inputs()
    tr = LocalTrainer(inp.make_model(), inp.data.x_train, inp.data.y_train, 8, torch.device("cpu"))
    x, y = inp.data.x_test, inp.data.y_test
    shards = {0: np.arange(0, 30), 1: np.arange(30, 31), 2: np.zeros(0, np.int64), 3: np.arange(31, 100)}
    want = evaluate_shards(tr, x, y, shards, [0, 1, 2, 3, 4], tr.params, 16)
    got = evaluate_batched(tr, x, y, shards, [0, 1, 2, 3, 4], tr.params, 16)
    assert [(g.cid, g.num_samples, g.accuracy) for g in got.values()] == [
        (w.cid, w.num_samples, w.accuracy) for w in want.values()]
    assert [g.loss for g in got.values()] == pytest.approx([w.loss for w in want.values()], abs=1e-6)


def test_bad_perf_options_name_their_key() -> None:
    raw = tiny_config().to_dict()
    raw["train"]["perf"] = {"autocast": "fp8"}
    with pytest.raises(ConfigError, match=r"train\.perf\.autocast: must be one of off, bf16"):
        config_from_dict(raw)
    raw["train"]["perf"] = {"channel_last": True}
    with pytest.raises(ConfigError, match=r"train\.perf: unknown key\(s\) channel_last \(did you mean channels_last"):
        config_from_dict(raw)


def test_lever_names_turn_on_exactly_their_option_and_an_unknown_name_is_refused() -> None:
    """The benchmarks' ``--perf`` names (bench_simulator, profile_step): each lever alone sets one option, ``none``
    and blanks set none, and a misspelt lever is an error naming the known ones."""
    off = PerfOptions()
    assert levers_named(["none", " ", ""]) == off
    changed = {name: {k for k, v in dataclasses.asdict(levers_named([name])).items() if v != getattr(off, k)}
               for name in LEVERS}
    assert changed == {"cudnn_benchmark": {"cudnn_benchmark"}, "channels_last": {"channels_last"},
                       "autocast_bf16": {"autocast"}, "compile": {"compile"}, "eval_batched": {"eval_batched"}}
    assert levers_named(["autocast_bf16"]).autocast == "bf16"
    assert levers_named(list(LEVERS)) == PerfOptions(cudnn_benchmark=True, channels_last=True, autocast="bf16",
                                                     compile=True, eval_batched=True)
    with pytest.raises(ValueError, match="unknown lever channel_last; known: cudnn_benchmark, channels_last"):
        levers_named(["channel_last"])
