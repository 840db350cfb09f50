"""A rank of a multi-process simulation for tests (``torch.multiprocessing.spawn`` target; tiny inputs)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from sim_support import tiny_config, tiny_inputs

from fedent.config import ExperimentConfig, PrivacyConfig, config_from_dict
from fedent.distributed import World, rank_env
from fedent.inputs import RunInputs
from fedent.rounds import RoundPolicy


# (name, config) of the cases every test rank runs, one after another in one process group
def cases() -> list[tuple[str, ExperimentConfig]]:
    offline = tiny_config(rounds=2, fraction=0.5, executor="vectorised").to_dict()
    offline["algorithm"] = {"name": "fedent", "estimator": "offline", "max_sweeps": 3}
    return [
        ("fedavg", tiny_config("fedavg", rounds=3, fraction=0.5)),
        ("fedent", tiny_config("fedent", rounds=4, fraction=0.5, evaluation="federated")),
        ("fedent-offline-vectorised", config_from_dict(offline)),
        ("fedavg-secure", dataclasses.replace(tiny_config("fedavg", rounds=2, fraction=0.5),
                                              privacy=PrivacyConfig(secure_aggregation=True))),
        # reduced rounds with a tensor group and uniform weights (SCAFFOLD's Σ y_i and Σ Δc_i), and FedDyn's
        ("scaffold", tiny_config("scaffold", rounds=2, fraction=0.5)),
        ("feddyn", tiny_config("feddyn", rounds=2, fraction=0.5)),
        ("fedcos", tiny_config("fedcos", rounds=2, fraction=0.5)),  # weighed by each client's cosine
        ("fedent-gather", tiny_config("fedent", rounds=4, fraction=0.5, evaluation="federated")),
        # unequal clients, an attacker rejected (at its report, the rounds released on a 0.5 quorum, the weight cap
        # binding) or whose uploads are rejected and its rounds skipped (quorum 1): the records must be one process's
        ("fedavg-rejected", attacked({"attack": "inflate-count", "fraction": 0.2})),  # at its report
        ("fedavg-skipped", attacked({"attack": "scale", "scale": 1e39, "fraction": 0.2})),  # an upload of inf
    ]


def attacked(adversary: dict[str, object]) -> ExperimentConfig:
    d = tiny_config("fedavg", rounds=3, fraction=0.5).to_dict()
    d["adversary"] = adversary
    return config_from_dict(d)


POLICIES = {"fedavg-rejected": RoundPolicy(quorum=0.5, retries=-1), "fedavg-skipped": RoundPolicy(retries=-1)}


def case_inputs(name: str) -> RunInputs:
    """The tiny inputs; the attacked cases' clients hold 40 - 3·cid samples (so the weight cap binds)."""
    base = tiny_inputs()
    if name not in POLICIES:
        return base
    return dataclasses.replace(base, client_indices=tuple(ix[:40 - 3 * c] for c, ix in enumerate(base.client_indices)))


# each case's World.reduce (default auto); and the way each case's rounds are combined under it
REDUCE = {"fedent-gather": "gather"}
COMBINED = {"fedavg": "sum", "fedent": "sum", "fedent-offline-vectorised": "sum", "fedavg-secure": "gather",
            "scaffold": "sum", "feddyn": "sum", "fedcos": "sum", "fedent-gather": "gather",
            "fedavg-rejected": "sum", "fedavg-skipped": "sum"}


def rank_main(rank: int, size: int, port: int, out: str) -> None:
    """Rank ``rank`` of ``size``: every case through ``run_simulation`` with the world; rank 0 saves each
    case's final model and records under ``out/<case>.pt``."""
    from fedent.sim.simulator import run_simulation

    os.environ.update(rank_env(rank, size, port))
    torch.set_num_threads(1)
    world = World.from_env()
    try:
        for name, cfg in cases():
            res = run_simulation(cfg, Path(out) / name, progress=False, inputs=case_inputs(name), plots=False,
                                 world=dataclasses.replace(world, reduce=REDUCE.get(name, "auto")),
                                 policy=POLICIES.get(name))
            if world.leader:
                torch.save({"params": res.params, "records": json.dumps(res.records)}, Path(out) / f"{name}.pt")
    finally:
        world.close()


