"""A seeded chaos harness: SIGKILL a random service process at a random moment, restart it, repeat.

Each run is a real cluster on loopback (``python -m server``, for FedEnt ``python -m estimator`` serving
the per-round φ2 solve, two ``python -m client`` workers persisting client state), every client in every
round, quorum 1.0 with retries. A seeded ``random.Random`` picks each victim (aggregator, estimator,
worker-0, worker-1) and how long to wait before killing it; the victim is restarted on its port with the
same run directory / state directory at once. Recovered means the run has logged two rounds past the
count it had when the kill landed (the round in flight, then one wholly after the kill), or finished.
Every run must end ``done`` with each round logged once and the model of the uninterrupted in-process
simulation (1e-5 relative): a kill may cost time, never a different model.

Used by ``tests/system/test_chaos.py`` (a few kills in CI) and ``benchmarks/chaos.py`` (20+ kills, a report).
"""

from __future__ import annotations

import json
import random
import signal
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import procs as P
import torch

from fedent.model_file import load_model_file
from fedent.runlog import read_json, read_metrics

ALGORITHMS = ("fedent", "scaffold")
CLIENT_GROUPS = {1: ("0-3",), 2: ("0-1", "2-3")}  # workers -> the clients each hosts


def config_text(algorithm: str, rounds: int) -> str:
    """Tiny and deterministic: 4 synthetic clients, every one in every round."""
    algo = "{name: fedent, estimator: online}" if algorithm == "fedent" else f"{{name: {algorithm}}}"
    return f"""\
name: chaos
data: {{name: synthetic, num_clients: 4, partition: iid, synthetic_train: 40, synthetic_test: 20}}
model: {{name: mnist-cnn}}
train: {{rounds: {rounds}, fraction: 1.0, local_epochs: 1, batch_size: 10, lr: 0.05, seed: 3, device: cpu}}
algorithm: {algo}
"""


@dataclass
class Kill:
    run: int
    algorithm: str
    victim: str
    after_s: float  # the seeded wait before the kill
    rounds_logged: int  # when it was killed
    recover_s: float  # kill -> two more rounds logged (or the run finished)


@dataclass
class RunResult:
    run: int
    algorithm: str
    rounds: int
    kills: int
    wall_s: float
    relative_error: float | None  # final model vs the simulation (None: no final model)
    failure: str = ""  # the check that failed (the run still counts in the report)


@dataclass
class ChaosReport:
    seed: int
    kills: list[Kill] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)
    crash: str = ""  # what stopped the harness before it finished (the report is written all the same)

    def summary(self) -> dict[str, Any]:
        rec = [k.recover_s for k in self.kills]
        by_victim: dict[str, int] = {}
        for k in self.kills:
            by_victim[k.victim] = by_victim.get(k.victim, 0) + 1
        return {
            "seed": self.seed, "kills": len(self.kills), "recoveries": len(rec), "by_process": by_victim,
            "recover_s": {"median": statistics.median(rec), "max": max(rec), "min": min(rec)} if rec else {},
            "runs": len(self.runs),
            "runs_equal_to_simulation": sum(not r.failure and r.relative_error is not None
                                            and r.relative_error <= 1e-5 for r in self.runs),
            "max_relative_error": max((r.relative_error for r in self.runs if r.relative_error is not None),
                                      default=None),
        }

    def to_json(self) -> str:
        return json.dumps({"summary": self.summary(), "crash": self.crash, "kills": [asdict(k) for k in self.kills],
                           "runs": [asdict(r) for r in self.runs]}, indent=1)


class ChaosRun:
    """One cluster run whose processes can be killed and restarted by role."""

    def __init__(self, workdir: Path, index: int, algorithm: str, rounds: int, procs: P.Procs,
                 workers: int = 2) -> None:
        self.dir = workdir / f"run{index}-{algorithm}"
        self.dir.mkdir(parents=True)
        self.index, self.algorithm, self.rounds, self.procs = index, algorithm, rounds, procs
        self.cfg = self.dir / "cfg.yaml"
        self.cfg.write_text(config_text(algorithm, rounds))
        self.out = self.dir / "run"
        self.port, self.est_port = P.free_port(), P.free_port()
        self.live: dict[str, subprocess.Popen[str]] = {}
        self.groups = CLIENT_GROUPS[workers]
        self.starts = 0

    @property
    def roles(self) -> list[str]:
        return list(self.live)

    def start(self, role: str) -> None:
        self.starts += 1
        log = self.dir / f"{role}.log"
        if role == "aggregator":
            # a restarted worker may take a while to import torch on a loaded box: wait for it, never skip
            extra = ["--quorum", "1.0", "--round-retries", "20", "--register-timeout", "180"]
            if self.algorithm == "fedent":
                extra += ["--estimator", f"127.0.0.1:{self.est_port}"]
            self.live[role] = P.aggregator(self.procs, self.cfg, self.out, self.port,
                                           self.dir / f"port-{self.starts}", *extra, log=log)
        elif role == "estimator":
            self.live[role] = P.estimator(self.procs, self.est_port, self.dir / f"est-port-{self.starts}", log)
        else:
            i = int(role.rsplit("-", 1)[1])
            # keep reconnecting as long as a restart may take: the aggregator's restart on a loaded box can
            # take longer than the helpers' 200 tries x 0.3 s, and a worker that gives up ends the run
            self.live[role] = P.worker(self.procs, self.port, self.groups[i], f"w{i}", "--state-dir",
                                       str(self.dir / "state" / f"w{i}"), "--reconnect-attempts", "100000",
                                       "--reconnect-window", "900", "--backoff-cap", "1.0", log=log)

    def start_all(self) -> None:
        workers = [f"worker-{i}" for i in range(len(self.groups))]
        for role in (["estimator"] if self.algorithm == "fedent" else []) + ["aggregator", *workers]:
            self.start(role)

    def logged(self) -> int:
        return P.rounds_logged(self.out)

    def done(self) -> bool:
        """The aggregator exited 0; any process that exits otherwise by itself fails the harness at once."""
        for role, p in self.live.items():
            code = p.poll()
            if code not in (None, 0):
                raise AssertionError(f"the {role} of run {self.index} exited with {code}:\n{self._tail(role)}")
        return self.live["aggregator"].poll() == 0

    def _tail(self, role: str) -> str:
        path = self.dir / f"{role}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def kill(self, role: str) -> None:
        p = self.live[role]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(10)

    def wait_recovered(self, before: int, timeout_s: float) -> None:
        P.wait_for(lambda: self.done() or self.logged() >= before + 2,
                   f"run {self.index} to log two rounds after the kill", timeout_s)


