"""The one round loop (fedent.rounds.engine) over scripted executors: quorum, retries, skips, stop, capabilities.

The executors here wrap the real in-process one and drop or delay clients the way a remote worker would, so
the engine's policy is tested without gRPC (the cluster tests exercise the same code over real processes).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
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
from fedent.rounds.engine import is_eval_round, missed, weighted_train_loss
from fedent.rounds.evaluation import Evaluator
from fedent.rounds.rundir import RunDirError
from fedent.strategies.base import Capabilities, ClientUpdate, Probe, RoundPayload, Strategy
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
        self.replaced: list[tuple[int, int, int]] = []  # (round, attempt, k) of each replacements call
        self.fitted: list[list[ClientUpdate]] = []  # the updates each fit returned, in cid order

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        self.asked.append(list(cids))
        got = super().fit(rnd, [c for c in cids if c not in self.down], global_params, strategy, payload)
        self.fitted.append([got.results[c] for c in sorted(got.results)])
        return Gathered(got.results, {c: "deadline" for c in cids if c in self.down})

    def replacements(self, rnd: int, attempt: int, k: int, exclude: set[int]) -> list[int]:
        self.excluded.append(set(exclude))
        self.replaced.append((rnd, attempt, k))
        return sorted(c for c in self.host.hosted if c not in self.down)[:k]

    def finish(self, ok: bool, reason: str) -> None:
        self.finished.append((ok, reason))


def engine(tmp_path: Path, executor_cls: type[InProcessExecutor] = InProcessExecutor, *, rounds: int = 2,
           strategy: Strategy | None = None, policy: RoundPolicy | None = None,
           privacy: PrivacyConfig | None = None, train: dict[str, Any] | None = None, local_models: int = 0,
           **kw: Any) -> RoundEngine:
    cfg = tiny_config("fedavg", num_clients=4, rounds=rounds, **(train or {}))
    if privacy is not None:
        cfg = dataclasses.replace(cfg, privacy=privacy)
    inputs = tiny_inputs()
    data = inputs.data
    tr = cfg.train
    trainer = LocalTrainer(inputs.make_model(), data.x_train, data.y_train, tr.batch_size, torch.device("cpu"))
    ex = executor_cls(ClientHost(trainer, inputs.client_indices, ClientTraining.from_config(cfg)), **kw)
    ev = Evaluator(trainer, data.x_test, data.y_test, tr.eval_batch_size, tr.seed, local_models=local_models)
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
    # each replacements call names the round (0-based), the try it is for (1, 2, ...) and how many to hand out
    assert ex.replaced == [(r["round"] - 1, i + 1, len(tried["clients"]))
                           for r in retried for i, tried in enumerate(r["diagnostics"]["retried"])]
    assert retried and all(re.fullmatch(r"\d/\d updates accepted; client [01]: deadline.*",
                                             r["diagnostics"]["retried"][0]["why"])
                           for r in retried)


def test_retries_exhausted_fail_the_run_with_one_line(tmp_path: Path) -> None:
    e = engine(tmp_path, Dropping, policy=RoundPolicy(quorum=1.0, retries=0), down={0, 1, 2, 3})
    with pytest.raises(RunError, match="missed its quorum in 1 attempt"):
        e.run()
    st = status(e)
    assert st["phase"] == "failed" and "\n" not in st["state"]["error"] and st["round"] == 1  # the round that failed
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


class Resuming(InProcessExecutor):
    """Records what the engine tells the executor about its resume (a run of several processes agrees on it)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.resumes: list[tuple[int | None, str | None]] = []

    def resumed(self, first: int | None, error: BaseException | None) -> None:
        self.resumes.append((first, None if error is None else type(error).__name__))


