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
    ]


def rank_main(rank: int, size: int, port: int, out: str) -> None:
    """Rank ``rank`` of ``size``: every case through ``run_simulation`` with the world; rank 0 saves each
    case's final model and records under ``out/<case>.pt``."""
    from fedent.sim.simulator import run_simulation

    os.environ.update(rank_env(rank, size, port))
    torch.set_num_threads(1)
    world = World.from_env()
    try:
        for name, cfg in cases():
            res = run_simulation(cfg, Path(out) / name, progress=False, inputs=tiny_inputs(), plots=False,
                                 world=world)
            if world.leader:
                torch.save({"params": res.params, "records": json.dumps(res.records)}, Path(out) / f"{name}.pt")
    finally:
        world.close()
