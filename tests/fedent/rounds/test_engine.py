"""The one round loop (fedent.rounds.engine) over scripted executors: quorum, retries, skips, stop, capabilities.

The executors here wrap the real in-process one and drop or delay clients the way a remote worker would, so
the engine's policy is tested without gRPC (the cluster tests exercise the same code over real processes).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import tiny_config, tiny_inputs
from torch import Tensor

from fedent import runlog
from fedent.checkpoint import config_fingerprint
from fedent.config import PrivacyConfig
from fedent.rounds import ClientHost, ClientTraining, Gathered, InProcessExecutor, RoundEngine, RoundPolicy, RunError
from fedent.rounds.evaluation import Evaluator
from fedent.rounds.rundir import RunDirError
from fedent.strategies.base import Capabilities, ClientUpdate, RoundPayload, Strategy
from fedent.strategies.fedavg import FedAvg
from fedent.trainer import LocalTrainer


class Dropping(InProcessExecutor):
    """Clients in ``down`` never answer a fit; ``replacements`` hands out the live ones in cid order."""

    def __init__(self, *args: Any, down: set[int], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.down = set(down)
        self.asked: list[list[int]] = []
        self.finished: list[tuple[bool, str]] = []
        self.excluded: list[set[int]] = []  # the ``exclude`` of each replacements call

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        self.asked.append(list(cids))
        got = super().fit(rnd, [c for c in cids if c not in self.down], global_params, strategy, payload)
        return Gathered(got.results, {c: "deadline" for c in cids if c in self.down})

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        self.excluded.append(set(exclude))
        return sorted(c for c in self.host.hosted if c not in self.down)[:k]

    def finish(self, ok: bool, reason: str) -> None:
        self.finished.append((ok, reason))


def engine(tmp_path: Path, executor_cls: type[InProcessExecutor] = InProcessExecutor, *, rounds: int = 2,
           strategy: Strategy | None = None, policy: RoundPolicy | None = None,
           privacy: PrivacyConfig | None = None, **kw: Any) -> RoundEngine:
    cfg = tiny_config("fedavg", num_clients=4, rounds=rounds)
    if privacy is not None:
        cfg = dataclasses.replace(cfg, privacy=privacy)
    inputs = tiny_inputs()
    data = inputs.data
    tr = cfg.train
    trainer = LocalTrainer(inputs.make_model(), data.x_train, data.y_train, tr.batch_size, torch.device("cpu"))
    ex = executor_cls(ClientHost(trainer, inputs.client_indices, ClientTraining.from_config(cfg)), **kw)
    ev = Evaluator(trainer, data.x_test, data.y_test, tr.eval_batch_size, tr.seed)
    paths = runlog.create_run_dir(tmp_path / "run", exist_ok=True)
    return RoundEngine(cfg, paths, strategy or FedAvg(), ex, ev, trainer.params, inputs.client_sizes(),
                       dict(inputs.partition_info), policy)


def status(e: RoundEngine) -> dict[str, Any]:
    return json.loads(e.paths.status.read_text())


def test_a_full_quorum_run_writes_every_file(tmp_path: Path) -> None:
    e = engine(tmp_path)
    records = e.run()
    assert [r["round"] for r in records] == [1, 2] and records == runlog.read_metrics(e.paths.metrics)
    assert status(e)["phase"] == "done" and status(e)["round"] == 2  # one numbering: round 2 of 2 is the last
    # the files hold the run, not just exist: model_final.pt is the final global model, config.yaml the config
    # a state_dict (issue 27) that plain torch.load(weights_only=True) reads and the configured model loads
    final = torch.load(e.paths.model, weights_only=True)
    assert (final["format"], final["model"]) == ("fedent.model/1", e.cfg.model.name)
    assert final["config_hash"] == config_fingerprint(e.cfg)
    model = e.evaluator.trainer.model
    assert list(final["state_dict"]) == [n for n, _ in model.named_parameters()]
    model.load_state_dict(final["state_dict"])
    assert all(torch.equal(a, b) for a, b in zip(final["state_dict"].values(), e.global_params, strict=True))
    assert yaml.safe_load(e.paths.config.read_text()) == runlog.jsonable(e.cfg.to_dict())
    assert json.loads(e.paths.partition.read_text()) == runlog.jsonable(e.partition_info)
    rows = runlog.read_clients(e.paths.clients)
    assert sum(r["participation"] for r in rows) == sum(r["num_clients"] for r in records)
    assert all(r["worker"] == "simulator" for r in rows)
    assert all(r["bytes"] > 0 for r in rows if r["participation"])  # download + upload counted once each


def test_a_missed_quorum_is_retried_with_replacements(tmp_path: Path) -> None:
    e = engine(tmp_path, Dropping, policy=RoundPolicy(quorum=1.0, retries=2), down={0, 1})
    records = e.run()
    ex = e.executor
    assert isinstance(ex, Dropping)
    for rec in records:
        assert set(rec["clients"]).isdisjoint({0, 1})  # the round ran with live clients
    retried = [r for r in records if "retried" in r["diagnostics"]]
    # each retry excludes every client that failed in the round's earlier tries (read from failed_clients)
    expected = []
    for r in retried:
        failed: set[int] = set()
        for tried in r["diagnostics"]["retried"]:
            failed |= {c for c in tried["clients"] if c in {0, 1}}
            expected.append(set(failed))
    assert ex.excluded == expected and all(expected)
    assert retried and all(re.fullmatch(r"\d/\d updates accepted; client [01]: deadline.*",
                                             r["diagnostics"]["retried"][0]["why"])
                           for r in retried)


def test_retries_exhausted_fail_the_run_with_one_line(tmp_path: Path) -> None:
    e = engine(tmp_path, Dropping, policy=RoundPolicy(quorum=1.0, retries=0), down={0, 1, 2, 3})
    with pytest.raises(RunError, match="missed its quorum in 1 attempt"):
        e.run()
    st = status(e)
    assert st["phase"] == "failed" and "\n" not in st["state"]["error"]
    assert isinstance(e.executor, Dropping) and e.executor.finished == [(False, f"run failed: {st['state']['error']}")]


def test_a_skipped_round_keeps_the_model_and_the_run_goes_on(tmp_path: Path) -> None:
    e = engine(tmp_path, Dropping, policy=RoundPolicy(quorum=1.0, retries=-1), down={0, 1, 2, 3})
    w0 = [p.clone() for p in e.global_params]
    records = e.run()
    assert all("skipped" in r["diagnostics"] for r in records)
    # who failed and why, under the documented key (clients.json reads the same key)
    assert all(r["diagnostics"]["failed_clients"] == {str(c): "deadline" for c in r["clients"]} for r in records)
    rows = {r["cid"]: r for r in runlog.read_clients(e.paths.clients)}
    last = records[-1]
    assert all(rows[c]["last_failure"] == f"round {last['round']}: deadline" for c in last["clients"])
    assert all(r["train_loss"] is None for r in records)
    assert all(torch.equal(a, b) for a, b in zip(e.global_params, w0, strict=True))
    assert status(e)["phase"] == "done"


def test_a_skipped_round_costs_no_privacy_and_keeps_the_clip_norm(tmp_path: Path) -> None:
    from fedent.privacy.accountant import central_report

    pc = PrivacyConfig(dp="central", noise_multiplier=1.0, adaptive_clip=True)
    e = engine(tmp_path, Dropping, rounds=5, policy=RoundPolicy(quorum=1.0, retries=-1), privacy=pc, down={0})
    records = e.run()
    skipped = ["skipped" in r["diagnostics"] for r in records]
    assert any(skipped) and not all(skipped)
    released = 0
    for r, skip in zip(records, skipped, strict=True):
        released += not skip
        assert r["privacy"]["epsilon"] == central_report(4, 2, 1.0, released, 1e-5)["epsilon"]
        assert r["privacy"]["event"]["count"] == released
    for before, r, skip in zip(records, records[1:], skipped[1:], strict=False):
        if skip:  # no release, no count to move the clip norm by
            assert r["privacy"]["next_clip_norm"] == before["privacy"]["next_clip_norm"]
            assert "clip_norm" not in r["privacy"]


def test_stop_ends_the_run_as_failed(tmp_path: Path) -> None:
    e = engine(tmp_path, rounds=3)
    e.on_round = lambda rec: e.stop.set()
    with pytest.raises(RunError, match="stopped"):
        e.run()
    assert status(e)["phase"] == "failed" and len(runlog.read_metrics(e.paths.metrics)) == 1


class NeedsOracle(FedAvg):
    name = "needs-oracle"

    def __init__(self, oracle: bool) -> None:
        super().__init__()
        self.oracle = oracle
        self.prepared = 0

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(oracle=self.oracle)

    def prepare(self, oracle: Any, global_params: Sequence[Tensor], client_sizes: Sequence[int],
                rounds: int) -> dict[str, Any]:
        self.prepared += 1
        return {"clients": len(client_sizes)}


@pytest.mark.parametrize("oracle", [True, False])
def test_prepare_runs_by_capability_not_by_name(tmp_path: Path, oracle: bool) -> None:
    s = NeedsOracle(oracle)
    e = engine(tmp_path, strategy=s, rounds=1)
    e.run()
    assert s.prepared == int(oracle)
    assert e.paths.estimator.exists() == oracle


def test_the_executor_may_replace_the_strategy_when_preparing(tmp_path: Path) -> None:
    replacement = FedAvg()

    class Replacing(InProcessExecutor):
        def prepare(self, strategy: Strategy, global_params: Sequence[Tensor], sizes: Sequence[int],
                    rounds: int) -> tuple[Strategy, dict[str, Any]]:
            return replacement, {"replaced": True}

    e = engine(tmp_path, Replacing, strategy=NeedsOracle(True), rounds=1)
    e.run()
    assert e.strategy is replacement
    assert json.loads(e.paths.estimator.read_text())["report"] == {"replaced": True}


def test_model_final_is_replaced_atomically_never_torn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash while the final model is written leaves the previous file whole (it used to be written in
    place by torch.save, so a kill mid-write left a torn model_final.pt)."""
    e = engine(tmp_path)
    torch.save([torch.ones(3)], e.paths.model)
    real_save = torch.save

    def torn(obj: Any, f: Any, *args: Any, **kw: Any) -> None:
        if isinstance(f, (str, Path)) and Path(f) != e.paths.model:
            return real_save(obj, f, *args, **kw)
        with (open(f, "wb") if isinstance(f, (str, Path)) else f) as out:  # type: ignore[arg-type]
            out.write(b"PK\x03\x04 half a zip")
        raise OSError("killed mid-write")

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(OSError, match="killed mid-write"):
        e.run()
    monkeypatch.undo()
    assert torch.equal(torch.load(e.paths.model)[0], torch.ones(3))
    assert not [p for p in e.paths.root.iterdir() if p.name.endswith(".tmp")]