def _pause(run: ChaosRun, seconds: float) -> bool:
    """Sleep up to ``seconds``; False as soon as the run is done (nothing left to kill)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if run.done():
            return False
        time.sleep(0.02)
    return not run.done()


def chaos(workdir: Path, kills: int, seed: int, rounds: int = 12, max_wait_s: float = 3.0,
          min_runs: int = 2, workers: int = 2, recover_timeout_s: float = 180.0, log: Any = None,
          report: ChaosReport | None = None) -> ChaosReport:
    """Runs (FedEnt, SCAFFOLD, FedEnt, ...) until ``kills`` kills have landed in unfinished runs and at least
    ``min_runs`` runs were made; each run gets an even share of the kills still to do. ``workers``: 1 or 2
    worker processes per run (1 starts faster where cores are few). ``report`` (filled in as it goes) stays
    with the caller when the harness itself fails, so what happened until then can still be written."""
    rng = random.Random(seed)
    report = ChaosReport(seed) if report is None else report
    references: dict[str, list[torch.Tensor]] = {}
    index = 0
    while len(report.kills) < kills or index < min_runs:
        algorithm = ALGORITHMS[index % len(ALGORITHMS)]
        budget = -(-(kills - len(report.kills)) // max(1, min_runs - index))
        procs: P.Procs = []
        try:
            run = ChaosRun(workdir, index, algorithm, rounds, procs, workers)
            result = _one_run(run, budget, rng, max_wait_s, recover_timeout_s, report, references, log)
        finally:
            P.stop_all(procs)
        report.runs.append(result)
        index += 1
    return report


def _one_run(run: ChaosRun, budget: int, rng: random.Random, max_wait_s: float, recover_timeout_s: float,
             report: ChaosReport, references: dict[str, list[torch.Tensor]], log: Any) -> RunResult:
    index, algorithm, rounds = run.index, run.algorithm, run.rounds
    if algorithm not in references:
        references[algorithm] = P.simulate(run.dir.parent / f"sim-{algorithm}", config_text(algorithm, rounds))
    t0 = time.monotonic()
    run.start_all()
    done_kills = 0
    while done_kills < budget:
        wait = rng.uniform(0.0, max_wait_s)
        victim = rng.choice(run.roles)
        if not _pause(run, wait):
            break
        before = run.logged()
        run.kill(victim)
        t_kill = time.monotonic()
        run.start(victim)
        run.wait_recovered(before, recover_timeout_s)
        kill = Kill(index, algorithm, victim, round(wait, 3), before, round(time.monotonic() - t_kill, 3))
        report.kills.append(kill)
        done_kills += 1
        if log is not None:
            print(f"kill {len(report.kills)}: run {index} ({algorithm}) {victim} after {wait:.2f}s at "
                  f"{before} rounds logged; recovered in {kill.recover_s:.1f}s", file=log, flush=True)
    P.wait_for(run.done, f"run {index} to finish", recover_timeout_s)
    err: float | None = None
    failure = ""
    try:  # a failed check is a result in the report, not a crash before it is written
        err = P.relative_error(load_model_file(run.out / "model_final.pt").params, references[algorithm])
        assert read_json(run.out / "status.json")["phase"] == "done", "status.json: phase is not done"
        assert [r["round"] for r in read_metrics(run.out / "metrics.jsonl")] == list(range(1, rounds + 1)), \
            "metrics.jsonl does not log every round once"
        P.check_equals_simulation(run.out, references[algorithm], rounds)
    except (AssertionError, OSError, RuntimeError, ValueError, KeyError) as e:
        failure = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}" if str(e) else type(e).__name__
    return RunResult(index, algorithm, rounds, done_kills, round(time.monotonic() - t0, 2), err, failure)