def ragged_updates(rank: int) -> dict[int, object]:
    """The uploads rank ``rank`` of 2 owns in ``gather_main``: rank 0 three clients of small float32 models,
    rank 1 one client whose model is far larger (so rank 0's buffer is the padded one) with a float64 tensor
    group, a 0-d tensor and a secure-aggregation vector (numpy uint64): every value says whose it is."""
    import numpy as np

    from fedent.strategies.base import ClientUpdate

    def model(cid: int, sizes: tuple[int, ...]) -> list[torch.Tensor]:
        return [torch.arange(n, dtype=torch.float32) * (cid + 1) + k / 7 for k, n in enumerate(sizes)]

    if rank == 0:
        return {c: ClientUpdate(c, model(c, (3 + c, 5)), 10 + c, 0.5 * c, scalars={"eta": c / 3})
                for c in (0, 2, 4)}
    return {1: ClientUpdate(1, model(1, (4000, 7)), 11, 0.25, tensors={"delta_c": [torch.full((2, 3), -0.1,
                                                                                            dtype=torch.float64)]},
                            scalars={"eta": 1 / 3}, masked=np.arange(9, dtype=np.uint64) * np.uint64(2**61 + 1)),
            3: ClientUpdate(3, [torch.tensor(float("nan")), torch.zeros(0, 2), torch.tensor([True, False])], 13,
                            -0.0)}


def gather_main(rank: int, size: int, port: int, out: str) -> None:
    """Rank ``rank`` of 2 merges ``ragged_updates`` through gloo, twice (the second time through the first one's
    kept buffers, the ranks' parts swapped); each rank pickles what it got to ``out/rank<r>.pkl`` (numpy arrays
    inside: pickle, not torch.save)."""
    import pickle

    from fedent.rounds.distributed import merge
    from fedent.rounds.executor import Gathered
    from fedent.rounds.flatgather import Buffers

    os.environ.update(rank_env(rank, size, port))
    torch.set_num_threads(1)
    world = World.from_env()
    try:
        kept = Buffers()
        got = merge(world, Gathered(ragged_updates(rank), {9: f"rank {rank} lost it"} if rank else {}), kept)
        # again through the same kept buffers, the ranks' parts swapped: the padded rank is now rank 1
        again = merge(world, Gathered(ragged_updates(1 - rank)), kept)
        (Path(out) / f"rank{rank}.pkl").write_bytes(pickle.dumps((got.results, got.failed, again.results)))
    finally:
        world.close()


class FaultyHost:
    """The in-process executor's ``fit`` for ``fault_main``: each client's update is ``model(cid)``; on rank 1 it
    raises (``fault == "fit"``) or hands one client a model of the wrong shape, which only the rank's own adding
    into the sum trips over (``fault == "add"``: the acceptance rule is the identity here)."""

    def __init__(self, rank: int) -> None:
        from types import SimpleNamespace

        self.rank, self.fault = rank, "none"
        self.host = SimpleNamespace(on_update=None, hosted=[], trainer=SimpleNamespace(device=torch.device("cpu")))

    def fit(self, rnd: int, cids: list[int], global_params: list[torch.Tensor], strategy: object,
            payload: object) -> object:
        from fedent.rounds.executor import Gathered
        from fedent.strategies.base import ClientUpdate

        if self.rank == 1 and self.fault == "fit":
            raise RuntimeError("rank 1 ran out of memory (injected)")
        ups = {c: ClientUpdate(c, [torch.full((3, 2), float(c)), torch.full((4,), -float(c))], 10, 0.0)
               for c in cids}
        if self.rank == 1 and self.fault == "add":
            ups[cids[0]].params[0] = torch.zeros(100)  # larger than the whole sum
        return Gathered(ups)

    def probe(self, rnd: int, cids: list[int], global_params: list[torch.Tensor], strategy: object) -> object:
        from fedent.rounds.executor import Gathered
        from fedent.strategies.base import Probe

        if self.rank == 1 and self.fault == "probe":
            raise RuntimeError("rank 1's probe failed (injected)")
        return Gathered({c: Probe(c, 10, {"a": float(c)}) for c in cids})