def test_checkpoints_that_are_all_corrupt_stop_the_run_instead_of_restarting_at_round_0(tmp_path: Path) -> None:
    e = engine(tmp_path, Resuming, rounds=3, policy=RoundPolicy(checkpoint_keep=2))
    e.run()
    rows = e.paths.metrics.read_text()
    for p in e.paths.checkpoint.iterdir():
        p.write_bytes(p.read_bytes()[:-3])
    again = engine(tmp_path, Resuming, rounds=3, policy=RoundPolicy(checkpoint_keep=2))
    with pytest.raises(RunDirError, match=r"none is intact .*round-00000002\.ckpt"):
        again.run()
    assert again.paths.metrics.read_text() == rows  # no duplicate rows appended
    # the executor heard of both: the fresh start at round 0, then the failed resume (with the error, before the
    # engine re-raised it: the other ranks of a multi-process run then raise instead of waiting in round 1)
    assert isinstance(e.executor, Resuming) and isinstance(again.executor, Resuming)
    assert e.executor.resumes == [(0, None)] and again.executor.resumes == [(None, "RunDirError")]


class PeerGone(InProcessExecutor):
    """A run of several processes whose peer has exited already: telling it of a failed resume fails too."""

    def resumed(self, first: int | None, error: BaseException | None) -> None:
        if error is not None:
            raise RuntimeError("[gloo] connection closed by peer")


