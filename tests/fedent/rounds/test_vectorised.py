"""The vectorised executor against the sequential one: same batches, same rates, same models (1e-5).

Clients hold different sample counts (so some are masked for the last steps) and batches that do not divide
them (short last batches); the model has a convolution, so ``vmap``'s batched conv is exercised. Every
registered strategy runs whole simulations under both executors. The same checks run on CUDA when present
(tools/device_check.sh runs them on a lent GPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch import nn
from vectorised_support import DEVICES, TOL, config, conv_model, max_diff, uneven_inputs

from fedent.config import ConfigError, config_from_dict
from fedent.inputs import RunInputs
from fedent.rounds.host import ClientHost, ClientTraining
from fedent.rounds.vectorised import VectorisedHost, make_host
from fedent.runlog import read_json
from fedent.sim.simulator import run_simulation
from fedent.strategies.base import (
    AggregateResult,
    ClientState,
    ClientTask,
    ClientUpdate,
    RoundPayload,
    Strategy,
    train_generator,
    weighted_average,
)
from fedent.strategies.fedavg import FedAvg
from fedent.strategies.registry import STRATEGIES
from fedent.trainer import LocalTrainer
from fedent.vectorised_trainer import ClientRun, VectorisedTrainer

TRAINING = ClientTraining(0.05, 1, 0, 8)
def simulate(tmp: Path, algorithm: str, executor: str, device: str, **train: object) -> list[torch.Tensor]:
    res = run_simulation(config(algorithm, executor, device, **train), tmp / f"{algorithm}-{executor}",  # type: ignore[arg-type]
                         inputs=uneven_inputs(), progress=False, plots=False)
    return res.params


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", sorted(STRATEGIES))
def test_every_strategy_gives_the_sequential_model(tmp_path: Path, algorithm: str, device: str) -> None:
    seq = simulate(tmp_path, algorithm, "sequential", device)
    vec = simulate(tmp_path, algorithm, "vectorised", device)
    assert max_diff(seq, vec) <= TOL
    # and the run did train: the model moved from its initial value
    assert max_diff(vec, list(conv_model().parameters())) > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_chunks_of_any_size_give_the_same_model(tmp_path: Path, device: str) -> None:
    whole = simulate(tmp_path / "a", "scaffold", "vectorised", device)
    for k in (1, 3):
        assert max_diff(whole, simulate(tmp_path / f"k{k}", "scaffold", "vectorised", device,
                                        max_parallel_clients=k)) <= TOL


def trainer(device: str = "cpu", model: nn.Module | None = None) -> tuple[LocalTrainer, RunInputs]:
    inputs = uneven_inputs()
    tr = LocalTrainer(model or conv_model(), inputs.data.x_train, inputs.data.y_train, 8, torch.device(device))
    return tr, inputs


@pytest.mark.parametrize("device", DEVICES)
def test_each_client_takes_its_own_steps_rate_and_loss(device: str) -> None:
    """Per client: the sequential trainer's steps, mean loss and model, with different rates and sizes."""
    tr, inputs = trainer(device)
    w0 = [p.detach().clone() for p in tr.params]
    cids = [0, 1, 2, 3]  # 13, 26, 39, 52 samples: 2, 4, 5, 7 batches per epoch
    rates = [0.01, 0.2, 0.05, 0.1]
    idx = [torch.as_tensor(inputs.client_indices[c]) for c in cids]
    tasks = [ClientTask(c, 0, idx[k], rates[k], 2, 1) for k, c in enumerate(cids)]
    got = VectorisedTrainer(tr).train(w0, [ClientRun(t.indices, train_generator(t), t.lr) for t in tasks], 2)
    for t, (params, res) in zip(tasks, got, strict=True):
        tr.load(w0)
        want = tr.train(t.indices, t.lr, 2, train_generator(t))
        assert res.steps == want.steps == 2 * -(-t.num_samples // 8)
        assert res.loss == pytest.approx(want.loss, rel=1e-5)
        assert max_diff(params, list(tr.params)) <= TOL


def test_a_model_vmap_cannot_train_falls_back_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    for model, why in ((conv_model(dropout=0.5), "dropout"), (conv_model(batchnorm=True), "batch norm")):
        tr, inputs = trainer(model=model)
        ex = make_host("vectorised", tr, inputs.client_indices, TRAINING)
        assert type(ex) is ClientHost
        err = capsys.readouterr().err
        assert "vectorised executor unavailable" in err and why in err
    tr, inputs = trainer()
    assert isinstance(make_host("vectorised", tr, inputs.client_indices, TRAINING), VectorisedHost)
    # auto: vectorised on CUDA only
    assert type(make_host("auto", tr, inputs.client_indices, TRAINING)) is ClientHost


def dp_simulate(tmp: Path, algorithm: str, executor: str, **privacy: float) -> list[torch.Tensor]:
    raw = {"name": "vec-dp", "algorithm": {"name": algorithm}, "data": {"name": "synthetic", "num_clients": 8},
           "train": {"rounds": 2, "fraction": 0.5, "local_epochs": 2, "batch_size": 8, "lr": 0.05,
                     "device": "cpu", "executor": executor},
           "privacy": {"dp": "local", **privacy}}
    res = run_simulation(config_from_dict(raw), tmp / f"{algorithm}-{executor}-{len(list(tmp.glob('*')))}",
                         inputs=uneven_inputs(), progress=False, plots=False)
    assert read_json(res.run_dir / "status.json")["state"].get("executor", "sequential") == executor
    assert res.records[-1]["privacy"]["epsilon"] > 0
    return res.params


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedent"])
def test_local_dp_on_the_vectorised_executor_gives_the_sequential_model(tmp_path: Path, algorithm: str) -> None:
    """DP-SGD in both executors: the same per-sample clip, the same noise from each client's generator (clients
    of 13..52 samples: short last batches padded, masked steps that draw no noise), the same models. SCAFFOLD
    adds its correction after the noise in both; FedEnt's per-client rate (from its un-noised probe, vmapped
    here) scales the DP-SGD steps alike."""
    dp = {"noise_multiplier": 1.0, "clip_norm": 0.5}
    seq = dp_simulate(tmp_path, algorithm, "sequential", **dp)
    vec = dp_simulate(tmp_path, algorithm, "vectorised", **dp)
    assert max_diff(seq, vec) <= TOL
    # what the equality is worth: without the noise, or without the clip, the model is far from it
    assert max_diff(vec, dp_simulate(tmp_path, algorithm, "vectorised", noise_multiplier=0.0, clip_norm=0.5)) > 1e-2
    assert max_diff(vec, simulate(tmp_path, algorithm, "vectorised", "cpu", rounds=2)) > 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_a_vectorised_dp_sgd_step_clips_each_sample_and_adds_each_clients_noise(device: str) -> None:
    """Per client against ``LocalTrainer.train`` with DP-SGD: steps, loss and model, with the clip active
    (C far below the gradients' norms) and noise on; a mutant that drops either misses the sequential model.
    On CUDA the step is a captured graph whose noise buffers are refilled from the CPU every step."""
    from fedent.privacy.dpsgd import DPSGD

    tr, inputs = trainer(device)
    w0 = [p.detach().clone() for p in tr.params]
    cids, rates = [0, 1, 2, 3], [0.01, 0.2, 0.05, 0.1]
    tasks = [ClientTask(c, 0, torch.as_tensor(inputs.client_indices[c]), rates[k], 2, 1) for k, c in enumerate(cids)]

    def vectorised(dp: DPSGD) -> list[tuple[list[torch.Tensor], float, int]]:
        tr.use_dp(dp)
        got = VectorisedTrainer(tr).train(w0, [ClientRun(t.indices, train_generator(t), t.lr) for t in tasks], 2)
        return [(p, r.loss, r.steps) for p, r in got]

    def sequential(dp: DPSGD | None) -> list[tuple[list[torch.Tensor], float, int]]:
        tr.use_dp(dp)
        out = []
        for t in tasks:
            tr.load(w0)
            res = tr.train(t.indices, t.lr, 2, train_generator(t))
            out.append(([p.detach().clone() for p in tr.params], res.loss, res.steps))
        return out

    dp = DPSGD(clip_norm=0.05, noise_multiplier=2.0)
    got, want = vectorised(dp), sequential(dp)
    for (gp, gl, gs), (wp, wl, ws) in zip(got, want, strict=True):
        assert gs == ws and gl == pytest.approx(wl, rel=1e-5)
        assert max_diff(gp, wp) <= TOL
    unclipped = sequential(DPSGD(clip_norm=1e6, noise_multiplier=0.0))
    silent = sequential(DPSGD(clip_norm=0.05, noise_multiplier=0.0))
    for (gp, _, _), (sp, _, _) in zip(got, silent, strict=True):
        assert max_diff(gp, sp) > 10 * TOL  # the noise moved every client (lr 0.01: by ~1e-3)
    assert all(max_diff(a[0], b[0]) > 10 * TOL for a, b in zip(silent, unclipped, strict=True))  # the clip acts
    assert all(max_diff(a[0], b[0]) <= TOL for a, b in zip(vectorised(DPSGD(0.05, 0.0)), silent, strict=True))
    tr.use_dp(None)


def test_local_dp_runs_on_the_vectorised_host_in_chunks_its_per_sample_gradients_fit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No fallback: a vectorised host keeps local DP (the trainer trains with DP-SGD), and config accepts it. On
    the CPU a chunk's per-sample gradients (clients × batch 8 × 226 parameters × 4 bytes) stay within
    ``CPU_DP_BYTES``; without DP the CPU chunk holds every client."""
    from fedent.privacy.dpsgd import DPSGD
    from fedent.rounds import vectorised

    tr, inputs = trainer()
    w0 = list(tr.params)
    monkeypatch.setattr(vectorised, "CPU_DP_BYTES", 3 * 8 * 226 * 4 + 5)
    host = make_host("vectorised", tr, inputs.client_indices, dataclasses.replace(TRAINING, dp=DPSGD(1.0, 1.0)))
    assert isinstance(host, VectorisedHost) and tr.dp == DPSGD(1.0, 1.0)
    assert sum(p.numel() for p in w0) == 226
    assert host._chunks(range(8), w0) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    plain = make_host("vectorised", tr, inputs.client_indices, TRAINING)
    assert isinstance(plain, VectorisedHost) and plain._chunks(range(8), w0) == [list(range(8))]
    cfg = config_from_dict({"privacy": {"dp": "local"}, "train": {"executor": "vectorised"}})
    assert cfg.train.executor == "vectorised" and cfg.privacy.dp == "local"


class FitOnly(Strategy):
    """A plug-in strategy that overrides ``fit`` and defines no plan: it must still run (sequentially)."""

    name = "fitonly"

    def fit(self, trainer: LocalTrainer, global_params: Sequence[torch.Tensor], payload: RoundPayload,
            task: ClientTask, state: ClientState) -> ClientUpdate:
        trainer.load(global_params)
        res = trainer.train(task.indices, task.lr, task.epochs, train_generator(task))
        return ClientUpdate(task.cid, [p.detach().clone() for p in trainer.params], task.num_samples, res.loss)

    def aggregate(self, rnd: int, global_params: Sequence[torch.Tensor],
                  updates: Sequence[ClientUpdate]) -> AggregateResult:
        return AggregateResult(weighted_average(updates))


def test_a_strategy_without_a_plan_runs_through_its_fit() -> None:
    assert not FitOnly().plans_fit and FedAvg().plans_fit
    tr, inputs = trainer()
    ex = VectorisedHost(tr, inputs.client_indices, TRAINING)
    w0 = [p.detach().clone() for p in tr.params]
    got = ex.fit(0, [0, 1], w0, FitOnly(), RoundPayload(0))
    want = ClientHost(tr, inputs.client_indices, TRAINING).fit(0, [0, 1], w0, FedAvg(), RoundPayload(0))
    assert sorted(got.results) == [0, 1]
    assert all(max_diff(got.results[c].params, want.results[c].params) == 0.0 for c in (0, 1))


def test_bad_executor_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="train.executor"):
        config("fedavg", "parallel", "cpu")
    with pytest.raises(ConfigError, match="train.max_parallel_clients"):
        config("fedavg", "vectorised", "cpu", max_parallel_clients=0)
    with pytest.raises(ConfigError, match="train.conv: must be one of direct, unfold, looped"):
        config("fedavg", "vectorised", "cpu", conv="im2col")
    with pytest.raises(ConfigError, match="train.precision: must be one of float32, tf32"):
        config("fedavg", "vectorised", "cpu", precision="bf16")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("conv", ["unfold", "looped"])
@pytest.mark.parametrize("algorithm", ["fedavg", "feddyn", "fedent"])
def test_other_convolution_forms_train_the_same_model(tmp_path: Path, algorithm: str, conv: str,
                                                      device: str) -> None:
    """conv: unfold (im2col + batched matmul) and looped (an ordinary convolution per client) are the same
    function as vmap's grouped convolution; FedEnt's probes (one point, a batch per client) included."""
    direct = simulate(tmp_path / "d", algorithm, "vectorised", device)
    other = simulate(tmp_path / conv, algorithm, "vectorised", device, conv=conv)
    assert max_diff(direct, other) <= TOL
    assert max_diff(other, list(conv_model().parameters())) > 1e-3


def test_looped_convolutions_run_local_dp_as_the_sequential_executor() -> None:
    """Local DP's per-sample gradients nest a vmap over samples inside the one over clients: looped too."""
    from fedent.privacy.dpsgd import DPSGD

    tr, inputs = trainer()
    tr.use_dp(DPSGD(clip_norm=0.05, noise_multiplier=1.0))
    w0 = [p.detach().clone() for p in tr.params]
    tasks = [ClientTask(c, 0, torch.as_tensor(inputs.client_indices[c]), 0.1, 2, 1) for c in (0, 1, 2)]
    got = {conv: VectorisedTrainer(tr, conv).train(w0, [ClientRun(t.indices, train_generator(t), t.lr)
                                                        for t in tasks], 2) for conv in ("direct", "looped")}
    tr.use_dp(None)
    assert all(max_diff(a[0], b[0]) <= TOL for a, b in zip(got["direct"], got["looped"], strict=True))
    assert max_diff(got["looped"][0][0], w0) > 1e-3


def test_unfold_and_looped_swap_only_plain_convolutions_and_say_what_runs() -> None:
    from fedent.conv_forms import LoopedConv2d, UnfoldConv2d, swap_convs

    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 4, 3, groups=2, padding=1),
                          nn.Conv2d(4, 4, 3, padding="same"), nn.Conv2d(4, 2, 3, stride=2, dilation=2, padding=2))
    copy, swapped = swap_convs(model, UnfoldConv2d)
    assert swapped == 2 and [type(m) is UnfoldConv2d for m in copy.children()] == [True, False, False, True]
    assert all(type(m) is nn.Conv2d for m in model)  # the original is untouched
    x = torch.randn(2, 1, 9, 9)
    with torch.no_grad():
        assert float((copy(x) - model(x)).abs().max()) <= 1e-5  # stride, dilation and padding included
    looped, swapped = swap_convs(model, LoopedConv2d)
    assert swapped == 2 and [type(m) is LoopedConv2d for m in looped.children()] == [True, False, False, True]
    with torch.no_grad():
        assert float((looped(x) - model(x)).abs().max()) <= 1e-5
    tr, _ = trainer(model=nn.Sequential(nn.Flatten(), nn.Linear(16, 4)))
    assert VectorisedTrainer(tr, "unfold").conv == VectorisedTrainer(tr, "looped").conv == "direct"  # none to swap
    odd = nn.Sequential(nn.Conv2d(1, 4, 3))
    odd.forward = lambda x: x  # type: ignore[method-assign]  # replaced on the instance, with no way to redo it
    with pytest.raises(ValueError, match="cannot repeat"):
        swap_convs(odd, LoopedConv2d)
    with pytest.raises(ValueError, match="conv must be direct, unfold or looped"):
        VectorisedTrainer(tr, "fft")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a CUDA setting")
