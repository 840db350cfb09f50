"""P processes reproduce one: a 2-rank gloo run of FedAvg, FedEnt (online, federated evaluation; reduced to
sums and gathered), FedEnt's offline Algorithm 1 on the vectorised host, SCAFFOLD, FedDyn, FedCos and FedAvg under
secure aggregation equals the one-process run (model within 1e-5, same records); the secure one is also the plain
model within the fixed-point resolution."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from distributed_support import COMBINED, cases, rank_main
from sim_support import tiny_inputs

from fedent.config import PrivacyConfig
from fedent.distributed import World, free_port
from fedent.rounds.distributed import RANKS_DIR, _slice, merge
from fedent.rounds.executor import Gathered
from fedent.sim.simulator import run_simulation


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(rank_main, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return out


@pytest.mark.slow  # two spawned ranks (~35 s on a busy 2-core box) and three one-process runs
@pytest.mark.parametrize("name", [n for n, _ in cases()])
def test_two_processes_give_the_one_process_run(two_ranks: Path, tmp_path: Path, name: str) -> None:
    cfg = dict(cases())[name]
    one = run_simulation(cfg, tmp_path / name, progress=False, inputs=tiny_inputs(), plots=False)
    two = torch.load(two_ranks / f"{name}.pt")
    diff = max(float((a - b).abs().max()) for a, b in zip(one.params, two["params"], strict=True))
    assert diff <= 1e-5
    recs = json.loads(two["records"])
    assert [r["clients"] for r in recs] == [r["clients"] for r in one.records]
    assert [r["test_acc"] for r in recs] == [r["test_acc"] for r in one.records]
    for a, b in zip(recs, one.records, strict=True):
        assert a["test_loss"] == pytest.approx(b["test_loss"], abs=1e-5)
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
        if b["fedent"] is not None:
            assert [c["eta"] for c in a["fedent"]["clients"]] == pytest.approx(
                [c["eta"] for c in b["fedent"]["clients"]], abs=1e-7)
            # a reduced round still records φ2_actual and the entropy term (each client's ‖w_i‖² travels beside)
            for k in ("phi2_actual", "entropy"):
                assert a["fedent"][k] == pytest.approx(b["fedent"][k], rel=1e-6), k
    # rank 0 booked every client's uploads (its own and rank 1's), as one process does
    rows_two = json.loads((two_ranks / name / "clients.json").read_text())["clients"]
    rows_one = json.loads((tmp_path / name / "clients.json").read_text())["clients"]
    assert [(r["participation"], r["bytes"]) for r in rows_two] == [(r["participation"], r["bytes"]) for r in rows_one]
    assert [r["worker"] for r in rows_two][:2] == ["simulator rank 0/2", "simulator rank 1/2"]
    status = json.loads((two_ranks / name / "status.json").read_text())
    assert status["phase"] == "done" and status["state"]["processes"] == 2 and status["state"]["gather_s"] > 0
    assert status["state"]["reduce"] == COMBINED[name]
    assert status["state"]["gather_cpu_s"] > 0
    assert (two_ranks / name / RANKS_DIR / "1" / "status.json").is_file()  # rank 1 wrote only under .ranks/


@pytest.mark.slow  # shares the two spawned ranks above
def test_secure_aggregation_over_two_processes_gives_the_plain_one_process_model(two_ranks: Path,
                                                                                  tmp_path: Path) -> None:
    """Each rank runs its own clients' protocol sessions and masks their updates; the masked vectors and the
    protocol's answers are all-gathered, so every rank's server step unmasks the same sum (the masked vectors
    must survive the gather: a gather that dropped them made the round fail with "not masked")."""
    cfg = dict(cases())["fedavg-secure"]
    plain = run_simulation(dataclasses.replace(cfg, privacy=PrivacyConfig()), tmp_path / "plain", progress=False,
                           inputs=tiny_inputs(), plots=False)
    two = torch.load(two_ranks / "fedavg-secure.pt")
    num = sum(float((a.double() - b.double()).norm() ** 2) for a, b in zip(two["params"], plain.params, strict=True))
    rel = num ** 0.5 / sum(float(b.double().norm() ** 2) for b in plain.params) ** 0.5
    assert 0 < rel <= 1e-4  # the fixed-point rounding, nothing more
    recs = json.loads(two["records"])
    assert len(recs) == 2 and all("skipped" not in r["diagnostics"] for r in recs)
    assert [r["clients"] for r in recs] == [r["clients"] for r in plain.records]


def test_owner_is_a_fixed_round_robin_and_one_process_owns_all() -> None:
    w = World(rank=1, size=3)
    assert [w.owner(c) for c in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert w.mine([0, 1, 4, 5, 7]) == [1, 4, 7]
    assert World().mine([3, 1]) == [3, 1] and World().all_gather("x") == ["x"]


def test_test_set_slices_cover_it_once() -> None:
    parts = [_slice(10, World(rank=r, size=3)) for r in range(3)]
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 7), (7, 10)]


def test_merge_of_one_rank_sorts_by_client() -> None:
    got = merge(World(), Gathered({3: "c", 1: "a"}, {2: "why"}))
    assert list(got.results) == [1, 3] and got.failed == {2: "why"}