def test_checkpoints_that_are_all_corrupt_stop_the_run_instead_of_restarting_at_round_0(tmp_path: Path) -> None:
    e = engine(tmp_path, rounds=3, policy=RoundPolicy(checkpoint_keep=2))
    e.run()
    rows = e.paths.metrics.read_text()
    for p in e.paths.checkpoint.iterdir():
        p.write_bytes(p.read_bytes()[:-3])
    again = engine(tmp_path, rounds=3, policy=RoundPolicy(checkpoint_keep=2))
    with pytest.raises(RunDirError, match=r"none is intact .*round-00000002\.ckpt"):
        again.run()
    assert again.paths.metrics.read_text() == rows  # no duplicate rows appended


def test_a_crash_before_the_first_checkpoint_runs_round_0_again_logged_once(tmp_path: Path) -> None:
    """Killed between logging round 0 and writing its checkpoint: round 0 is run again and metrics.jsonl
    is cut first (it used to keep the old line and append another round 0)."""
    e = engine(tmp_path, rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    runlog.MetricsLog(e.paths.metrics).append(runlog.metrics_record(round=1, algorithm="fedavg", test_acc=0.01))
    e.run()
    assert [r["round"] for r in runlog.read_metrics(e.paths.metrics)] == [1, 2]


class Diverging(InProcessExecutor):
    """The first client's local model comes back with a NaN, as a diverged local training would give it."""

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        got = super().fit(rnd, cids, global_params, strategy, payload)
        first = min(got.results)
        got.results[first].params[0] = got.results[first].params[0].clone().fill_(float("nan"))
        return got


def test_a_diverged_local_model_fails_the_run_naming_the_client_before_aggregation(tmp_path: Path) -> None:
    class Exploding(FedAvg):
        def aggregate(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]) -> Any:
            raise AssertionError("aggregate must not see a non-finite update")

    e = engine(tmp_path, Diverging, policy=RoundPolicy(quorum=1.0, retries=0), strategy=Exploding())
    with pytest.raises(RunError, match=r"round 1 missed its quorum .*local model of client\(s\) \[\d+\] is not finite"):
        e.run()
    assert status(e)["phase"] == "failed"


