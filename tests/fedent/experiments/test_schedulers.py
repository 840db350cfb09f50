"""reproduce's runs handed to a scheduler: waves that respect replays, submitit (debug and Slurm submission
text), Ray (a local cluster, slow); resuming skips what is settled, as the pool does."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fedent.experiments.plan import RunSpec, build_plan
from fedent.experiments.profiles import Profile, Row, Section, Setting
from fedent.experiments.reproduce import RunOutcome
from fedent.experiments.schedulers import SubmititBackend, run_external, submitit_executor

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _profile(replay: bool = True) -> Profile:
    base = {"name": "tiny", "data": {"name": "synthetic", "num_clients": 4, "partition": "iid",
                                     "synthetic_train": 48, "synthetic_test": 20},
            "train": {"rounds": 2, "fraction": 0.5, "local_epochs": 1, "batch_size": 4, "lr": 0.1, "device": "cpu"}}
    rows = [Row("fedavg", "fedavg"), Row("fedent", "fedent")]
    if replay:
        rows.append(Row("fedavg-replay", "fedavg", (("replay", "per_client"),), replay_of="fedent"))
    return Profile("tiny", "test", (Setting("pathological", "tiny", base, (), "mnist"),), tuple(rows),
                   (Section("main", "Table", ("pathological",), tuple(r.label for r in rows)),))


class Recorder:
    """A backend that runs nothing: records each wave and answers with the outcomes it was told."""

    def __init__(self, status: dict[str, str]) -> None:
        self.status, self.waves = status, []  # type: ignore[var-annotated]

    def run(self, specs: Sequence[RunSpec]) -> Iterator[RunOutcome]:
        self.waves.append([s.row for s in specs])
        for s in specs:
            yield RunOutcome(s.key, self.status.get(s.row, "done"), 0.0)


def test_a_replay_waits_for_the_wave_of_the_run_it_reads(tmp_path: Path) -> None:
    plan = build_plan(_profile(), [0], tmp_path, CONFIGS)
    rec = Recorder({})
    assert [o.status for o in run_external(plan, rec)] == ["done"] * 3
    assert len(rec.waves) == 2 and rec.waves[1] == ["fedavg-replay"] and "fedent" in rec.waves[0]


def test_a_replay_of_a_failed_run_is_not_submitted(tmp_path: Path) -> None:
    plan = build_plan(_profile(), [0], tmp_path, CONFIGS)
    rec = Recorder({"fedent": "failed"})
    got = {o.key.split("/")[1]: (o.status, o.error) for o in run_external(plan, rec)}
    assert got["fedavg-replay-s0"][0] == "failed" and "needs pathological/fedent-s0" in str(got["fedavg-replay-s0"][1])
    assert len(rec.waves) == 1 and "fedavg-replay" not in rec.waves[0]


def test_submitit_runs_the_plan_and_a_second_pass_skips_it(tmp_path: Path) -> None:
    plan = build_plan(_profile(replay=False), [0], tmp_path / "out", CONFIGS)
    ex = submitit_executor("debug", tmp_path / "jobs")
    assert [o.status for o in run_external(plan, SubmititBackend(ex))] == ["done", "done"]
    assert all((s.run_dir / "model_final.pt").is_file() for s in plan.runs)
    assert [o.status for o in run_external(plan, SubmititBackend(ex))] == ["skipped", "skipped"]


def test_slurm_submission_names_partition_gpus_and_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Slurm here: a stand-in ``srun`` lets submitit build the sbatch script, which is what it would submit."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_ / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    ex = submitit_executor("slurm", tmp_path / "jobs", partition="gpu", gpus_per_run=1, cpus_per_run=4,
                           timeout_min=30, parallel=8)
    text = ex._executor._make_submission_file_text("python -m x", "UID")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --time=30",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --job-name=fedent-reproduce"):
        assert line in text
    assert ex._executor.parameters["array_parallelism"] == 8


@pytest.mark.slow  # starts a local Ray cluster (~20 s)
def test_ray_runs_the_plan(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from fedent.experiments.schedulers import RayBackend

    plan = build_plan(_profile(replay=False), [0], tmp_path / "out", CONFIGS)
    backend = RayBackend(None, 0.0, 1.0, {"num_cpus": 1, "include_dashboard": False})
    try:
        assert sorted(o.status for o in run_external(plan, backend)) == ["done", "done"]
    finally:
        backend.close()
    assert all((s.run_dir / "model_final.pt").is_file() for s in plan.runs)
