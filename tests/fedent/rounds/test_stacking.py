"""Runs stacked in one step (fedent.rounds.stacking) against the same runs alone: same clients, same models.

Each test's runs are real threads meeting in a real ``TrainerStack``; every thread is joined with a timeout, so a
stack that waits for a run that will never come fails the test instead of hanging it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from vectorised_support import DEVICES, TOL, config, max_diff, uneven_inputs

from fedent.rounds.stacking import StackMember, TrainerStack, stack_key
from fedent.runlog import read_json
from fedent.sim.simulator import run_simulation
from fedent.trainer import LocalTrainer
from fedent.vectorised_trainer import ClientRun, GradientRequest, VectorisedTrainer


def seeded_conv_model(seed: int = 3) -> nn.Module:
    """conv_model's shape with its own generator (threads building models must not share the global seed)."""
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(48, 4))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def trainer(device: str, seed: int = 3, x: torch.Tensor | None = None) -> LocalTrainer:
    inputs = uneven_inputs()
    return LocalTrainer(seeded_conv_model(seed), inputs.data.x_train if x is None else x, inputs.data.y_train, 8,
                        torch.device(device))


def runs_of(tr: LocalTrainer, cids: Sequence[int], rates: Sequence[float], seed: int) -> list[ClientRun]:
    inputs = uneven_inputs()
    return [ClientRun(torch.as_tensor(inputs.client_indices[c]), torch.Generator().manual_seed(seed * 100 + c), r)
            for c, r in zip(cids, rates, strict=True)]


def in_threads(jobs: Sequence[Callable[[], Any]], timeout: float = 120.0) -> list[Any]:
    """Run each job in its own thread; their results (or raised errors) in order; fails if any hangs."""
    out: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            out[i] = jobs[i]()
        except Exception as e:  # noqa: BLE001 - returned for the test to inspect
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a stacked run hung"
    return out


def two_stacked_runs() -> tuple[TrainerStack, list[Any], Callable[[], list[Any]]]:
    """Two runs (3 and 2 clients, their own models and rates) joined to a new stack: the stack, each run's
    one-epoch result alone, and a function that trains both through the stack in threads."""
    trainers = [trainer("cpu", seed=s) for s in (3, 4)]
    starts = [[p.detach().clone() for p in tr.params] for tr in trainers]
    cids, rates = ([0, 1, 2], [3, 4]), ([0.01, 0.2, 0.05], [0.1, 0.3])
    alone = [VectorisedTrainer(tr).train(starts[k], runs_of(tr, cids[k], rates[k], k), 1)
             for k, tr in enumerate(trainers)]
    stack = TrainerStack(2)
    members = [seat.join(VectorisedTrainer(tr), "same") for seat, tr in zip(stack.seats(), trainers, strict=True)]
    return stack, alone, lambda: in_threads([lambda k=k: members[k].train(starts[k], runs_of(
        trainers[k], cids[k], rates[k], k), 1) for k in range(2)])


