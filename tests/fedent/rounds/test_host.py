"""The client half (fedent.rounds.host): hosted clients, task parameters from the config, client state in
memory or persisted, one client's failure kept to that client, and the same answers from a host of a subset
(a worker's) as from a host of every client (the simulator's), sequential or vectorised."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from sim_support import tiny_config, tiny_inputs
from torch import Tensor

from fedent.client_store import ClientStateStore
from fedent.rounds.host import ClientHost, ClientStates, ClientTraining, TestShards
from fedent.rounds.vectorised import VectorisedHost
from fedent.strategies.base import ClientState, ClientTask, ClientUpdate, LocalFit, RoundPayload
from fedent.strategies.fedavg import FedAvg
from fedent.strategies.scaffold import Scaffold
from fedent.trainer import LocalTrainer

TRAINING = ClientTraining(lr=0.05, epochs=1, seed=3, batch_size=8)
HOSTS = (ClientHost, VectorisedHost)


def _trainer() -> tuple[LocalTrainer, list[Tensor]]:
    inputs = tiny_inputs(num_clients=6, per_client=20)
    tr = LocalTrainer(inputs.make_model(), inputs.data.x_train, inputs.data.y_train, 8, torch.device("cpu"))
    return tr, [torch.as_tensor(ix) for ix in inputs.client_indices]


def _same(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(a, b, strict=True))


def test_task_parameters_come_from_the_config() -> None:
    cfg = tiny_config("fedavg", lr=0.125, local_epochs=2, seed=9, batch_size=5)
    assert ClientTraining.from_config(cfg) == ClientTraining(lr=0.125, epochs=2, seed=9, batch_size=5)
    tr, ix = _trainer()
    task = ClientHost(tr, {4: ix[4]}, ClientTraining.from_config(cfg)).task(7, 4)
    assert (task.cid, task.round, task.lr, task.epochs, task.seed, task.num_samples) == (4, 7, 0.125, 2, 9, 20)


@pytest.mark.parametrize("host_cls", HOSTS)
def test_a_host_of_some_clients_answers_as_the_host_of_all(host_cls: type[ClientHost]) -> None:
    """A worker hosting clients 2 and 5 fits them exactly as the simulator's host of all six does."""
    tr, ix = _trainer()
    w0 = [p.detach().clone() for p in tr.params]
    everyone = ClientHost(tr, ix, TRAINING).fit(1, [2, 5], w0, FedAvg(), RoundPayload(1))
    some = host_cls(tr, {2: ix[2], 5: ix[5]}, TRAINING).fit(1, [2, 5], w0, FedAvg(), RoundPayload(1))
    assert sorted(some.results) == [2, 5] and not some.failed
    assert all(_same(some.results[c].params, everyone.results[c].params) for c in (2, 5))
    assert not _same(some.results[2].params, w0)  # it trained


def test_clients_not_hosted_are_refused() -> None:
    tr, ix = _trainer()
    host = ClientHost(tr, {2: ix[2]}, TRAINING)
    with pytest.raises(KeyError, match=r"clients \[3\] are not hosted here"):
        host.fit(0, [2, 3], list(tr.params), FedAvg(), RoundPayload(0))


class FailsForClientOne(FedAvg):
    def fit(self, trainer: LocalTrainer, global_params: Sequence[Tensor], payload: RoundPayload, task: ClientTask,
            state: ClientState) -> ClientUpdate:
        if task.cid == 1:
            raise RuntimeError("disk on fire")
        return super().fit(trainer, global_params, payload, task, state)

    def plan_fit(self, trainer: LocalTrainer, global_params: Sequence[Tensor], payload: RoundPayload,
                 task: ClientTask, state: ClientState) -> LocalFit:
        if task.cid == 1:
            raise RuntimeError("disk on fire")
        return super().plan_fit(trainer, global_params, payload, task, state)


@pytest.mark.parametrize("host_cls", HOSTS)
def test_one_clients_exception_is_that_clients_failure(host_cls: type[ClientHost]) -> None:
    tr, ix = _trainer()
    made: list[int] = []
    host = host_cls(tr, ix, TRAINING, on_update=lambda u: made.append(u.cid))
    got = host.fit(0, [0, 1, 2], list(tr.params), FailsForClientOne(), RoundPayload(0))
    assert sorted(got.results) == [0, 2] and made == [0, 2]
    assert got.failed == {1: "fit failed: RuntimeError: disk on fire"}


@pytest.mark.parametrize("host_cls", HOSTS)
def test_persisted_state_resumes_and_a_replayed_round_reads_the_state_before_it(tmp_path: Path,
                                                                                host_cls: type[ClientHost]) -> None:
    """SCAFFOLD's control variate: a host restarted over the same store (a restarted worker) continues from
    it, and a round replayed after an aggregator resume starts from the state saved before that round."""
    tr, ix = _trainer()
    w0 = [p.detach().clone() for p in tr.params]
    strategy = Scaffold()
    strategy.setup(w0, [int(i.numel()) for i in ix])
    payload = strategy.round_payload(0, w0, [])
    memory = host_cls(tr, ix, TRAINING)
    stored = host_cls(tr, ix, TRAINING, ClientStates(ClientStateStore(tmp_path / "s"), tr.device))
    for rnd in (0, 1):
        a = memory.fit(rnd, [3], w0, strategy, payload).results[3]
        b = stored.fit(rnd, [3], w0, strategy, payload).results[3]
        assert _same(a.tensors["delta_c"], b.tensors["delta_c"])
    restarted = host_cls(tr, ix, TRAINING, ClientStates(ClientStateStore(tmp_path / "s"), tr.device))
    again = restarted.state(strategy, 3, 2)
    assert _same(again.tensors["c"], memory.states.memory[3].tensors["c"])
    before_1 = restarted.state(strategy, 3, 1)  # round 1 replayed: the state after round 0
    assert not _same(before_1.tensors["c"], again.tensors["c"])
    fresh = restarted.state(strategy, 3, 0)  # nothing saved before round 0: a new client's state
    assert "c" in again.tensors and fresh.tensors.keys() == strategy.init_client_state(3, 20).tensors.keys()


def test_evaluate_uses_the_hosted_clients_test_shards() -> None:
    tr, ix = _trainer()
    test = tiny_inputs(6, 20).data
    x, y = test.x_test, test.y_test
    shards = {0: torch.arange(0, 5).numpy(), 1: torch.arange(5, 5).numpy()}
    host = ClientHost(tr, {0: ix[0], 1: ix[1]}, TRAINING, test=TestShards(x, y, shards))
    got = host.evaluate([0, 1], list(tr.params), 16).results
    assert (got[0].num_samples, got[1].num_samples) == (5, 0)
    with pytest.raises(ValueError, match="no local test splits"):
        ClientHost(tr, {0: ix[0]}, TRAINING).evaluate([0], list(tr.params), 16)


@pytest.mark.parametrize("host_cls", HOSTS)
def test_oracle_gradients_of_a_worker_host_equal_the_simulators_oracle(host_cls: type[ClientHost]) -> None:
    tr, ix = _trainer()
    point = [p.detach().clone() + 0.01 for p in tr.params]
    want = [ClientHost(tr, ix, TRAINING).oracle().gradient(4, c, point) for c in (1, 4)]
    got = host_cls(tr, {1: ix[1], 4: ix[4]}, TRAINING).gradients(4, [1, 4], point)
    assert all(_same(g, w) for g, w in zip(got, want, strict=True))
    assert not _same(got[0], got[1])
