"""The remote executor (server.remote) against the in-process ones, over real gRPC on loopback (port 0) with
in-thread workers: each worker runs the core's ``ClientHost`` for its clients, sequential or vectorised, and
the engine alone decides what it accepts. So a cluster equals the simulator of the same executor for every
registered strategy, and a plug-in whose clients upload NaN models finishes alike in every world, with the
same rejections recorded."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_inthread_workers, tiny_config, tiny_inputs
from nan_plugin import POISONED

from fedent.config import DPMode, ExperimentConfig, PrivacyConfig, config_from_dict
from fedent.inputs import RunInputs
from fedent.model_file import load_model_file
from fedent.rounds import RoundPolicy
from fedent.rounds.adversary import attackers
from fedent.runlog import read_json, read_metrics
from fedent.sim.simulator import run_simulation
from fedent.strategies.registry import STRATEGIES

EXECUTORS = ("sequential", "vectorised")


def _cluster(start: Any, cfg: ExperimentConfig, inputs: RunInputs, executor: str) -> Path:
    """A run on two in-thread workers hosting clients 0-4 and 5-9 with ``--executor executor``."""
    h = start(cfg, inputs)
    workers = run_inthread_workers(h, inputs, [tuple(range(5)), tuple(range(5, 10))], 90, executor=executor)
    assert h.run.error is None, h.run.error
    assert all(w.host is not None and w.host.kind == executor for w in workers)
    return Path(h.run_dir)


def _same_model(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("algorithm", sorted(STRATEGIES))
def test_workers_of_either_executor_equal_that_simulator(start: Any, tmp_path: Path, algorithm: str,
                                                         executor: str) -> None:
    cfg = tiny_config(algorithm, num_clients=10, rounds=2, executor=executor)
    inputs = tiny_inputs(10)
    run_dir = _cluster(start, cfg, inputs, executor)
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    _same_model(load_model_file(run_dir / "model_final.pt").params, sim.params)
    assert [r["clients"] for r in read_metrics(run_dir / "metrics.jsonl")] == [r["clients"] for r in sim.records]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_nan_uploads_are_rejected_alike_in_the_simulator_and_the_cluster(start: Any, tmp_path: Path,
                                                                          executor: str) -> None:
    """Clients 1, 4, 7 of the plug-in upload NaN models; under the cluster's default policy (quorum 0.5, a
    round that misses it is skipped) both worlds leave them out, skip the same rounds and end finite."""
    cfg = tiny_config("nan_plugin:NaNFedAvg", num_clients=10, rounds=4, executor=executor)
    inputs = tiny_inputs(10)
    run_dir = _cluster(start, cfg, inputs, executor)
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False,
                         policy=RoundPolicy(quorum=0.5, retries=-1))
    got = load_model_file(run_dir / "model_final.pt").params
    assert all(bool(torch.isfinite(p).all()) for p in got)
    _same_model(got, sim.params)
    recs = read_metrics(run_dir / "metrics.jsonl")
    failed = [r["diagnostics"].get("failed_clients", {}) for r in recs]
    assert failed == [r["diagnostics"].get("failed_clients", {}) for r in sim.records]
    assert [("skipped" in r["diagnostics"]) for r in recs] == [("skipped" in r["diagnostics"]) for r in sim.records]
    rejected = {int(c): why for f in failed for c, why in f.items()}
    assert rejected and set(rejected) <= POISONED, "the test must see rejections"
    assert all(why == f"rejected: update of client {c} is not finite (NaN/inf)" for c, why in rejected.items())
    for where in (run_dir, tmp_path / "sim"):
        rows = {r["cid"]: r for r in read_json(where / "clients.json")["clients"]}
        assert all(rows[c]["participation"] == 0 and "is not finite" in rows[c]["last_failure"] for c in rejected)


@pytest.mark.parametrize(("attack", "aggregator"), [("scale", "median"), ("label-flip", "mean")])
def test_a_cluster_under_attack_equals_the_simulator(start: Any, tmp_path: Path, attack: str,
                                                     aggregator: str) -> None:
    """20% attackers (chosen from the seed) on the two workers: the workers hosting them attack, the
    engine's robust rule runs alike, and the models agree as the clean ones do."""
    raw = tiny_config("fedavg", num_clients=10, rounds=2, fraction=1.0).to_dict()
    raw["adversary"] = {"attack": attack, "fraction": 0.2, "scale": -10.0}
    raw["robust"] = {"aggregator": aggregator}
    cfg = config_from_dict(raw)
    inputs = tiny_inputs(10)
    run_dir = _cluster(start, cfg, inputs, "sequential")
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    _same_model(load_model_file(run_dir / "model_final.pt").params, sim.params)
    clean = run_simulation(tiny_config("fedavg", num_clients=10, rounds=2, fraction=1.0), tmp_path / "clean",
                           progress=False, inputs=inputs, plots=False)
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(sim.params, clean.params, strict=True))
    recs = read_metrics(run_dir / "metrics.jsonl")
    assert [r["diagnostics"].get("robust") for r in recs] == [r["diagnostics"].get("robust") for r in sim.records]