def test_precision_sets_the_tf32_flags_on_cuda() -> None:
    inputs = uneven_inputs()
    for precision, want in (("tf32", True), ("float32", False)):
        LocalTrainer(conv_model(), inputs.data.x_train, inputs.data.y_train, 8, torch.device("cuda"), precision)
        assert torch.backends.cudnn.allow_tf32 is want and torch.backends.cuda.matmul.allow_tf32 is want


@pytest.mark.parametrize("device", DEVICES)
def test_probes_in_one_pass_give_the_sequential_probes(device: str) -> None:
    """FedEnt's probe (a, b) per participant, batched, equals the one-client-at-a-time probe."""
    from fedent.strategies.fedent import FedEnt

    tr, inputs = trainer(device)
    w0 = [p.detach().clone() for p in tr.params]
    cids = [0, 1, 2, 3, 5]
    seq = ClientHost(tr, inputs.client_indices, TRAINING).probe(2, cids, w0, FedEnt())
    vec = VectorisedHost(tr, inputs.client_indices, TRAINING, max_parallel=2).probe(2, cids, w0, FedEnt())
    assert sorted(vec.results) == cids
    for c in cids:
        for k in ("a", "b"):
            assert vec.results[c].scalars[k] == pytest.approx(seq.results[c].scalars[k], rel=1e-5, abs=1e-7)
    assert len({round(seq.results[c].scalars["b"], 6) for c in cids}) == len(cids)  # the clients differ