def fault_main(rank: int, size: int, port: int, out: str) -> None:
    """Rank ``rank`` of 2, a 20 s collective timeout: a reduced round, a gathered one, then rank 1 failing in its
    own part of a reduced round (before the gather, then while adding into the sum) and of a gathered one; last a
    healthy reduced round. Each outcome (the sum, or the exception's type and message) goes to
    ``out/rank<r>.json``; a rank left waiting would end in gloo's timeout instead."""
    import fedent.distributed as fd
    from fedent.config import RobustConfig
    from fedent.rounds.distributed import DistributedExecutor
    from fedent.strategies.base import RoundPayload
    from fedent.strategies.fedavg import FedAvg

    os.environ.update(rank_env(rank, size, port))
    torch.set_num_threads(1)
    fd.TIMEOUT_S = 20
    world = World.from_env()
    host = FaultyHost(rank)
    ex = DistributedExecutor(host, world, sums=True)  # type: ignore[arg-type]
    w = [torch.zeros(3, 2), torch.zeros(4)]
    outcomes: list[object] = []
    try:
        for mode, fault in (("sum", "none"), ("gather", "none"), ("sum", "fit"), ("sum", "add"),
                            ("gather", "fit"), ("sum", "none"), ("probe", "probe"), ("probe", "none")):
            host.fault = fault
            try:
                if mode == "sum":
                    got = ex.fit_sum(1, [0, 1, 2, 3], w, FedAvg(), RoundPayload(1), lambda g: g, RobustConfig())
                    outcomes.append([float(got.total.weight), got.total.params[0].flatten().tolist(),
                                     got.total.params[1].tolist()])
                elif mode == "probe":
                    probes = ex.probe(1, [0, 1, 2, 3], w, FedAvg())
                    outcomes.append([p.scalars["a"] for p in probes.results.values()])
                else:
                    every = ex.fit(1, [0, 1, 2, 3], w, FedAvg(), RoundPayload(1))
                    outcomes.append(sorted(every.results))
            except Exception as e:  # noqa: BLE001 - recorded for the test to judge
                outcomes.append([type(e).__name__, str(e)])
        outcomes += faulty_oracle_and_evaluator(world)
        outcomes += resumes(ex, rank)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(outcomes))
    finally:
        world.close()


class FaultyOracle:
    """A gradient oracle whose every gradient is the client's id; on rank 1 it raises while ``fail`` is set."""

    def __init__(self, rank: int) -> None:
        self.rank, self.fail = rank, False

    def gradient(self, t: int, cid: int, point: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.rank == 1 and self.fail:
            raise RuntimeError("rank 1's gradient failed (injected)")
        return [torch.full((2,), float(cid))]


class FaultyTrainer:
    """What ``DistributedEvaluator`` asks of a trainer; on rank 1 ``evaluate`` raises while ``fail`` is set."""

    def __init__(self, rank: int) -> None:
        self.rank, self.fail, self.device = rank, False, torch.device("cpu")

    def load(self, params: object) -> None:
        pass

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, float]:
        if self.rank == 1 and self.fail:
            raise RuntimeError("rank 1's evaluation failed (injected)")
        return 1.0, 0.6


def faulty_oracle_and_evaluator(world: World) -> list[object]:
    """Algorithm 1's oracle over the ranks (batched, then one client owned by rank 1) and the split server-side
    evaluation, each healthy, then with rank 1 failing, then healthy again: the outcomes, as ``fault_main``'s."""
    from fedent.rounds.distributed import DistributedEvaluator, DistributedOracle

    oracle, trainer = FaultyOracle(world.rank), FaultyTrainer(world.rank)
    dist_oracle = DistributedOracle(oracle, world, torch.device("cpu"))  # type: ignore[arg-type]
    evaluator = DistributedEvaluator(world, trainer, torch.zeros(10, 1), torch.zeros(10), 5, 0)  # type: ignore[arg-type]
    steps = (lambda: [float(g[0][0]) for g in dist_oracle.gradients(0, [0, 1, 2, 3], [])],
             lambda: [float(v) for v in dist_oracle.gradient(0, 3, [])[0]],
             lambda: list(evaluator.evaluate([])))
    outcomes: list[object] = []
    for step in steps:
        for fail in (False, True, False):
            oracle.fail = trainer.fail = fail
            try:
                outcomes.append(step())
            except Exception as e:  # noqa: BLE001 - recorded for the test to judge
                outcomes.append([type(e).__name__, str(e)])
    return outcomes


def resumes(ex: object, rank: int) -> list[object]:
    """The executor's resume agreement (``DistributedExecutor.resumed``): both ranks at round 3; rank 1's checkpoint
    unreadable; the ranks at different rounds (3 and 2); both at 3 again. The outcomes, as ``fault_main``'s."""
    from fedent.rounds.distributed import DistributedExecutor

    assert isinstance(ex, DistributedExecutor)
    unreadable = RuntimeError("rank 1's checkpoint is unreadable (injected)")
    steps = ((3, None), (None, unreadable) if rank == 1 else (3, None), (3 - rank, None), (3, None))
    outcomes: list[object] = []
    for first, error in steps:
        try:
            ex.resumed(first, error)
            outcomes.append(first)
        except Exception as e:  # noqa: BLE001 - recorded for the test to judge
            outcomes.append([type(e).__name__, str(e)])
    return outcomes