def test_a_rejected_upload_is_a_failed_client_and_the_quorum_decides(tmp_path: Path) -> None:
    """Under a quorum the rejected client is left out: the round aggregates the others, metrics.jsonl names
    it with the acceptance rule's reason, and clients.json shows it rejected with its last failure."""
    e = engine(tmp_path, Diverging, policy=RoundPolicy(quorum=0.5, retries=0), rounds=1)
    records = e.run()
    failed = records[0]["diagnostics"]["failed_clients"]
    (cid, why), = failed.items()
    assert why == f"rejected: update of client {cid} is not finite (NaN/inf)"
    assert records[0]["num_clients"] == len(records[0]["clients"]) and int(cid) in records[0]["clients"]
    rows = {r["cid"]: r for r in runlog.read_clients(e.paths.clients)}
    assert rows[int(cid)]["state"] == "rejected" and rows[int(cid)]["participation"] == 0
    assert rows[int(cid)]["last_failure"] == f"round 1: {why}"
    others = [c for c in records[0]["clients"] if c != int(cid)]
    assert all(rows[c]["state"] == "done" and rows[c]["last_failure"] is None for c in others)


class Misdeclaring(InProcessExecutor):
    """Every update carries a scalar its strategy never declared (a plug-in breaking its own payload_spec)."""

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        got = super().fit(rnd, cids, global_params, strategy, payload)
        for u in got.results.values():
            u.scalars["undeclared"] = 1.0
        return got


