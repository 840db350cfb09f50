"""FedAvg: sample-weighted averaging by hand, deterministic local training, no aliasing of inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedent.params import clone
from fedent.strategies.base import ClientState, ClientTask, ClientUpdate, RoundPayload, StrategyError
from fedent.strategies.fedavg import FedAvg
from fedent.trainer import LocalTrainer


def _trainer(n: int = 24, seed: int = 0) -> LocalTrainer:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 2, 2, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    return LocalTrainer(model, x, y, batch_size=5, device=torch.device("cpu"))


def _update(cid: int, values: list[float], n: int) -> ClientUpdate:
    return ClientUpdate(cid, [torch.tensor(values)], n, 0.0)


def test_aggregate_is_sample_weighted_mean() -> None:
    ups = [_update(0, [1.0, 2.0], 1), _update(1, [3.0, -2.0], 3)]
    out = FedAvg().aggregate(0, [torch.zeros(2)], ups).params
    # θ = (1/4, 3/4): 0.25*[1,2] + 0.75*[3,-2] = [2.5, -1.0]
    assert torch.allclose(out[0], torch.tensor([2.5, -1.0]))


def test_aggregate_rejects_empty_and_sampleless_updates() -> None:
    with pytest.raises(StrategyError):
        FedAvg().aggregate(0, [torch.zeros(2)], [])
    with pytest.raises(StrategyError):
        FedAvg().aggregate(0, [torch.zeros(2)], [_update(0, [1.0, 1.0], 0)])


def test_fit_is_deterministic_and_leaves_global_untouched() -> None:
    trainer = _trainer()
    w0 = clone(trainer.params)
    task = ClientTask(cid=1, round=0, indices=torch.arange(12), lr=0.1, epochs=2, seed=7)
    a = FedAvg().fit(trainer, w0, RoundPayload(0), task, ClientState())
    b = FedAvg().fit(trainer, w0, RoundPayload(0), task, ClientState())
    assert all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.params, w0, strict=True))  # it trained
    fresh = _trainer()
    assert all(torch.equal(p, q) for p, q in zip(w0, fresh.params, strict=True))  # w0 not mutated
    assert a.num_samples == 12 and a.cid == 1
    # the upload is a copy: further training of the shared model object must not change it
    snapshot = clone(a.params)
    FedAvg().fit(
        trainer, w0, RoundPayload(0), ClientTask(2, 0, torch.arange(12, 24), 0.1, 1, 7), ClientState()
    )
    assert all(torch.equal(p, q) for p, q in zip(a.params, snapshot, strict=True))


def test_fit_batch_order_depends_on_client_and_round() -> None:
    trainer = _trainer()
    w0 = clone(trainer.params)
    idx = torch.arange(20)
    a = FedAvg().fit(trainer, w0, RoundPayload(0), ClientTask(0, 0, idx, 0.1, 1, 7), ClientState())
    b = FedAvg().fit(trainer, w0, RoundPayload(0), ClientTask(0, 1, idx, 0.1, 1, 7), ClientState())
    assert not all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))


def _fedent_then_replay(tmp_path, mode: str):  # type: ignore[no-untyped-def]
    from sim_support import tiny_config, tiny_inputs

    from fedent.config import config_from_dict
    from fedent.sim.simulator import run_simulation

    inputs = tiny_inputs()
    ent_cfg = tiny_config("fedent", rounds=3)
    ent = run_simulation(ent_cfg, tmp_path / "ent", progress=False, inputs=inputs, plots=False)
    raw = ent_cfg.to_dict()
    raw["algorithm"] = {"name": "fedavg", "replay_rates": str(tmp_path / "ent" / "metrics.jsonl"), "replay": mode}
    rep = run_simulation(config_from_dict(raw), tmp_path / "rep", progress=False, inputs=inputs, plots=False)
    plain = run_simulation(tiny_config("fedavg", rounds=3), tmp_path / "avg", progress=False, inputs=inputs,
                           plots=False)
    return ent, rep, plain


def test_per_client_replay_retraces_the_fedent_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """FedEnt's client step is SGD at η_i(t), its aggregation the θ-mean: FedAvg on its logged per-client rates
    (same seed: same clients and batches) reproduces its model; plain FedAvg does not."""
    ent, rep, plain = _fedent_then_replay(tmp_path, "per_client")
    for a, b in zip(ent.params, rep.params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not all(torch.allclose(a, b) for a, b in zip(ent.params, plain.params, strict=True))


def test_round_mean_replay_uses_the_rounds_mean_rate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fedent.strategies.base import ClientState, ClientTask, RoundPayload
    from fedent.strategies.fedavg import round_means
    from fedent.strategies.options import FedAvgOptions

    ent, rep, _ = _fedent_then_replay(tmp_path, "round_mean")
    means = round_means(tmp_path / "ent" / "metrics.jsonl")
    rec = ent.records[1]["fedent"]["clients"]
    assert means[1] == pytest.approx(sum(c["theta"] * c["eta"] for c in rec))
    s = FedAvg(FedAvgOptions(replay_rates=str(tmp_path / "ent" / "metrics.jsonl"), replay="round_mean"))
    task = ClientTask(cid=9, round=1, indices=torch.arange(3), lr=0.05, epochs=1, seed=0)
    assert s.plan_fit(None, [], RoundPayload(1), task, ClientState()).lr == means[1]  # type: ignore[arg-type]
    assert not all(torch.allclose(a, b) for a, b in zip(ent.params, rep.params, strict=True))


def test_replay_of_a_missing_client_or_log_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fedent.strategies.base import ClientState, ClientTask, RoundPayload, StrategyError
    from fedent.strategies.options import FedAvgOptions

    log = tmp_path / "m.jsonl"
    log.write_text('{"round": 0, "fedent": {"clients": [{"client": 2, "theta": 1.0, "eta": 0.3}]}}\n')
    s = FedAvg(FedAvgOptions(replay_rates=str(log)))
    task = ClientTask(cid=2, round=0, indices=torch.arange(3), lr=0.05, epochs=1, seed=0)
    assert s.plan_fit(None, [], RoundPayload(0), task, ClientState()).lr == 0.3  # type: ignore[arg-type]
    with pytest.raises(StrategyError, match="client 5 in round 1"):
        s.plan_fit(None, [], RoundPayload(0), ClientTask(5, 0, torch.arange(3), 0.05, 1, 0),  # type: ignore[arg-type]
                   ClientState())
    empty = tmp_path / "e.jsonl"
    empty.write_text('{"round": 0}\n')
    with pytest.raises(StrategyError, match="no FedEnt"):
        FedAvg(FedAvgOptions(replay_rates=str(empty))).plan_fit(None, [], RoundPayload(0), task,  # type: ignore[arg-type]
                                                               ClientState())
