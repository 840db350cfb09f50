"""The simulator on tiny learnable inputs: run dir contents, learning, determinism, client state, hooks."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from sim_support import tiny_config, tiny_inputs
from torch import Tensor

from fedent import runlog
from fedent.model_file import load_model_file
from fedent.params import clone
from fedent.rng import sample_clients
from fedent.rounds import is_eval_round
from fedent.sim.progress import ProgressBar, format_duration
from fedent.sim.simulator import SimulationError, run_simulation
from fedent.strategies.base import (
    AggregateResult,
    Capabilities,
    ClientState,
    ClientTask,
    ClientUpdate,
    PayloadSpec,
    Probe,
    RoundPayload,
    train_generator,
    weighted_average,
)
from fedent.strategies.fedavg import FedAvg
from fedent.trainer import LocalTrainer


def test_run_dir_is_complete_and_accuracy_improves(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=4, lr=0.1)
    res = run_simulation(cfg, tmp_path / "run", progress=False, inputs=tiny_inputs(), local_eval=2)
    paths = runlog.RunPaths(tmp_path / "run")
    for p in (paths.config, paths.partition, paths.metrics, paths.status, paths.clients, paths.model):
        assert p.is_file(), p
    assert sorted(x.name for x in paths.plots.iterdir()) == ["accuracy.png", "local_acc.png", "test_loss.png",
                                                              "train_loss.png"]
    recs = runlog.read_metrics(paths.metrics)
    assert [r["round"] for r in recs] == [1, 2, 3, 4]  # 1..R (fedent.runlog)
    for r in recs:
        assert list(r) == list(runlog.METRIC_KEYS)
        assert r["algorithm"] == "fedavg" and r["fedent"] is None
        assert r["clients"] == sample_clients(0, r["round"] - 1, 10, 0.3) and r["num_clients"] == 3
        assert r["wall_s"] > 0 and r["elapsed_s"] >= r["wall_s"]
        assert len(r["diagnostics"]["local_acc"]) == 2
        assert 0.0 <= r["test_acc"] <= 1.0 and r["train_loss"] > 0
    assert recs[-1]["test_acc"] >= recs[0]["test_acc"] + 0.15, [r["test_acc"] for r in recs]
    assert res.final_acc == recs[-1]["test_acc"] and res.final_acc > 0.8
    status = json.loads(paths.status.read_text())
    assert status["phase"] == "done" and status["round"] == 4 and status["rounds"] == 4
    assert yaml.safe_load(paths.config.read_text())["train"]["rounds"] == 4
    saved = load_model_file(paths.model).params
    assert all(torch.equal(a, b) for a, b in zip(saved, res.params, strict=True))
    rows = runlog.read_clients(paths.clients)
    taken = [c for r in recs for c in r["clients"]]
    assert [row["participation"] for row in rows] == [taken.count(c) for c in range(10)]


def test_same_seed_same_model_and_other_algorithm_same_participants(tmp_path: Path) -> None:
    a = run_simulation(tiny_config(rounds=3), tmp_path / "a", progress=False, inputs=tiny_inputs(), plots=False)
    b = run_simulation(tiny_config(rounds=3), tmp_path / "b", progress=False, inputs=tiny_inputs(), plots=False)
    assert all(torch.equal(x, y) for x, y in zip(a.params, b.params, strict=True))
    c = run_simulation(tiny_config("fedprox", rounds=3), tmp_path / "c", progress=False, inputs=tiny_inputs(),
                       plots=False)
    assert [r["clients"] for r in c.records] == [r["clients"] for r in a.records]
    assert not all(torch.equal(x, y) for x, y in zip(a.params, c.params, strict=True))
    d = run_simulation(tiny_config(rounds=3, seed=5), tmp_path / "d", progress=False, inputs=tiny_inputs(),
                       plots=False)
    assert [r["clients"] for r in d.records] != [r["clients"] for r in a.records]


class CountingStrategy(FedAvg):
    """FedAvg that counts visits in client state and checks the probe -> payload -> fit wiring."""

    name = "counting"
    needs_probe = True
    # what its probe and update carry: the engine rejects anything else, in the simulator as in the cluster
    payload_spec = PayloadSpec(probe_scalars=("visits_before",), update_scalars=("eta", "eta_star"))

    def __init__(self) -> None:
        super().__init__()
        self.payload_probes: list[list[int]] = []
        self.setup_sizes: list[int] = []

    def setup(self, global_params: Sequence[Tensor], client_sizes: Sequence[int]) -> None:
        self.setup_sizes = list(client_sizes)

    def probe(self, trainer: LocalTrainer, global_params: Sequence[Tensor], task: ClientTask,
              state: ClientState) -> Probe:
        return Probe(task.cid, task.num_samples, {"visits_before": state.scalars.get("visits", 0.0)})

    def round_payload(self, rnd: int, global_params: Sequence[Tensor], probes: Sequence[Probe]) -> RoundPayload:
        self.payload_probes.append([p.cid for p in probes])
        return RoundPayload(rnd, scalars={"tag": float(rnd)})

    def fit(self, trainer: LocalTrainer, global_params: Sequence[Tensor], payload: RoundPayload, task: ClientTask,
            state: ClientState) -> ClientUpdate:
        assert payload.scalars["tag"] == task.round
        state.scalars["visits"] = state.scalars.get("visits", 0.0) + 1
        state.scalars["last"] = float(task.round)
        trainer.load(global_params)
        res = trainer.train(task.indices, task.lr, task.epochs, train_generator(task))
        return ClientUpdate(task.cid, clone(trainer.params), task.num_samples, res.loss,
                            scalars={"eta": state.scalars["visits"], "eta_star": state.scalars["last"]})


def test_client_state_persists_across_skipped_rounds(tmp_path: Path) -> None:
    strat = CountingStrategy()
    inputs = tiny_inputs()
    res = run_simulation(tiny_config(rounds=6, fraction=0.2), tmp_path / "r", progress=False, inputs=inputs,
                         strategy=strat, plots=False)
    assert strat.setup_sizes == inputs.client_sizes()
    assert strat.payload_probes == [r["clients"] for r in res.records]
    rows = {row["cid"]: row for row in runlog.read_clients(runlog.RunPaths(tmp_path / "r").clients)}
    skipped_then_back = 0
    for cid in range(10):
        rounds_in = [r["round"] for r in res.records if cid in r["clients"]]
        if not rounds_in:
            assert rows[cid]["eta"] is None
            continue
        assert rows[cid]["eta"] == len(rounds_in)  # the count survived the rounds the client sat out
        assert rows[cid]["eta_star"] == rounds_in[-1] - 1  # the task's loop index; logged rounds count from 1
        skipped_then_back += any(b - a > 1 for a, b in zip(rounds_in, rounds_in[1:], strict=False))
    assert skipped_then_back > 0  # the seed actually exercises a gap


def test_fedent_eta_state_persists(tmp_path: Path) -> None:
    res = run_simulation(tiny_config("fedent", rounds=4, fraction=0.2), tmp_path / "f", progress=False,
                         inputs=tiny_inputs(), plots=False)
    gamma = 0.99
    last_eta: dict[int, float] = {}
    for r in res.records:
        fd = r["fedent"]
        assert fd is not None and {"phi2_pred", "phi2_actual", "entropy", "clients"} <= set(fd)
        for row in fd["clients"]:
            prev = last_eta.get(row["client"], 0.05)  # eta(-1) is the base lr
            assert row["eta"] == pytest.approx(gamma * prev + (1 - gamma) * row["eta_star"], rel=1e-9, abs=1e-12)
            last_eta[row["client"]] = row["eta"]
    assert runlog.RunPaths(tmp_path / "f").estimator.is_file()


class PreparingFedAvg(FedAvg):
    """Declares the oracle capability, so the engine calls ``prepare`` before round 0 (by capability, not name)."""

    name = "preparing"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(oracle=True)

    def prepare(self, oracle: Any, global_params: Sequence[Tensor], client_sizes: Sequence[int],
                rounds: int) -> dict[str, Any]:
        g = oracle.gradient(0, 1, global_params)
        return {"rounds": rounds, "clients": len(client_sizes), "grad_tensors": len(g)}


def test_prepare_hook_report_goes_to_estimator_json(tmp_path: Path) -> None:
    run_simulation(tiny_config(rounds=2), tmp_path / "p", progress=False, inputs=tiny_inputs(),
                   strategy=PreparingFedAvg(), plots=False)
    est = json.loads(runlog.RunPaths(tmp_path / "p").estimator.read_text())
    assert est["report"] == {"rounds": 2, "clients": 10, "grad_tensors": 4}


def test_eval_every_and_last_round(tmp_path: Path) -> None:
    res = run_simulation(tiny_config(rounds=5, eval_every=2), tmp_path / "e", progress=False,
                         inputs=tiny_inputs(), plots=False)
    assert [r["test_acc"] is not None for r in res.records] == [False, True, False, True, True]
    assert [is_eval_round(t, 5, 2) for t in range(5)] == [False, True, False, True, True]


class ExplodingFedAvg(FedAvg):
    name = "exploding"

    def aggregate(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]) -> AggregateResult:
        params = weighted_average(updates)
        if rnd == 1:
            params[0] = params[0] * float("nan")
        return AggregateResult(params)


def test_divergence_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(SimulationError, match="not finite after round 2"):
        run_simulation(tiny_config(rounds=3), tmp_path / "x", progress=False, inputs=tiny_inputs(),
                       strategy=ExplodingFedAvg(), plots=False)
    paths = runlog.RunPaths(tmp_path / "x")
    status = json.loads(paths.status.read_text())
    assert status["phase"] == "failed" and "not finite" in status["state"]["error"]
    assert [r["round"] for r in runlog.read_metrics(paths.metrics)] == [1]


def test_partition_size_mismatch_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SimulationError, match="partition has 5 clients"):
        run_simulation(tiny_config(), tmp_path / "m", progress=False, inputs=tiny_inputs(num_clients=5))


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_only_on_a_tty() -> None:
    quiet, lines = io.StringIO(), io.StringIO()
    bar = ProgressBar(4, stream=quiet, lines=lines)
    bar.update(1, 0.5)
    bar.update(2, None)
    bar.close()
    assert quiet.getvalue() == ""  # no bar, no control characters where there is no terminal...
    got = lines.getvalue().splitlines()  # ...but one plain line per round
    assert [g.split(" elapsed")[0] for g in got] == ["round 1/4 acc 0.5000", "round 2/4 acc -"], got
    assert "\x1b" not in lines.getvalue() and "\r" not in lines.getvalue()
    labelled = io.StringIO()
    ProgressBar(4, label="run 1/2 fedavg s0", stream=FakeTTY(), lines=labelled).update(1, 0.5)
    assert labelled.getvalue().startswith("run 1/2 fedavg s0: round 1/4 acc 0.5000 elapsed ")
    silent = io.StringIO()
    ProgressBar(4, stream=quiet, lines=silent, enabled=False).update(1, 0.5)  # --no-progress
    assert silent.getvalue() == ""
    tty_lines = FakeTTY()
    ProgressBar(4, stream=FakeTTY(), lines=tty_lines, bar=False).update(1, 0.5)  # parallel runs on a terminal
    assert tty_lines.getvalue() == ""
    tty = FakeTTY()
    bar = ProgressBar(4, label="fedavg", stream=tty, lines=FakeTTY())
    bar.update(2, 0.75)
    bar.close()
    assert "round 2/4" in tty.getvalue() and "acc 0.7500" in tty.getvalue() and tty.getvalue().endswith("\n")
    assert ProgressBar(4, stream=tty, lines=FakeTTY()).line(2, None, 10.0).endswith("ETA 10s")
    assert format_duration(3725) == "1h02m" and format_duration(65) == "1m05s"


def test_fedent_offline_runs_algorithm_1_first(tmp_path: Path) -> None:
    from fedent.config import config_from_dict

    raw = tiny_config(rounds=2).to_dict()
    raw["algorithm"] = {"name": "fedent", "estimator": "offline", "max_sweeps": 3}
    res = run_simulation(config_from_dict(raw), tmp_path / "o", progress=False, inputs=tiny_inputs(), plots=False)
    est = json.loads(runlog.RunPaths(tmp_path / "o").estimator.read_text())
    assert len(est["report"]["phi2"]) >= 2 and est["report"]
    assert [t["round"] for t in est["trajectory"]] == [1, 2]
    for rec, traj in zip(res.records, est["trajectory"], strict=True):
        assert rec["fedent"]["phi2_pred"] == traj["phi2_pred"]


def test_refuses_to_append_to_an_existing_run(tmp_path: Path) -> None:
    run_simulation(tiny_config(rounds=1), tmp_path / "r", progress=False, inputs=tiny_inputs(), plots=False)
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    with pytest.raises(SimulationError, match="already holds a simulator run"):
        run_simulation(tiny_config(rounds=1), tmp_path / "r", progress=False, inputs=tiny_inputs(), plots=False)
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before


def test_refuses_a_cluster_run_that_has_not_logged_a_round_yet(tmp_path: Path) -> None:
    """Only metrics.jsonl was checked: a cluster run killed before its first round was written into."""
    from rundirs import cluster_run_dir, digest

    cfg = tiny_config(rounds=1)
    cluster_run_dir(tmp_path / "r", cfg, rounds_logged=0, checkpoints=())
    before = digest(tmp_path / "r")
    with pytest.raises(SimulationError, match="already holds a cluster run"):
        run_simulation(cfg, tmp_path / "r", progress=False, inputs=tiny_inputs(), plots=False)
    assert digest(tmp_path / "r") == before


def test_federated_evaluation_is_the_sample_weighted_mean_of_the_clients_splits(tmp_path: Path) -> None:
    """With central data every test sample is in exactly one client's split, so the federated mean equals the
    server-side accuracy; the records say which mode measured it."""
    import dataclasses

    inputs = tiny_inputs()
    server = run_simulation(tiny_config("fedavg", rounds=2), tmp_path / "server", progress=False, inputs=inputs,
                            plots=False)
    cfg = tiny_config("fedavg", rounds=2)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, evaluation="federated"))
    fed = run_simulation(cfg, tmp_path / "fed", progress=False, inputs=inputs, plots=False)
    assert fed.records[-1]["test_acc"] == pytest.approx(server.records[-1]["test_acc"], abs=1e-12)
    assert fed.records[-1]["test_loss"] == pytest.approx(server.records[-1]["test_loss"], rel=1e-5)
    n_test = int(inputs.data.y_test.shape[0])
    assert fed.records[-1]["diagnostics"]["evaluation"] == {"mode": "federated", "samples": n_test,
                                                            "clients": inputs.num_clients}
    assert server.records[-1]["diagnostics"]["evaluation"] == {"mode": "server", "samples": n_test}
    assert runlog.read_json(tmp_path / "fed" / "status.json")["state"]["evaluation"] == "federated"


def test_worker_local_placement_is_refused_by_the_simulator(tmp_path: Path) -> None:
    import dataclasses

    cfg = tiny_config("fedavg")
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, placement="workers"))
    with pytest.raises(SimulationError, match="data.placement: workers"):
        run_simulation(cfg, tmp_path / "run", progress=False, plots=False)