def test_a_failed_resume_keeps_its_own_error_when_the_peers_cannot_be_told(tmp_path: Path) -> None:
    e = engine(tmp_path, rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    e.run()
    for p in e.paths.checkpoint.iterdir():
        p.write_bytes(p.read_bytes()[:-3])
    again = engine(tmp_path, PeerGone, rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    with pytest.raises(RunDirError, match="none is intact") as got:
        again.run()
    assert got.value.__notes__ == ["the run's other processes were not told: [gloo] connection closed by peer"]
    assert "RunDirError" in status(again)["state"]["error"]


def test_a_resumed_run_tells_the_executor_its_first_round(tmp_path: Path) -> None:
    e = engine(tmp_path, rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    e.run()
    newest = sorted(e.paths.checkpoint.glob("round-*.ckpt"))[-1]
    assert newest.name == "round-00000001.ckpt"  # checkpoints are named by round index: 0, 1
    newest.unlink()  # as if killed before the last round's checkpoint: that round (index 1) runs again
    again = engine(tmp_path, Resuming, rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    again.run()
    assert isinstance(again.executor, Resuming) and again.executor.resumes == [(1, None)]


def test_a_resumed_runs_provenance_keeps_the_rounds_each_process_trained(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped after round 1 of 3 and resumed by a process at another commit, then again after round 2 by a third:
    provenance.json names each process with the rounds it trained, from the checkpoint resumed from (a later
    checkpoint lost does not put its process's rounds in the history)."""
    from fedent import provenance

    def at(commit: str) -> None:
        monkeypatch.setattr(provenance, "collect", lambda cwd=None: {"commit": commit, "gpu": "none"})

    at("a")
    e = engine(tmp_path, rounds=3, policy=RoundPolicy(checkpoint_keep=3))
    e.run()
    assert json.loads(e.paths.provenance.read_text()) == {"commit": "a", "gpu": "none"}  # fresh: no history
    for name in ("round-00000002.ckpt", "round-00000001.ckpt"):
        (e.paths.checkpoint / name).unlink()  # as if killed after round 1's checkpoint
    at("b")
    engine(tmp_path, rounds=3, policy=RoundPolicy(checkpoint_keep=3)).run()
    assert json.loads(e.paths.provenance.read_text()) == {
        "commit": "b", "gpu": "none", "from_round": 2, "earlier": [{"commit": "a", "gpu": "none", "rounds": [1, 1]}]}
    (e.paths.checkpoint / "round-00000002.ckpt").unlink()  # killed again, after round 2 (b trained rounds 2, 3)
    at("c")
    engine(tmp_path, rounds=3, policy=RoundPolicy(checkpoint_keep=3)).run()
    got = json.loads(e.paths.provenance.read_text())
    assert (got["commit"], got["from_round"]) == ("c", 3)
    assert got["earlier"] == [{"commit": "a", "gpu": "none", "rounds": [1, 1]},
                              {"commit": "b", "gpu": "none", "rounds": [2, 2]}]
    assert [r["round"] for r in runlog.read_metrics(e.paths.metrics)] == [1, 2, 3]
    # killed again while starting (before the resume): provenance.json keeps the history it had
    at("d")
    engine(tmp_path, rounds=3, policy=RoundPolicy(checkpoint_keep=3)).write_start_files()
    assert json.loads(e.paths.provenance.read_text()) == got


def test_a_checkpoint_from_before_provenance_in_checkpoints_resumes_with_the_last_provenance_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedent import provenance
    from fedent.checkpoint import load_latest_checkpoint, save_checkpoint

    monkeypatch.setattr(provenance, "collect", lambda cwd=None: {"commit": "a", "gpu": "none"})
    e = engine(tmp_path, rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    e.run()
    (e.paths.checkpoint / "round-00000001.ckpt").unlink()
    ckpt = load_latest_checkpoint(e.paths.checkpoint)
    assert ckpt is not None and ckpt.extra.pop("provenance") == {"commit": "a", "gpu": "none"}
    save_checkpoint(e.paths.checkpoint, ckpt)  # as an older version wrote it: no provenance inside
    monkeypatch.setattr(provenance, "collect", lambda cwd=None: {"commit": "b", "gpu": "none"})
    engine(tmp_path, rounds=2, policy=RoundPolicy(checkpoint_keep=2)).run()
    got = json.loads(e.paths.provenance.read_text())
    (entry,) = got["earlier"]
    assert (got["commit"], got["from_round"], entry["commit"], entry["rounds"]) == ("b", 2, "a", [1, 1])
    assert "not recorded" in entry["note"]


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

    e = engine(tmp_path, Dropping, rounds=3, down=set())

    def signalled(rec: dict[str, Any]) -> None:
        e.stop_signal = "SIGTERM"
        e.stop.set()

    e.on_round = signalled
    with pytest.raises(Stopped):
        e.run()
    st = status(e)
    assert (st["phase"], st["state"]["reason"], st["round"]) == ("stopped", "stopped by SIGTERM", 1)
    assert st["state"]["rounds_completed"] == 1
    assert isinstance(e.executor, Dropping) and e.executor.finished == [(False, "run stopped by SIGTERM")]
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


# ---- what the run files and metrics lines hold (issue 31: content, not existence) ------------------------


def test_the_helpers_missed_weighted_train_loss_and_is_eval_round() -> None:
    failed = {5: "deadline", 1: "deadline", 3: "crashed", 7: "timeout",
              2: "rejected: update of client 2 is not finite (NaN/inf)"}
    assert missed(1, 6, "updates", failed) == (
        "1/6 updates accepted; client 1: deadline; client 3: crashed; client 5: deadline (+1 more); the local model "
        "of client(s) [2] is not finite: local training diverged; lower train.lr (or cap the strategy's rate)")
    assert missed(2, 3, "probes", {4: "deadline"}) == "2/3 probes accepted; client 4: deadline"
    assert missed(0, 2, "updates", {}) == "0/2 updates accepted"
    ups = [ClientUpdate(0, [], 1, 2.0), ClientUpdate(1, [], 3, 6.0)]
    assert weighted_train_loss(ups) == 5.0  # (2·1 + 6·3) / 4
    assert weighted_train_loss([]) is None and weighted_train_loss([ClientUpdate(0, [], 0, 1.0)]) is None
    assert [r for r in range(5) if is_eval_round(r, 5, 2)] == [1, 3, 4]


def test_metrics_lines_hold_the_rounds_values_and_status_the_runs(tmp_path: Path) -> None:
    """Every metrics line's numbers are the round's: the evaluation of the model that round left, the
    sample-weighted train loss of its uploads, the sampled local models, the executor's extra diagnostics."""
    from fedent.rng import numpy_rng

    class Extra(Dropping):
        def round_diagnostics(self, rnd: int) -> dict[str, Any]:
            return {"wire": {"round": rnd}}

    e = engine(tmp_path, Extra, rounds=3, train={"eval_every": 2, "fraction": 1.0}, local_models=2, down=set())
    assert (e.phase, e.round) == ("starting", None) and abs(e.started_at - time.time()) < 60
    seen: list[tuple[dict[str, Any], list[Tensor]]] = []
    e.on_round = lambda rec: seen.append((rec, [p.clone() for p in e.global_params]))
    phases: list[tuple[str, int | None]] = []
    e.on_phase = lambda phase: phases.append((phase, status(e)["round"]))
    records = e.run()
    assert [r for r, _ in seen] == records and [p for p, _ in phases].count("evaluating") == 2
    assert phases == [("starting", None)] + [(p, r) for r in (1, 2, 3) for p in
                                             ("training", "aggregating", "evaluating")[: 2 + (r != 1)]] + [("done", 3)]
    ex = e.executor
    assert isinstance(ex, Extra) and ex.finished == [(True, "run finished")]
    assert [r["test_acc"] is None for r in records] == [True, False, False]  # every 2nd round and the last
    for (rec, params), ups in zip(seen, ex.fitted, strict=True):
        assert rec["clients"] == [u.cid for u in ups] and rec["num_clients"] == len(ups)
        assert rec["train_loss"] == pytest.approx(sum(u.train_loss * u.num_samples for u in ups)
                                                  / sum(u.num_samples for u in ups), rel=1e-12)
        assert rec["diagnostics"]["wire"] == {"round": rec["round"] - 1}
        assert 0 < rec["wall_s"] <= rec["elapsed_s"]
        if rec["test_acc"] is None:
            assert "evaluation" not in rec["diagnostics"] and "local_acc" not in rec["diagnostics"]
            continue
        assert (rec["test_loss"], rec["test_acc"]) == e.evaluator.evaluate(params)
        assert rec["diagnostics"]["evaluation"] == {"mode": "server", "samples": 30}
        pick = sorted(int(i) for i in numpy_rng(e.seed, "eval", rec["round"] - 1).choice(4, size=2, replace=False))
        assert rec["diagnostics"]["local_clients"] == [ups[i].cid for i in pick]
        assert rec["diagnostics"]["local_acc"] == [e.evaluator.evaluate(ups[i].params)[1] for i in pick]
    assert records[1]["elapsed_s"] < records[2]["elapsed_s"]
    st = status(e)
    assert (st["run_id"], st["algorithm"], st["phase"], st["round"], st["rounds"]) == (
        e.paths.run_id, "fedavg", "done", 3, 3)
    assert st["started_at"] == e.started_at and st["state"]["final_acc"] == records[-1]["test_acc"] is not None
    prov = json.loads(e.paths.provenance.read_text())
    assert prov["python"] == sys.version.split()[0] and prov["torch"] == torch.__version__


def test_a_probing_strategys_round_logs_its_record_and_trajectory(tmp_path: Path) -> None:
    """FedEnt (probe capability): the phases go estimating -> training -> aggregating -> evaluating each round;
    its record leaves diagnostics for the line's ``fedent`` field, and estimator.json keeps the trajectory."""
    from fedent.strategies.fedent import FedEnt

    e = engine(tmp_path, rounds=2, strategy=FedEnt())
    phases: list[tuple[str, int | None]] = []
    e.on_phase = lambda phase: phases.append((phase, status(e)["round"]))
    records = e.run()
    assert phases == [("starting", None)] + [(p, r) for r in (1, 2) for p in
                                             ("estimating", "training", "aggregating", "evaluating")] + [("done", 2)]
    est = json.loads(e.paths.estimator.read_text())
    assert (est["algorithm"], est["report"], est["round_base"]) == ("fedent", {}, runlog.ROUND_BASE)
    assert len(est["trajectory"]) == 2
    for rec, traj in zip(records, est["trajectory"], strict=True):
        fed = rec["fedent"]
        assert "fedent" not in rec["diagnostics"] and fed["estimate"]["mode"] == "online"
        assert [c["client"] for c in fed["clients"]] == rec["clients"]
        assert traj == {"round": rec["round"], **{k: fed[k] for k in ("phi2_pred", "phi2_actual", "entropy", "guards")}}
        assert traj["phi2_pred"] is not None


class ProbeDropping(Dropping):
    """Clients in ``down`` never answer a probe (they would answer the fit)."""

    def probe(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor],
              strategy: Strategy) -> Gathered[Probe]:
        got = super().probe(rnd, [c for c in cids if c not in self.down], global_params, strategy)
        return Gathered(got.results, {c: "probe deadline" for c in cids if c in self.down})

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        self.asked.append(list(cids))
        return InProcessExecutor.fit(self, rnd, cids, global_params, strategy, payload)


def test_a_round_that_misses_its_probe_quorum_is_skipped_before_training(tmp_path: Path) -> None:
    from fedent.strategies.fedent import FedEnt

    e = engine(tmp_path, ProbeDropping, rounds=4, strategy=FedEnt(), policy=RoundPolicy(quorum=1.0, retries=-1),
               down={0})
    seen: list[list[Tensor]] = [[p.clone() for p in e.global_params]]
    e.on_round = lambda rec: seen.append([p.clone() for p in e.global_params])
    records = e.run()
    ex = e.executor
    assert isinstance(ex, ProbeDropping)
    skipped = [0 in r["clients"] for r in records]
    assert any(skipped) and not all(skipped)
    for rec, skip, before, after in zip(records, skipped, seen[:-1], seen[1:], strict=True):
        if skip:
            assert rec["diagnostics"]["skipped"] == "1/2 probes accepted; client 0: probe deadline"
            assert rec["diagnostics"]["failed_clients"] == {"0": "probe deadline"} and rec["fedent"] is None
            assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        else:
            assert "skipped" not in rec["diagnostics"] and rec["fedent"]["estimate"]["mode"] == "online"
    assert ex.asked == [r["clients"] for r, skip in zip(records, skipped, strict=True) if not skip]


def test_a_round_short_of_its_quorum_keeps_the_model_though_some_updates_came(tmp_path: Path) -> None:
    e = engine(tmp_path, Dropping, rounds=5, policy=RoundPolicy(quorum=1.0, retries=-1), down={0})
    seen: list[list[Tensor]] = [[p.clone() for p in e.global_params]]
    e.on_round = lambda rec: seen.append([p.clone() for p in e.global_params])
    records = e.run()
    skipped = ["skipped" in r["diagnostics"] for r in records]
    assert skipped == [0 in r["clients"] for r in records] and any(skipped) and not all(skipped)
    for skip, before, after in zip(skipped, seen[:-1], seen[1:], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)) == skip


def test_reported_counts_become_the_runs_and_out_of_bounds_reports_are_rejected(tmp_path: Path) -> None:
    from fedent.rounds.robust import report_problem

    e = engine(tmp_path)
    e.cfg = dataclasses.replace(e.cfg, robust=dataclasses.replace(e.cfg.robust, max_client_samples=100))
    e.write_start_files()
    e.adopt_client_data([5, 101, 7, 9], {"test_sizes": [1, 2, 3, 101], "source": "workers"})
    assert e.sizes == [5, 1, 7, 1]  # a rejected client counts 1 for the strategies' setup
    assert e.rejected == {1: report_problem(1, 101, 2, 100), 3: report_problem(3, 9, 101, 100)}
    part = json.loads(e.paths.partition.read_text())
    assert part == runlog.jsonable({**e.partition_info}) and part["sizes"] == [5, 1, 7, 1]
    assert part["source"] == "workers" and part["md5"] == tiny_inputs().partition_info["md5"]
    rows = {r["cid"]: r for r in runlog.read_clients(e.paths.clients)}
    assert [rows[c]["samples"] for c in range(4)] == [5, 101, 7, 9]
    assert [rows[c]["state"] for c in range(4)] == ["idle", "rejected", "idle", "rejected"]
    assert (rows[1]["last_failure"], rows[3]["last_failure"]) == (e.rejected[1], e.rejected[3])


def test_prepare_hands_the_strategy_the_schedule_the_base_rate_and_the_sizes(tmp_path: Path) -> None:
    from fedent.rng import sample_clients

    class Planned(NeedsOracle):
        def __init__(self, oracle: bool) -> None:
            super().__init__(oracle)
            self.plans: list[tuple[list[list[int]], float]] = []
            self.setups: list[list[int]] = []

        def set_run_plan(self, schedule: Sequence[Sequence[int]], base_lr: float) -> None:
            self.plans.append(([list(r) for r in schedule], base_lr))

        def setup(self, global_params: Sequence[Tensor], sizes: Sequence[int]) -> None:
            self.setups.append(list(sizes))
            super().setup(global_params, sizes)

    s = Planned(True)
    e = engine(tmp_path, strategy=s, rounds=3)
    e.run()
    plan = [list(sample_clients(e.seed, t, 4, e.cfg.train.fraction)) for t in range(3)]
    assert s.plans == [(plan, e.cfg.train.lr)] and s.setups == [e.sizes] and s.prepared == 1
    assert json.loads(e.paths.estimator.read_text())["report"] == {"clients": 4}


def test_checkpoints_keep_the_newest_and_none_without_checkpoint_keep(tmp_path: Path) -> None:
    from fedent.checkpoint import list_checkpoints

    e = engine(tmp_path, rounds=3, policy=RoundPolicy(checkpoint_keep=2))
    e.run()
    assert [r for r, _ in list_checkpoints(e.paths.checkpoint)] == [2, 1]
    # checkpoint_keep 0: no resume, the checkpoints of an earlier run in the directory are not read
    again = engine(tmp_path, rounds=3)
    rounds: list[int] = []
    again.on_round = lambda rec: rounds.append(rec["round"])
    again.run()
    assert rounds == [1, 2, 3] and [r for r, _ in list_checkpoints(e.paths.checkpoint)] == [2, 1]


def test_background_writes_are_flushed_before_each_checkpoint_and_the_end_and_closed_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hooks a background writer registers (the simulator's client-state store): flushed before every
    checkpoint is written (a checkpoint must never point at states still in memory) and before ``done``; closed
    once the run has ended, failed runs included."""
    from fedent.rounds import resume

    events: list[str] = []
    real_save = resume.save

    def save(run: RoundEngine, rnd: int, keep: int = 3) -> None:
        events.append(f"checkpoint {rnd}")
        real_save(run, rnd, keep)

    monkeypatch.setattr(resume, "save", save)
    e = engine(tmp_path, rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    e.before_checkpoint.append(lambda: events.append("flush"))
    e.after_run.append(lambda: events.append("close"))
    e.status = lambda phase, *a, **k: events.append(phase)  # type: ignore[method-assign]
    e.run()
    assert events[-3:] == ["flush", "done", "close"]
    assert [x for x in events if x.startswith(("flush", "checkpoint"))] == [
        "flush", "checkpoint 0", "flush", "checkpoint 1", "flush"]

    events.clear()
    broken = engine(tmp_path / "b", rounds=2, policy=RoundPolicy(checkpoint_keep=2))
    broken.before_checkpoint.append(lambda: (_ for _ in ()).throw(OSError("disk full")))
    broken.after_run.append(lambda: events.append("close"))
    with pytest.raises(OSError, match="disk full"):
        broken.run()
    assert events == ["close"]  # the write's error failed the run before its first checkpoint; closed anyway


def test_a_privacy_budget_ends_the_run_early_and_evaluates_its_last_round(tmp_path: Path) -> None:
    """target_epsilon 4 (noise 3, 2 of 4 clients a round: ε 2.4, 3.5, 4.6 after 1, 2, 3 rounds): round 3 is not
    run, round 2 is evaluated although eval_every is 3, and status.json says done early, why, and at round 2."""
    pc = PrivacyConfig(dp="central", noise_multiplier=3.0, target_epsilon=4.0)
    e = engine(tmp_path, Dropping, rounds=3, privacy=pc, train={"eval_every": 3}, down=set())
    records = e.run()
    assert [r["round"] for r in records] == [1, 2] and [r["test_acc"] is None for r in records] == [True, False]
    st = status(e)
    assert (st["phase"], st["round"], st["state"]["final_acc"]) == ("done", 2, records[-1]["test_acc"])
    assert e.budget_stop is not None and st["state"]["stopped_early"] == e.budget_stop
    assert e.budget_stop.startswith("privacy budget: round 3 ")
    assert isinstance(e.executor, Dropping) and e.executor.finished == [(True, "run finished")]


def test_secure_aggregation_aggregates_the_unmasked_sum_and_a_failed_unmasking_skips(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedent.secagg.protocol import ProtocolError

    plain = engine(tmp_path / "plain")
    plain.run()
    e = engine(tmp_path / "secure", privacy=PrivacyConfig(secure_aggregation=True))
    records = e.run()
    assert all("skipped" not in r["diagnostics"] for r in records)
    num = sum(float((a - b).norm() ** 2) for a, b in zip(e.global_params, plain.global_params, strict=True))
    assert 0 < num ** 0.5 <= 1e-4 * sum(float(b.norm() ** 2) for b in plain.global_params) ** 0.5

    def broken(*args: Any, **kw: Any) -> Any:
        raise ProtocolError("too few shares")

    skip = engine(tmp_path / "skip", privacy=PrivacyConfig(secure_aggregation=True),
                  policy=RoundPolicy(quorum=1.0, retries=-1))
    assert skip.secure is not None
    monkeypatch.setattr(skip.secure, "finish", broken)
    w0 = [p.clone() for p in skip.global_params]
    records = skip.run()
    assert all(r["diagnostics"]["skipped"] == "secure aggregation could not unmask the sum: too few shares"
               for r in records)
    assert all(torch.equal(a, b) for a, b in zip(skip.global_params, w0, strict=True))
    retry = engine(tmp_path / "retry", privacy=PrivacyConfig(secure_aggregation=True),
                   policy=RoundPolicy(quorum=1.0, retries=1))
    assert retry.secure is not None
    monkeypatch.setattr(retry.secure, "finish", broken)
    with pytest.raises(RunError, match=r"round 1 missed its quorum in 2 attempt\(s\), last: secure aggregation could "
                                       "not unmask the sum: too few shares"):
        retry.run()
    assert plain.secure is None


def test_a_federated_evaluation_is_asked_for_its_round_and_its_rejected_clients_are_recorded(tmp_path: Path) -> None:
    from fedent.rounds.evaluation import ClientEval

    asked: list[int] = []

    def federated(rnd: int, params: Sequence[Tensor]) -> Gathered[ClientEval]:
        asked.append(rnd)
        return Gathered({0: ClientEval(0, 10, 0.5, 0.75), 1: ClientEval(1, 5, 1.0, 2.0)}, {2: "eval deadline"})

    e = engine(tmp_path, rounds=2)
    e.evaluator.federated, e.evaluator.mode = federated, "federated"
    records = e.run()
    assert asked == [0, 1]
    why = "rejected: evaluation of client 1: accuracy 2.0 is outside [0, 1]"
    for r in records:
        assert (r["test_loss"], r["test_acc"]) == (0.5, 0.75)
        assert r["diagnostics"]["evaluation"] == {"mode": "federated", "samples": 10, "clients": 1,
                                                  "failed": {"2": "eval deadline"}, "rejected": {"1": why}}
    rows = {r["cid"]: r for r in runlog.read_clients(e.paths.clients)}
    assert rows[1]["last_failure"] == f"round 2: {why}"


def test_a_global_model_that_is_not_finite_fails_the_run_with_advice(tmp_path: Path) -> None:
    class Blowing(FedAvg):
        def aggregate(self, rnd: int, global_params: Sequence[Tensor], updates: Sequence[ClientUpdate]) -> Any:
            got = super().aggregate(rnd, global_params, updates)
            return dataclasses.replace(got, params=[p.clone().fill_(float("inf")) for p in got.params])

    e = engine(tmp_path, strategy=Blowing())
    with pytest.raises(RunError, match=r"^the global model is not finite after round 1 \(fedavg\); lower train.lr$"):
        e.run()
    assert status(e)["phase"] == "failed"