@pytest.mark.parametrize("dp", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_stacked_training_gives_each_run_what_it_gets_alone(device: str, dp: bool) -> None:
    """Three runs, each from its own model, its own clients and rates: one merged step, the alone results (under
    local DP too: each client's clip and noise, drawn from its own generator)."""
    from fedent.privacy.dpsgd import DPSGD

    trainers = [trainer(device, seed=s) for s in (3, 4, 5)]
    for tr in trainers:
        tr.use_dp(DPSGD(clip_norm=0.05, noise_multiplier=2.0) if dp else None)
    starts = [[p.detach().clone() for p in tr.params] for tr in trainers]
    cids = ([0, 1, 2], [3, 4], [5, 6, 7, 1])
    rates = ([0.01, 0.2, 0.05], [0.1, 0.3], [0.05, 0.05, 0.2, 0.1])
    alone = [VectorisedTrainer(tr).train(w, runs_of(tr, c, r, k), 2)
             for k, (tr, w, c, r) in enumerate(zip(trainers, starts, cids, rates, strict=True))]
    stack = TrainerStack(3)
    members = [seat.join(VectorisedTrainer(tr), "same") for seat, tr in zip(stack.seats(), trainers, strict=True)]
    assert all(isinstance(m, StackMember) for m in members)
    got = in_threads([lambda k=k: members[k].train(starts[k], runs_of(trainers[k], cids[k], rates[k], k), 2)
                      for k in range(3)])
    assert stack.merged_calls == 3 and stack.steps == 1  # one step trained all nine clients
    for g, a in zip(got, alone, strict=True):
        assert len(g) == len(a)
        for (gp, gr), (ap, ar) in zip(g, a, strict=True):
            assert gr.steps == ar.steps and gr.loss == pytest.approx(ar.loss, rel=1e-5)
            assert max_diff(gp, ap) <= TOL
    # what the equality is worth: the runs' models really differ, so a mix-up of starts would show
    assert max_diff(got[0][0][0], got[1][0][0]) > 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_stacked_gradients_are_taken_at_each_runs_own_point(device: str) -> None:
    trainers = [trainer(device, seed=s) for s in (3, 4)]
    points = [[p.detach().clone() for p in tr.params] for tr in trainers]
    inputs = uneven_inputs()

    def reqs(k: int) -> list[GradientRequest]:
        return [GradientRequest(torch.as_tensor(inputs.client_indices[c]), torch.Generator().manual_seed(10 * k + c))
                for c in (0, 2, 5)]

    alone = [VectorisedTrainer(tr).gradients(points[k], reqs(k)) for k, tr in enumerate(trainers)]
    stack = TrainerStack(2)
    members = [seat.join(VectorisedTrainer(tr), "same") for seat, tr in zip(stack.seats(), trainers, strict=True)]
    got = in_threads([lambda k=k: members[k].gradients(points[k], reqs(k)) for k in range(2)])
    assert stack.merged_calls == 2
    for g, a in zip(got, alone, strict=True):
        for gg, aa in zip(g, a, strict=True):
            assert max_diff(gg, aa) <= TOL
    assert max_diff(got[0][0], got[1][0]) > 1e-3  # two points, two gradients


def test_a_run_that_leaves_is_not_waited_for_and_different_calls_run_apart() -> None:
    """One run trains while the other takes gradients (two groups in one flush); then one run leaves and the
    other's next calls run at once."""
    trs = [trainer("cpu", seed=s) for s in (3, 4)]
    w = [[p.detach().clone() for p in tr.params] for tr in trs]
    stack = TrainerStack(2)
    seats = stack.seats()
    members = [seat.join(VectorisedTrainer(tr), "same") for seat, tr in zip(seats, trs, strict=True)]
    inputs = uneven_inputs()
    req = [GradientRequest(torch.as_tensor(inputs.client_indices[1]), torch.Generator().manual_seed(1))]
    got = in_threads([lambda: members[0].train(w[0], runs_of(trs[0], [0], [0.1], 0), 1),
                      lambda: members[1].gradients(w[1], req)])
    assert stack.merged_calls == 0  # nothing to merge: a train and a gradient call
    want = VectorisedTrainer(trs[0]).train(w[0], runs_of(trs[0], [0], [0.1], 0), 1)
    assert max_diff(got[0][0][0], want[0][0]) <= TOL
    seats[1].leave()
    seats[1].leave()  # idempotent
    again = in_threads([lambda: members[0].train(w[0], runs_of(trs[0], [0], [0.1], 0), 1)], timeout=60)
    assert max_diff(again[0][0][0], want[0][0]) <= TOL
    with pytest.raises(RuntimeError, match="not in the stack"):
        members[1].train(w[1], runs_of(trs[1], [0], [0.1], 1), 1)


def test_a_run_whose_call_fails_gets_the_error_and_the_other_its_answer() -> None:
    """A start of the wrong shape breaks the merged step: it is redone alone, from rewound generators, so the
    good run gets exactly its alone result and the bad one its own error."""
    trs = [trainer("cpu", seed=s) for s in (3, 4)]
    w = [[p.detach().clone() for p in tr.params] for tr in trs]
    bad = [torch.zeros(2, 2)] + w[1][1:]
    stack = TrainerStack(2)
    members = [seat.join(VectorisedTrainer(tr), "same") for seat, tr in zip(stack.seats(), trs, strict=True)]
    got = in_threads([lambda: members[0].train(w[0], runs_of(trs[0], [0, 3], [0.1, 0.2], 0), 2),
                      lambda: members[1].train(bad, runs_of(trs[1], [1], [0.1], 1), 2)])
    assert isinstance(got[1], RuntimeError)
    want = VectorisedTrainer(trs[0]).train(w[0], runs_of(trs[0], [0, 3], [0.1, 0.2], 0), 2)
    for (gp, gr), (wp, wr) in zip(got[0], want, strict=True):
        assert gr.loss == pytest.approx(wr.loss, rel=1e-6) and max_diff(gp, wp) <= TOL
    assert stack.merged_calls == 0


def test_a_run_of_another_setting_or_other_data_trains_alone(capsys: pytest.CaptureFixture[str]) -> None:
    stack = TrainerStack(3)
    a, b, c = stack.seats()
    first = a.join(VectorisedTrainer(trainer("cpu")), "setting-1")
    assert isinstance(first, StackMember)
    other_key = b.join(VectorisedTrainer(trainer("cpu")), "setting-2")
    assert not isinstance(other_key, StackMember) and b.left
    x = uneven_inputs().data.x_train.clone()
    x[0] += 1.0
    other_data = c.join(VectorisedTrainer(trainer("cpu", x=x)), "setting-1")
    assert not isinstance(other_data, StackMember) and c.left
    err = capsys.readouterr().err
    assert "another setting" in err and "other training data" in err
    with pytest.raises(RuntimeError, match="already"):
        a.join(VectorisedTrainer(trainer("cpu")), "setting-1")


def test_a_joined_run_shares_the_leaders_data_tensors() -> None:
    stack = TrainerStack(2)
    a, b = stack.seats()
    lead, other = trainer("cpu"), trainer("cpu")
    assert other.x is not lead.x
    a.join(VectorisedTrainer(lead), "k")
    b.join(VectorisedTrainer(other), "k")
    assert other.x is lead.x and other.y is lead.y


def stacked_runs(tmp: Path, runs: Sequence[tuple[str, int]], stack: bool, clients: Sequence[int] = (),
                 stacks: list[TrainerStack] | None = None) -> list[Any]:
    """Whole simulations (algorithm, seed), stacked in threads or one after another alone; ``clients``: each
    run's partition size (8 unless given: another count makes the run fail inside run_simulation)."""
    def one(k: int, seat: Any = None) -> Any:
        alg, seed = runs[k]
        inputs = dataclasses.replace(uneven_inputs(clients[k] if clients else 8),
                                     make_model=lambda s=seed: seeded_conv_model(s))
        return run_simulation(config(alg, "vectorised", "cpu", seed=seed), tmp / f"{'stack' if stack else 'alone'}-{k}",  # type: ignore[arg-type]
                              inputs=inputs, progress=False, plots=False, seat=seat)

    if not stack:
        return [one(k) for k in range(len(runs))]
    ts = TrainerStack(len(runs))
    if stacks is not None:
        stacks.append(ts)
    return in_threads([lambda k=k, s=s: one(k, s) for k, s in enumerate(ts.seats())], timeout=300)


def test_whole_runs_of_different_algorithms_and_seeds_stacked_give_their_alone_models(tmp_path: Path) -> None:
    """FedAvg, FedEnt (probes, Algorithm 1, its own rates) and FedProx (a correction), each its own seed and
    model: stacked in threads, every final model is the one the run gives alone, and status.json says so."""
    runs = [("fedavg", 0), ("fedent", 1), ("fedprox", 2)]
    alone = stacked_runs(tmp_path, runs, stack=False)
    stacks: list[TrainerStack] = []
    got = stacked_runs(tmp_path, runs, stack=True, stacks=stacks)
    assert stacks[0].merged_calls >= 2  # some calls ran merged (FedEnt's probes put it out of step at times)
    for g, a in zip(got, alone, strict=True):
        assert not isinstance(g, Exception), g
        assert max_diff(g.params, a.params) <= TOL
        assert [r["round"] for r in g.records] == [1, 2, 3]
        assert read_json(g.run_dir / "status.json")["state"]["stacked_runs"] == 3
    assert max_diff(got[0].params, got[1].params) > 1e-2


def test_a_stacked_run_that_fails_does_not_stop_the_others(tmp_path: Path) -> None:
    """A run whose partition does not match its config fails before its host exists; the other run finishes
    (run_simulation left the failed run's seat)."""
    got = stacked_runs(tmp_path, [("fedavg", 0), ("fedavg", 1)], stack=True, clients=[8, 6])
    assert not isinstance(got[0], Exception) and len(got[0].records) == 3
    assert isinstance(got[1], Exception) and "num_clients" in str(got[1])


def test_stack_key_ignores_rates_algorithms_and_seeds_but_not_the_training_form() -> None:
    base = stack_key(config("fedavg", "vectorised", "cpu"))  # type: ignore[arg-type]
    assert stack_key(config("fedent", "vectorised", "cpu", seed=4, lr=0.3, rounds=9)) == base  # type: ignore[arg-type]
    for change in ({"batch_size": 4}, {"local_epochs": 3}, {"conv": "looped"}, {"precision": "tf32"}):
        assert stack_key(config("fedavg", "vectorised", "cpu", **change)) != base  # type: ignore[arg-type]


def test_a_model_with_other_buffers_trains_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """The merged step runs the leader's model with the leader's buffers: a run whose model holds other buffer
    values (a plug-in's fixed scale) would silently train with the leader's, so it trains alone."""
    data = uneven_inputs().data

    def scaled(scale: float) -> VectorisedTrainer:
        m = seeded_conv_model()
        m.register_buffer("scale", torch.tensor(scale))
        return VectorisedTrainer(LocalTrainer(m, data.x_train, data.y_train, 8, torch.device("cpu")))

    a, b, c = TrainerStack(3).seats()
    assert isinstance(a.join(scaled(1.0), "k"), StackMember)
    assert not isinstance(b.join(scaled(2.0), "k"), StackMember)
    assert isinstance(c.join(scaled(1.0), "k"), StackMember)
    assert "other model buffers" in capsys.readouterr().err


def test_a_masked_step_leaves_the_client_exactly_as_it_was_even_on_a_non_finite_padding_batch() -> None:
    """A client with fewer steps than the longest of the step (more so when runs are stacked) takes masked steps
    on a padding batch (sample 0). Where that batch's gradient is not finite (here sample 0 is inf), the masked
    steps must still change nothing: the client ends as it does trained alone."""
    inputs = uneven_inputs()
    x = inputs.data.x_train.clone()
    x[0] = float("inf")
    tr = trainer("cpu", x=x)
    w0 = [p.detach().clone() for p in tr.params]
    pool = [i for i in range(1, int(x.shape[0]))]
    short, long = torch.tensor(pool[:16]), torch.tensor(pool[16:48])  # 2 and 4 full batches of 8: no padding inside
    runs = [ClientRun(short, torch.Generator().manual_seed(1), 0.1), ClientRun(long, torch.Generator().manual_seed(2),
                                                                               0.1)]
    got = VectorisedTrainer(tr).train(w0, runs, 1)
    tr.load(w0)
    alone = tr.train(short, 0.1, 1, torch.Generator().manual_seed(1))
    assert got[0][1].steps == alone.steps == 2 and got[1][1].steps == 4
    assert all(bool(torch.isfinite(p).all()) for p in got[0][0])
    assert max_diff(got[0][0], list(tr.params)) <= TOL and got[0][1].loss == pytest.approx(alone.loss, rel=1e-5)


def test_running_out_of_device_memory_halves_the_merged_step_and_keeps_every_answer(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A merged step that runs out of memory (simulated: the leader's step refuses more than 2 clients) is
    redone, from rewound generators, in steps of half as many clients until it fits; every run gets its alone
    result, and the stack keeps the smaller size."""
    from fedent.rounds.stacking import OUT_OF_MEMORY

    stack, alone, train_both = two_stacked_runs()
    lead = stack.leader
    assert lead is not None
    real = lead.train
    sizes: list[int] = []

    def small_memory(start: Any, runs: Sequence[ClientRun], epochs: int) -> Any:
        sizes.append(len(runs))
        if len(runs) > 2:
            raise OUT_OF_MEMORY("CUDA out of memory (simulated)")
        return real(start, runs, epochs)

    lead.train = small_memory  # type: ignore[method-assign]
    got = train_both()
    assert sizes[:2] == [5, 2] and stack.cap == 2 and stack.merged_calls == 2
    for g, a in zip(got, alone, strict=True):
        for (gp, gr), (ap, ar) in zip(g, a, strict=True):
            assert gr.loss == pytest.approx(ar.loss, rel=1e-6) and max_diff(gp, ap) <= TOL
    assert "out of device memory at 5 clients a step; now 2" in capsys.readouterr().err


def test_runs_that_train_alone_beside_each_other_keep_their_dropout_draws(tmp_path: Path) -> None:
    """Runs in threads that cannot stack (a dropout model on the sequential host) train at the same time; their
    dropout masks come from torch's process-wide generator, which each takes in turn (fedent.rng.GLOBAL_RNG), so
    each ends with the model it gets alone (without the turns: 0.05 and 0.07 apart)."""
    from fedent.rounds.stacking import side_by_side

    def dropout_model(seed: int) -> nn.Module:
        g = torch.Generator().manual_seed(seed)
        m = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(0.3), nn.Linear(48, 4))
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        return m

    def one(k: int, tag: str, seat: Any = None) -> Any:
        inputs = dataclasses.replace(uneven_inputs(8), make_model=lambda s=k: dropout_model(s))
        return run_simulation(config("fedavg", "auto", "cpu", seed=k), tmp_path / f"{tag}-{k}",  # type: ignore[arg-type]
                              inputs=inputs, progress=False, plots=False, seat=seat)

    alone = [one(k, "alone") for k in (0, 1)]
    got = side_by_side([lambda seat, k=k: one(k, "side", seat) for k in (0, 1)])
    for g, a in zip(got, alone, strict=True):
        assert not isinstance(g, BaseException), g
        assert max_diff(g.params, a.params) == 0.0


def test_on_the_cpu_a_merged_step_holds_what_a_share_of_the_memory_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight stacked runs of 100 MNIST-CNN clients in one CPU step went past 24 GB: the stack cuts its merged steps
    to ``cpu_memory_capacity`` clients (here made 2), with the same answers."""
    import fedent.rounds.vectorised as vec

    monkeypatch.setattr(vec, "cpu_memory_capacity", lambda start: 2)
    stack, alone, train_both = two_stacked_runs()
    got = train_both()
    assert stack.cap == 2 and stack.steps == 3 and stack.merged_calls == 2  # 5 clients in steps of 2, 2, 1
    for g, a in zip(got, alone, strict=True):
        for (gp, _), (ap, _) in zip(g, a, strict=True):
            assert max_diff(gp, ap) <= TOL
    real = vec.CPU_MEMORY_SHARE * 8 * 2**30 // (vec.CPU_BYTES_PER_PARAM * 1_663_370)
    assert 20 <= real <= 60  # the rule on an 8 GB machine: tens of MNIST-CNN clients a step, not hundreds


def test_a_stopped_stack_stops_every_run_at_its_next_call() -> None:
    """SIGTERM in the command's thread (``side_by_side``): the stack raises ``Stopped`` with the signal in every
    run's thread, in the call it waits in and in any later one, so each engine ends ``stopped``."""
    from fedent.signals import Stopped

    trs = [trainer("cpu", seed=s) for s in (3, 4)]
    w = [[p.detach().clone() for p in tr.params] for tr in trs]
    stack = TrainerStack(3)  # a third run never comes: the two calls wait
    members = [seat.join(VectorisedTrainer(tr), "same") for seat, tr in zip(stack.seats()[:2], trs, strict=True)]
    got: list[Any] = []

    def call(k: int) -> None:
        try:
            members[k].train(w[k], runs_of(trs[k], [0], [0.1], k), 1)
        except BaseException as e:  # noqa: BLE001 - inspected below
            got.append(e)

    threads = [threading.Thread(target=call, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(stack._waiting) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stack.stop(Stopped("SIGTERM"))
    for t in threads:
        t.join(30)
    assert [type(e).__name__ for e in got] == ["Stopped", "Stopped"]
    assert {e.signame for e in got} == {"SIGTERM"}
    with pytest.raises(Stopped):
        members[0].train(w[0], runs_of(trs[0], [0], [0.1], 0), 1)