def test_alie_in_a_cluster_equals_the_simulator_when_one_worker_hosts_the_coalition(start: Any,
                                                                                    tmp_path: Path) -> None:
    """ALIE's coalition is the attackers one host fits in a round (fedent.rounds.adversary). Attackers 6 and 8 on
    one worker: the cluster uploads what the simulator does (1e-5), a model unlike the clean one. Split over two
    workers, each is a coalition of one (σ = 0) and uploads its honest update: the clean run's model."""
    raw = tiny_config("fedavg", num_clients=10, rounds=2, fraction=1.0).to_dict()
    raw["adversary"] = {"attack": "alie", "fraction": 0.2, "z": 3.0}
    cfg = config_from_dict(raw)
    inputs = tiny_inputs(10)
    assert attackers(cfg.train.seed, 10, 0.2) == [6, 8]
    together = _cluster(start, cfg, inputs, "sequential")  # workers of 0-4 and 5-9
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    _same_model(load_model_file(together / "model_final.pt").params, sim.params)
    clean = run_simulation(tiny_config("fedavg", num_clients=10, rounds=2, fraction=1.0), tmp_path / "clean",
                           progress=False, inputs=inputs, plots=False)
    assert max(float((a - b).abs().max()) for a, b in zip(sim.params, clean.params, strict=True)) > 1e-3
    h = start(cfg, inputs)
    run_inthread_workers(h, inputs, [(0, 1, 2, 3, 6), (4, 5, 7, 8, 9)], 90)
    assert h.run.error is None, h.run.error
    _same_model(load_model_file(Path(h.run_dir) / "model_final.pt").params, clean.params)


def test_nan_uploads_end_the_simulation_under_its_default_policy(tmp_path: Path) -> None:
    """The simulator's default needs every participant accepted: the run fails, naming the diverged client,
    in the words fedent.experiments.reproduce reads as a settled, diverged run."""
    from fedent.experiments.reproduce import diverged
    from fedent.rounds import RunError

    cfg = tiny_config("nan_plugin:NaNFedAvg", num_clients=10, rounds=4)
    with pytest.raises(RunError, match=r"local model of client\(s\) \[[147]\] is not finite"):
        run_simulation(cfg, tmp_path / "sim", progress=False, inputs=tiny_inputs(10), plots=False)
    assert diverged(tmp_path / "sim") is not None


@pytest.mark.parametrize(("dp", "executor"), [("central", "sequential"), ("local", "sequential"),
                                               ("local", "vectorised")])
def test_a_cluster_under_differential_privacy_equals_the_simulator(start: Any, tmp_path: Path, dp: DPMode,
                                                                   executor: str) -> None:
    """Central noise is drawn in the engine from (seed, round), DP-SGD's on each worker from the client's own
    generator (a vectorised worker's too): the same model (1e-5) and the same logged ε in both worlds, and the
    noise is really there."""
    plain = tiny_config("fedavg", num_clients=10, rounds=2, executor=executor)
    cfg = dataclasses.replace(plain, privacy=PrivacyConfig(dp=dp, noise_multiplier=1.0, clip_norm=0.5))
    inputs = tiny_inputs(10)
    run_dir = _cluster(start, cfg, inputs, executor)
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    _same_model(load_model_file(run_dir / "model_final.pt").params, sim.params)
    cluster = read_metrics(run_dir / "metrics.jsonl")
    assert [r["privacy"]["epsilon"] for r in cluster] == [r["privacy"]["epsilon"] for r in sim.records]
    assert cluster[-1]["privacy"]["dp"] == dp and cluster[-1]["privacy"]["epsilon"] > 0
    without = run_simulation(plain, tmp_path / "plain", progress=False, inputs=inputs, plots=False)
    assert max(float((a - b).abs().max()) for a, b in zip(sim.params, without.params, strict=True)) > 1e-2


@pytest.mark.parametrize(("algorithm", "executor"), [("fedavg", "sequential"), ("scaffold", "vectorised")])
def test_secure_aggregation_runs_over_the_work_stream_and_equals_the_secure_simulator(
        start: Any, tmp_path: Path, algorithm: str, executor: str) -> None:
    """The protocol's steps travel as secagg tasks between clients on two workers (keys and sealed shares routed
    by the aggregator), the fits upload masked vectors, and the model is the secure simulator's (the same
    fixed-point rounding) and the plain simulator's within the resolution."""
    import dataclasses

    from fedent.config import PrivacyConfig

    plain_cfg = tiny_config(algorithm, num_clients=10, rounds=2, executor=executor)
    cfg = dataclasses.replace(plain_cfg, privacy=PrivacyConfig(secure_aggregation=True, secagg_degree=2))
    inputs = tiny_inputs(10)
    run_dir = _cluster(start, cfg, inputs, executor)
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    plain = run_simulation(plain_cfg, tmp_path / "plain", progress=False, inputs=inputs, plots=False)
    cluster_model = load_model_file(run_dir / "model_final.pt").params
    _same_model(cluster_model, sim.params)
    num = sum(float((a - b).norm() ** 2) for a, b in zip(cluster_model, plain.params, strict=True)) ** 0.5
    assert 0 < num / sum(float(b.norm() ** 2) for b in plain.params) ** 0.5 <= 1e-4
    clients = read_json(run_dir / "clients.json")["clients"]
    assert sum(c["participation"] for c in clients) == sum(r["num_clients"] for r in sim.records)