@pytest.mark.parametrize("device", DEVICES)
def test_algorithm_1_batched_oracle_gives_the_sequential_run(tmp_path: Path, device: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline FedEnt: the vectorised executor's oracle takes a round's gradients in one pass, same result."""
    from fedent.rounds.vectorised import VectorisedOracle

    calls: list[int] = []
    real = VectorisedOracle.gradients

    def counting(self: VectorisedOracle, t: int, cids: Sequence[int], point: Sequence[torch.Tensor]) -> list:  # type: ignore[type-arg]
        calls.append(len(cids))
        return real(self, t, cids, point)

    monkeypatch.setattr(VectorisedOracle, "gradients", counting)
    out = {}
    for ex in ("sequential", "vectorised"):
        cfg = config_from_dict({
            "name": "vec", "algorithm": {"name": "fedent", "estimator": "offline", "max_sweeps": 2},
            "data": {"name": "synthetic", "num_clients": 8},
            "train": {"rounds": 3, "fraction": 0.5, "local_epochs": 1, "batch_size": 8, "lr": 0.05,
                      "device": device, "executor": ex}})
        out[ex] = run_simulation(cfg, tmp_path / ex, inputs=uneven_inputs(), progress=False, plots=False)
    assert calls and max(calls) == 4  # a round's 4 participants in one call (offline_clients: participants)
    assert max_diff(out["sequential"].params, out["vectorised"].params) <= TOL
    est = [r["fedent"]["clients"] for r in out["vectorised"].records]
    ref = [r["fedent"]["clients"] for r in out["sequential"].records]
    for a, b in zip(est, ref, strict=True):
        assert [c["eta"] for c in a] == pytest.approx([c["eta"] for c in b], rel=1e-4, abs=1e-7)
