"""Secure aggregation through the one round engine (the simulator's executors): the model of a secure run is the
plain run's within the fixed-point resolution, for every strategy that can run under it; a client that drops
after masking is recovered; the aggregator never holds a clear model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import tiny_config, tiny_inputs
from torch import Tensor

from fedent import runlog
from fedent.config import PrivacyConfig
from fedent.rounds import ClientHost, ClientTraining, Gathered, InProcessExecutor, RoundEngine
from fedent.rounds.engine import RoundPolicy, RunError
from fedent.rounds.evaluation import Evaluator
from fedent.rounds.vectorised import VectorisedHost
from fedent.strategies.base import ClientUpdate, RoundPayload, Strategy
from fedent.strategies.registry import build_strategy
from fedent.trainer import LocalTrainer


class Recording(InProcessExecutor):
    """Keeps every upload that reaches the engine; ``lose`` clients' uploads vanish after they masked."""

    def __init__(self, *args: Any, lose: frozenset[int] = frozenset(), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.lose, self.seen = set(lose), list[ClientUpdate]()

    def fit(self, rnd: int, cids: Sequence[int], global_params: Sequence[Tensor], strategy: Strategy,
            payload: RoundPayload) -> Gathered[ClientUpdate]:
        got = super().fit(rnd, cids, global_params, strategy, payload)
        self.seen += list(got.results.values())
        kept = {c: u for c, u in got.results.items() if c not in self.lose}
        return Gathered(kept, {**got.failed, **{c: "lost after masking" for c in got.results if c in self.lose}})


def run(tmp_path: Path, algorithm: str, secure: bool, *, host: type[ClientHost] = ClientHost,
        lose: frozenset[int] = frozenset(), rounds: int = 2, num_clients: int = 6, quorum: float = 1.0,
        **privacy: Any) -> tuple[list[Tensor], Recording, RoundEngine]:
    cfg = tiny_config(algorithm, num_clients=num_clients, rounds=rounds, fraction=1.0)
    cfg = dataclasses.replace(cfg, privacy=PrivacyConfig(secure_aggregation=secure, **privacy))
    inputs = tiny_inputs(num_clients=num_clients)
    data, tr = inputs.data, cfg.train
    trainer = LocalTrainer(inputs.make_model(), data.x_train, data.y_train, tr.batch_size, torch.device("cpu"))
    ex = Recording(host(trainer, inputs.client_indices, ClientTraining.from_config(cfg)), lose=lose)
    ev = Evaluator(trainer, data.x_test, data.y_test, tr.eval_batch_size, tr.seed)
    paths = runlog.create_run_dir(tmp_path / f"{algorithm}-{secure}-{host.__name__}-{len(lose)}", exist_ok=True)
    strategy = build_strategy(cfg.algorithm)
    eng = RoundEngine(cfg, paths, strategy, ex, ev, trainer.params, inputs.client_sizes(), dict(inputs.partition_info),
                      RoundPolicy(quorum=quorum))
    eng.run()
    return eng.global_params, ex, eng


def rel_err(a: Sequence[Tensor], b: Sequence[Tensor]) -> float:
    num = sum(float((x.double() - y.double()).norm() ** 2) for x, y in zip(a, b, strict=True)) ** 0.5
    return num / sum(float(y.double().norm() ** 2) for y in b) ** 0.5


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fedent", "fednorm", "fedadam", "fedyogi", "scaffold",
                                       "feddyn"])
def test_a_secure_run_gives_the_plain_runs_model_within_the_resolution(tmp_path: Path, algorithm: str) -> None:
    plain, _, _ = run(tmp_path, algorithm, False)
    secure, ex, _ = run(tmp_path, algorithm, True)
    err = rel_err(secure, plain)
    assert err <= 1e-4
    assert err > 0  # the fixed-point rounding is really applied, not the float path
    assert ex.seen and all(u.masked is not None and u.params == [] for u in ex.seen)  # no clear model uploaded


def test_the_vectorised_host_masks_the_same_way(tmp_path: Path) -> None:
    plain, _, _ = run(tmp_path, "fedavg", False, host=VectorisedHost)
    secure, ex, _ = run(tmp_path, "fedavg", True, host=VectorisedHost)
    assert rel_err(secure, plain) <= 1e-4
    assert all(u.masked is not None for u in ex.seen)


def test_clients_lost_after_masking_are_unmasked_from_shares(tmp_path: Path) -> None:
    """6 clients, all pairs: 5 neighbours each, t = 3, so 2 may drop after masking; the model is then the plain
    aggregate of the 4 survivors (the plain run loses the same two uploads)."""
    lose = frozenset({1, 4})
    plain, _, _ = run(tmp_path, "fedavg", False, lose=lose, rounds=1, quorum=0.5)
    secure, ex, eng = run(tmp_path, "fedavg", True, lose=lose, rounds=1, quorum=0.5)
    assert rel_err(secure, plain) <= 1e-4
    assert eng.records[0]["diagnostics"]["failed_clients"] == {"1": "lost after masking", "4": "lost after masking"}


def test_too_many_lost_clients_fail_the_round_with_the_reason(tmp_path: Path) -> None:
    """3 of 6 lost: a survivor's self mask has 2 shares left, t = 3; the quorum (0.5) is met, the unmask is not."""
    with pytest.raises(RunError, match="secure aggregation could not unmask the sum: .*self mask"):
        run(tmp_path, "fedavg", True, lose=frozenset({0, 1, 2}), rounds=1, quorum=0.5)


def test_the_fedent_record_hides_what_needs_individual_models(tmp_path: Path) -> None:
    _, _, eng = run(tmp_path, "fedent", True, rounds=1)
    rec = eng.records[0]["fedent"]
    assert rec["phi2_actual"] is None and rec["entropy"] is None
    assert len(rec["clients"]) == 6 and all(np.isfinite(c["eta"]) for c in rec["clients"])


def lying_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A malicious aggregator: it shows the odd clients a U3 without the highest one (as if it had dropped) and the
    others the true U3, skips its own signature checks and forwards every signature to every survivor."""
    from fedent.secagg.protocol import ServerSession, pack

    honest = ServerSession.consistency_requests

    def split(self: ServerSession, survivors: Sequence[int]) -> dict[int, bytes]:
        reqs = honest(self, survivors)
        self.pki = None
        lie = pack({"step": "consistency", "survivors": self.u3[:-1]})
        return {c: lie if c % 2 else r for c, r in reqs.items() if c != self.u3[-1]}

    monkeypatch.setattr(ServerSession, "consistency_requests", split)


def test_a_lying_coordinator_is_refused_by_every_client_and_unmasks_nothing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the engine: the survivors shown the true U3 see signatures on another set, those shown the lie see
    a U3 other than the one they signed; all refuse, so no share comes back and the round fails, saying why."""
    lying_server(monkeypatch)
    with pytest.raises(RunError, match="could not unmask the sum: .*refused.*(not valid|differs from the one)"):
        run(tmp_path, "fedavg", True, rounds=1, quorum=0.5)
    # the honest-but-curious option has no consistency round to lie in: the same engine and clients unmask
    secure, _, _ = run(tmp_path, "fedavg", True, rounds=1, secagg_threat="honest-but-curious")
    plain, _, _ = run(tmp_path, "fedavg", False, rounds=1)
    assert rel_err(secure, plain) <= 1e-4