def _wider(inputs: RunInputs) -> RunInputs:
    """The tiny problem with a 2.6k-parameter model: a delta's zlib framing is small beside it."""
    from torch import nn

    def make_model() -> nn.Module:
        gen = torch.Generator().manual_seed(3)
        m = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 3))
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        return m

    return dataclasses.replace(inputs, make_model=make_model)


@pytest.mark.parametrize("wire", ["native", "float16"])
def test_delta_downloads_give_the_same_model_in_fewer_bytes(start: Any, tmp_path: Path, wire: str) -> None:
    """``--download-encoding delta`` against ``full`` on the same run (every client every round, federated
    evaluation, so a worker holds w(t) itself after evaluating it): the final model is bit-identical, every model
    download after the first round is a delta, and the round's bytes_down counts the delta's bytes."""
    cfg = tiny_config("fedavg", num_clients=4, rounds=3, fraction=1.0, evaluation="federated")
    inputs = _wider(tiny_inputs(4))
    runs = {}
    for enc in ("full", "delta"):
        h = start(cfg, inputs, download_encoding=enc, wire_dtype=wire)
        run_inthread_workers(h, inputs, [(0, 1), (2, 3)], 90)
        assert h.run.error is None, h.run.error
        runs[enc] = Path(h.run_dir)
    models = {k: load_model_file(d / "model_final.pt").params for k, d in runs.items()}
    assert all(torch.equal(a, b) for a, b in zip(models["full"], models["delta"], strict=True))
    full = [r["diagnostics"]["transfer"] for r in read_metrics(runs["full"] / "metrics.jsonl")]
    delta = [r["diagnostics"]["transfer"] for r in read_metrics(runs["delta"] / "metrics.jsonl")]
    assert "downloads_delta" not in full[0]
    assert (delta[0]["downloads_full"], delta[0]["downloads_delta"]) == (2, 2)  # w(0) whole; w(1) from it
    assert all((t["downloads_full"], t["downloads_delta"]) == (0, 4) for t in delta[1:])
    assert [t["bytes_up"] for t in delta] == [t["bytes_up"] for t in full]
    assert 0 < delta[0]["bytes_down"] < full[0]["bytes_down"]
    # later rounds: w(t) from the w(t) evaluated last round (an all-zero XOR), then w(t+1) from w(t)
    assert all(0 < d["bytes_down"] < 0.6 * f["bytes_down"] for d, f in zip(delta[1:], full[1:], strict=True))


def test_a_lying_aggregator_is_refused_by_the_workers_clients(start: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The consistency check over the work stream: an aggregator that shows the odd clients a U3 without client 9
    (as if it had dropped) and forwards every signature gets no share back from either worker; the round is
    skipped with the clients' refusal."""
    from fedent.secagg.protocol import ServerSession, pack

    honest = ServerSession.consistency_requests

    def split(self: ServerSession, survivors: list[int]) -> dict[int, bytes]:
        reqs = honest(self, survivors)
        self.pki = None  # skip its own signature checks
        lie = pack({"step": "consistency", "survivors": self.u3[:-1]})
        return {c: lie if c % 2 else r for c, r in reqs.items() if c != self.u3[-1]}

    monkeypatch.setattr(ServerSession, "consistency_requests", split)
    cfg = dataclasses.replace(tiny_config("fedavg", num_clients=10, rounds=1, fraction=1.0),
                              privacy=PrivacyConfig(secure_aggregation=True))
    inputs = tiny_inputs(10)
    h = start(cfg, inputs)
    run_inthread_workers(h, inputs, [tuple(range(5)), tuple(range(5, 10))], 90)
    assert h.run.error is None  # the cluster's policy skips a round that cannot be unmasked
    skipped = read_metrics(Path(h.run_dir) / "metrics.jsonl")[0]["diagnostics"]["skipped"]
    assert skipped.startswith("secure aggregation could not unmask the sum: secagg: cannot remove client 0's self "
                              "mask: 0 share(s)")  # not one share of anyone came back
    assert "9 client(s) refused" in skipped and "signature on U3 is not valid" in skipped