def test_the_payload_spec_is_checked_in_process_too(tmp_path: Path) -> None:
    e = engine(tmp_path, Misdeclaring, rounds=1)
    with pytest.raises(RunError, match=r"missed its quorum .*0/\d updates accepted; client \d: rejected: update "
                                       r"of client \d has unknown scalars \['undeclared'\]"):
        e.run()
    assert "has unknown scalars ['undeclared']" in status(e)["state"]["error"]


def test_a_stop_from_a_signalled_service_ends_stopped_not_failed(tmp_path: Path) -> None:
    """The aggregator got SIGTERM: it sets stop_signal with stop, and the run ends "stopped" with the reason (a
    checkpointed run resumes), as an interrupted simulation does; a plain stop (no signal) still fails it."""
    from fedent.signals import Stopped

    e = engine(tmp_path, rounds=3)

    def signalled(rec: dict[str, Any]) -> None:
        e.stop_signal = "SIGTERM"
        e.stop.set()

    e.on_round = signalled
    with pytest.raises(Stopped):
        e.run()
    st = status(e)
    assert (st["phase"], st["state"]["reason"], st["round"]) == ("stopped", "stopped by SIGTERM", 1)
    plain = engine(tmp_path / "plain", rounds=3)
    plain.on_round = lambda rec: plain.stop.set()
    with pytest.raises(RunError, match="stopped"):
        plain.run()
    assert status(plain)["phase"] == "failed"


def test_an_absurd_probe_rejects_its_client_and_never_fails_the_run(tmp_path: Path) -> None:
    """FedEnt's client 3 probes eta_prev = -1e300 every round: it used to end the run with a StrategyError from the
    estimator; now the declared range rejects that client (clients.json says why) and the quorum decides."""
    from nan_plugin import ABSURD
    from sim_support import tiny_config as sim_config
    from sim_support import tiny_inputs as sim_inputs

    from fedent.sim.simulator import run_simulation

    cfg = sim_config("nan_plugin:AbsurdProbeFedEnt", rounds=3, fraction=1.0)
    res = run_simulation(cfg, tmp_path / "run", progress=False, inputs=sim_inputs(10), plots=False,
                         policy=RoundPolicy(quorum=0.5, retries=-1))
    assert len(res.records) == 3 and all("skipped" not in r["diagnostics"] for r in res.records)
    why = f"rejected: probe of client {ABSURD}: scalar eta_prev=-1e+300 is outside its range [0, 1e+06]"
    assert all(r["diagnostics"]["failed_clients"] == {str(ABSURD): why} for r in res.records)
    rows = {r["cid"]: r for r in runlog.read_json(tmp_path / "run" / "clients.json")["clients"]}
    assert rows[ABSURD]["state"] == "rejected" and rows[ABSURD]["participation"] == 0
    assert rows[ABSURD]["last_failure"] == f"round 3: {why}"
