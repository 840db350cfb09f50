"""The round loop, written once: the simulator and the cluster aggregator both run ``RoundEngine.run``.

Round t (docs/architecture.md, "Strategy interface"): sample the participants from (seed, t); if the
strategy probes, gather the probes; build the round's payload; gather the fits; aggregate the updates in
cid order; evaluate every ``eval_every`` rounds; append the metrics line and update status.json,
clients.json and estimator.json. A round that misses its quorum is retried with fresh clients or skipped
(``RoundPolicy``); with ``checkpoint_keep`` the run checkpoints every round and resumes after a crash.
With ``privacy:`` set, the accepted updates pass the central-DP release before aggregation, every line logs the
run's ε so far, and a round that would pass ``target_epsilon`` is not run (fedent.privacy.run).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fedent import model_file, provenance, runlog
from fedent.checkpoint import config_fingerprint, list_checkpoints
from fedent.config import ExperimentConfig
from fedent.params import Params, all_finite, clone, num_elements
from fedent.privacy.run import RunPrivacy, released_rounds
from fedent.rng import sample_clients
from fedent.rounds import resume, robust
from fedent.rounds.acceptance import Acceptance, diverged
from fedent.rounds.clients import ClientBook
from fedent.rounds.evaluation import Evaluator
from fedent.rounds.executor import ClientExecutor
from fedent.secagg.coordinator import SecureAggregation
from fedent.secagg.protocol import ProtocolError
from fedent.signals import Stopped, stop_reason
from fedent.strategies.base import ClientUpdate, Probe, SecureSum, Strategy

TRAJECTORY_KEYS = ("phi2_pred", "phi2_actual", "entropy", "guards")


class RunError(RuntimeError):
    """A run that cannot go on (the model diverged, a round missed its quorum on every retry); one line."""


@dataclass(frozen=True)
class RoundPolicy:
    """How a round copes with missing clients, and whether the run checkpoints.

    ``quorum``: the fraction of the sampled clients whose updates a round needs. ``retries``: how often a
    round that missed it is tried again with fresh clients before the run fails; -1 skips such a round
    (logged as ``skipped``) and goes on. ``checkpoint_keep``: checkpoints kept (0: none, no resume).
    """

    quorum: float = 1.0
    retries: int = 0
    checkpoint_keep: int = 0


def is_eval_round(rnd: int, rounds: int, every: int) -> bool:
    """Every ``every`` rounds (counting from 1) and always the last round."""
    return (rnd + 1) % every == 0 or rnd == rounds - 1


def failed_clients(failed: dict[int, str]) -> dict[str, Any]:
    """The ``failed_clients`` diagnostics entry (client id -> why), absent when none failed."""
    return {"failed_clients": {str(c): why for c, why in sorted(failed.items())}} if failed else {}


def missed(got: int, asked: int, what: str, failed: dict[int, str]) -> str:
    """Why a try missed its quorum: the count, and where uploads were rejected as not finite, that local
    training diverged (fedent.experiments.reproduce reads "not finite" as a settled, diverged run)."""
    why = f"{got}/{asked} {what} accepted"
    blew = diverged(failed)
    shown = sorted((c, w) for c, w in failed.items() if c not in blew)[:3]
    if shown:
        more = len(failed) - len(blew) - len(shown)
        why += "; " + "; ".join(f"client {c}: {w}" for c, w in shown) + (f" (+{more} more)" if more else "")
    if blew:
        why += (f"; the local model of client(s) {blew[:5]} is not finite: local training diverged; lower "
                "train.lr (or cap the strategy's rate)")
    return why


def weighted_train_loss(updates: Sequence[ClientUpdate]) -> float | None:
    total = sum(u.num_samples for u in updates)
    if total <= 0:
        return None
    return sum(u.train_loss * u.num_samples for u in updates) / total


class RoundEngine:
    """One run: the strategy, the global model and the run directory, driven round by round over an executor."""

    def __init__(self, cfg: ExperimentConfig, paths: runlog.RunPaths, strategy: Strategy, executor: ClientExecutor,
                 evaluator: Evaluator, initial_params: Params, sizes: Sequence[int],
                 partition_info: dict[str, Any], policy: RoundPolicy | None = None,
                 on_phase: Callable[[str], None] | None = None,
                 on_round: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cfg, self.paths, self.strategy, self.executor = cfg, paths, strategy, executor
        self.evaluator = evaluator
        evaluator.bounds = cfg.robust  # federated evaluation: range-checked, weighted by the capped counts
        self.policy = policy or RoundPolicy()
        self.on_phase, self.on_round = on_phase, on_round
        # called before each checkpoint and before the run is marked done: whatever writes in the background
        # (the simulator's client-state store) is on disk by then, so a checkpoint never outruns the files it needs
        self.before_checkpoint: list[Callable[[], None]] = []
        self.after_run: list[Callable[[], None]] = []  # when the run ends, however it ends (release threads)
        self.seed = cfg.train.seed
        self.rounds = cfg.train.rounds
        self.sizes = list(sizes)
        self.partition_info = partition_info
        self.device = evaluator.trainer.device
        self.global_params: Params = clone(initial_params)
        self.model_bytes = num_elements(self.global_params) * self.global_params[0].element_size()
        self.clients = ClientBook(paths.clients, self.sizes)
        self.metrics = runlog.MetricsLog(paths.metrics)
        self.records: list[dict[str, Any]] = []
        self.trajectory: list[dict[str, Any]] = []
        self.provenance: dict[str, Any] = {}  # this process's, and after a resume the earlier ones' (provenance.json)
        self.estimator_report: dict[str, Any] = {}
        self.acceptance = Acceptance(lambda: self.strategy, lambda: self.global_params, lambda: self.sizes)
        self.rejected: dict[int, str] = {}  # clients whose reported counts were out of bounds: out of the run
        self.privacy = RunPrivacy(cfg)  # privacy: the central release, ε so far, the budget (fedent.privacy)
        self.budget_stop: str | None = None  # why the run ended before its last round (privacy.target_epsilon)
        self.stop = threading.Event()
        # set with ``stop`` by a service that got SIGTERM or SIGINT: the run then ends "stopped" (with the
        # reason), as a simulation interrupted in its own thread does, not "failed"
        self.stop_signal: str | None = None
        # secure aggregation: the round's protocol, and the sum it unmasked (what aggregate_sum reads)
        self.secure = SecureAggregation(cfg.privacy, self.seed) if cfg.privacy.secure_aggregation else None
        self.secure_sum: SecureSum | None = None
        self.phase = "starting"
        self.round: int | None = None
        self.started_at = time.time()
        self.t_start = time.perf_counter()
        executor.bind(self)

    # ---- run files ---------------------------------------------------------------------------------
    def status(self, phase: str, rnd: int | None, **state: Any) -> None:
        """status.json; ``rnd`` is the loop's index (0..R-1), written as the round number 1..R (runlog)."""
        self.phase, self.round = phase, rnd
        runlog.atomic_write_json(self.paths.status, runlog.status_record(
            self.paths.run_id, self.strategy.name, phase, None if rnd is None else rnd + 1, self.rounds,
            self.started_at,
            {"device": str(self.device), "evaluation": self.evaluator.mode, **self.executor.status_fields(),
             **state}))
        if self.on_phase is not None:
            self.on_phase(phase)

    def write_estimator(self) -> None:
        """estimator.json: Algorithm 1's report (offline) and the per-round φ2 trajectory."""
        runlog.atomic_write_json(self.paths.estimator, {"algorithm": self.strategy.name,
                                                        "report": self.estimator_report,
                                                        "round_base": runlog.ROUND_BASE,
                                                        "trajectory": self.trajectory})

    def write_start_files(self) -> None:
        runlog.write_config(self.paths.config, self.cfg.to_dict())
        runlog.atomic_write_json(self.paths.partition, self.partition_info)
        self.provenance = provenance.collect()
        if not list_checkpoints(self.paths.checkpoint):  # else first_round writes it, with the resumed history
            runlog.atomic_write_json(self.paths.provenance, self.provenance)
        self.clients.write()
        self.status("starting", None)

    def save_model(self) -> None:
        """model_final.pt (fedent.model_file: a state_dict with the model's name and the config's hash) written
        atomically (temp file + os.replace): a crash mid-write never leaves a torn model beside a status.json
        that says done."""
        names = [n for n, _ in self.evaluator.trainer.model.named_parameters()]
        runlog.atomic_write_bytes(self.paths.model, model_file.model_bytes(
            self.global_params, names, self.cfg.model.name, config_fingerprint(self.cfg)))

    def adopt_client_data(self, sizes: Sequence[int], info: dict[str, Any]) -> None:
        """Clients whose data lives on the workers: their reported sample counts become the run's (θ_i and every
        sample-weighted rule use them) and partition.json describes what was reported. Called by the executor's
        ``start`` before ``prepare``, so strategies are set up with the reported sizes."""
        self.sizes = [int(n) for n in sizes]
        self.partition_info = {**self.partition_info, **info, "sizes": self.sizes}
        for cid, n in enumerate(self.sizes):
            self.clients.update([cid], samples=n)
        self.rejected.update(robust.check_reports(self.sizes, info.get("test_sizes"), self.cfg.robust))
        for cid, why in self.rejected.items():  # out of the run; a neutral count for the strategies' setup
            self.sizes[cid] = 1
            self.clients.update([cid], state="rejected", last_failure=why)
        runlog.atomic_write_json(self.paths.partition, self.partition_info)
        self.clients.write()

    def check_stop(self) -> None:
        if self.stop.is_set():
            if self.stop_signal is not None:
                raise Stopped(self.stop_signal)
            raise RunError("stopped")

    # ---- before round 0 ------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Algorithm 1 where the strategy needs it (Steps 1-2), then the strategy's own setup."""
        schedule = [sample_clients(self.seed, t, len(self.sizes), self.cfg.train.fraction) for t in range(self.rounds)]
        self.strategy.set_run_plan(schedule, self.cfg.train.lr)
        if self.strategy.capabilities.oracle:
            self.status("estimating", None)
            before = self.strategy
            self.strategy, report = self.executor.prepare(self.strategy, self.global_params, self.sizes, self.rounds)
            if self.strategy is not before:  # rebuilt around a remote estimator (the cluster)
                self.strategy.set_run_plan(schedule, self.cfg.train.lr)
            self.estimator_report = dict(report)
            self.write_estimator()
        self.strategy.setup(self.global_params, self.sizes)

    # ---- one round -----------------------------------------------------------------------------------
    def quorum(self, got: int, asked: int) -> bool:
        return got >= max(1, math.ceil(self.policy.quorum * asked))

    def attempt(self, rnd: int, participants: list[int]) -> tuple[list[ClientUpdate], dict[str, Any]]:
        """One try at round ``rnd``: probe (if the strategy does), payload, fit; every probe and update goes
        through the acceptance rule. Returns the accepted updates sorted by cid and the diagnostics
        (``skipped`` present when the quorum was missed, ``failed_clients`` naming who failed and why)."""
        skipped: dict[str, Any] = {}
        self.secure_sum = None
        probes: list[Probe] = []
        failed: dict[int, str] = {c: self.rejected[c] for c in participants if c in self.rejected}
        participants = [c for c in participants if c not in failed]  # rejected at their report: not asked
        fit_cids = list(participants)
        if self.strategy.capabilities.probe:
            self.status("estimating", rnd)
            got = self.acceptance.probes(self.executor.probe(rnd, participants, self.global_params, self.strategy))
            self.check_stop()
            probes, fit_cids = list(got.results.values()), sorted(got.results)
            failed.update(got.failed)
            if not self.quorum(len(fit_cids), len(participants)):
                skipped["skipped"] = missed(len(fit_cids), len(participants), "probes", failed)
                return [], {**skipped, **failed_clients(failed)}
        payload = self.strategy.round_payload(rnd, self.global_params, robust.cap_probes(self.cfg.robust, probes))
        self.status("training", rnd)
        if self.secure is not None:  # keys and shares before training (fedent.secagg.coordinator)
            fit_cids, why = self.secure.begin(rnd, fit_cids, self.strategy, self.executor.secure_exchange)
            failed.update(why)
        summed: dict[str, Any] = {}
        fit_sum = getattr(self.executor, "fit_sum", None) if getattr(self.executor, "sums", False) else None
        if fit_sum is not None:  # a reduced round (fedent.rounds.distributed): the clear parts and the sum
            got_sum = fit_sum(rnd, fit_cids, self.global_params, self.strategy, payload, self.acceptance.updates,
                              self.cfg.robust)
            fits, self.secure_sum, summed = got_sum.updates, got_sum.total, got_sum.diagnostics
        else:
            fits = self.acceptance.updates(self.executor.fit(rnd, fit_cids, self.global_params, self.strategy,
                                                             payload))
        self.check_stop()
        updates = list(fits.results.values())
        failed.update(fits.failed)
        if not self.quorum(len(updates), len(participants)):
            skipped["skipped"] = missed(len(updates), len(participants), "updates", failed)
        elif self.secure is not None:
            try:
                self.secure_sum = self.secure.finish(rnd, updates, self.global_params, self.strategy,
                                                     self.executor.secure_exchange)
            except ProtocolError as e:
                skipped["skipped"] = f"secure aggregation could not unmask the sum: {e}"
        released = {} if "skipped" in skipped else summed  # the weight cap's entry, as robust.apply gives it
        return updates, {**released, **skipped, **failed_clients(failed)}

    def gather(self, rnd: int) -> tuple[list[int], list[ClientUpdate], dict[str, Any]]:
        """The round's participants and updates, retrying with fresh clients as the policy allows."""
        participants = sample_clients(self.seed, rnd, len(self.sizes), self.cfg.train.fraction)
        failed_before: set[int] = set()
        retries: list[dict[str, Any]] = []
        for attempt in itertools.count():
            updates, skipped = self.attempt(rnd, participants)
            if "skipped" not in skipped or self.policy.retries < 0:
                break
            failed_before.update(int(c) for c in skipped.get("failed_clients", {}))
            retries.append({"clients": participants, "why": skipped["skipped"]})
            if attempt >= self.policy.retries:
                raise RunError(f"round {rnd + 1} missed its quorum in {attempt + 1} attempt(s), last: "
                               f"{skipped['skipped']}")
            participants = self.executor.replacements(rnd, attempt + 1, len(participants), failed_before)
        if retries:
            skipped["retried"] = retries
        return participants, updates, skipped

    def run_round(self, rnd: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.executor.begin_round(rnd, self.global_params)
        participants, updates, diagnostics = self.gather(rnd)
        fedent_diag = None
        weighed = updates  # what the strategy aggregates: the DP release, capped counts, robust rule
        released = bool(updates) and "skipped" not in diagnostics
        dp_info: dict[str, Any] = {}
        if released:
            self.status("aggregating", rnd)
            if self.secure_sum is not None:
                # secure aggregation, or a reduced multi-process round: only the sum exists (privacy_problems and
                # sum_blocker rule out central DP and robust rules then), so the strategy's server step reads the sum
                weighed = self.secure_sum.clients
                result = self.strategy.aggregate_sum(rnd, self.global_params, self.secure_sum)
                self.secure_sum = None
            else:
                # central DP first (fedent.privacy): a robust rule then sees only the release, so the guarantee holds
                private, dp_info = self.privacy.release(rnd, self.global_params, updates, self.records)
                weighed, robust_diag = robust.apply(self.cfg.robust, self.global_params, private)
                diagnostics = {**robust_diag, **diagnostics}
                result = self.strategy.aggregate(rnd, self.global_params, weighed)
            if not all_finite(result.params):
                raise RunError(f"the global model is not finite after round {rnd + 1} ({self.strategy.name}); "
                               "lower train.lr")
            self.global_params = list(result.params)
            diagnostics = {**result.diagnostics, **diagnostics}
            fedent_diag = diagnostics.pop("fedent", None)
        history = released_rounds(self.records) + ([participants] if released else [])
        privacy = self.privacy.report(history, self.sizes)
        if privacy is not None:
            privacy.update(dp_info or self.privacy.carried(self.records))  # a skipped round keeps the clip norm
        last_in_budget = self.privacy.over_budget(rnd + 1, history, self.sizes) is not None
        test_loss = test_acc = val_loss = val_acc = None
        if is_eval_round(rnd, self.rounds, self.cfg.train.eval_every) or last_in_budget:
            self.status("evaluating", rnd)
            diagnostics.update(self.evaluator.evaluate_local(rnd, updates))
            test_loss, test_acc, evaluated = self.evaluator.evaluate_round(rnd, self.global_params)
            validation = evaluated.pop("validation", None)  # data.validation_fraction: its own keys
            if validation is not None:
                val_loss, val_acc = validation["loss"], validation["acc"]
            diagnostics.update(evaluated)
        extra = getattr(self.executor, "round_diagnostics", None)  # optional: the cluster's bytes on the wire
        if extra is not None:
            diagnostics.update(extra(rnd))
        now = time.perf_counter()
        rec = runlog.metrics_record(
            round=rnd + 1, algorithm=self.strategy.name, test_acc=test_acc, test_loss=test_loss, val_acc=val_acc,
            val_loss=val_loss,
            train_loss=weighted_train_loss(weighed), clients=participants, num_clients=len(participants),
            wall_s=now - t0, elapsed_s=now - self.t_start, fedent=fedent_diag, diagnostics=diagnostics,
            privacy=privacy)
        self.metrics.append(rec)
        self.records.append(rec)
        failed = {int(c): str(w) for c, w in diagnostics.get("evaluation", {}).get("rejected", {}).items()}
        failed.update({int(c): str(w) for c, w in diagnostics.get("failed_clients", {}).items()})
        self.clients.record_round(rnd, updates, self.model_bytes, failed)
        if isinstance(fedent_diag, dict):
            self.trajectory.append({"round": rnd + 1, **{k: fedent_diag.get(k) for k in TRAJECTORY_KEYS}})
            self.write_estimator()
        return rec

    # ---- the run -------------------------------------------------------------------------------------
    def make_durable(self) -> None:
        for hook in self.before_checkpoint:
            hook()

    def first_round(self) -> int:
        """The first round to run (the newest checkpoint's next, 0 when fresh), told to the executor, which makes the
        run's processes agree on it; a resume that fails here is told too, so the other processes raise instead of
        waiting for this one. Its own error is the one raised (a failure to tell becomes a note on it)."""
        try:
            first = resume.resume(self) if self.policy.checkpoint_keep > 0 else 0
        except Exception as e:
            try:
                self.executor.resumed(None, e)  # a distributed executor re-raises e once the peers know
            except Exception as told:  # noqa: BLE001 - this rank's own error is the one to report
                if told is not e:  # a peer gone already: note it, keep the cause
                    e.add_note(f"the run's other processes were not told: {told}")
            raise
        self.executor.resumed(first, None)
        runlog.atomic_write_json(self.paths.provenance, self.provenance)  # resumed: with the earlier processes
        return first

    def run(self) -> list[dict[str, Any]]:
        """The whole run; status.json ends ``done``, ``failed`` (with the error) or ``stopped`` (a KeyboardInterrupt:
        Ctrl-C or SIGTERM, with the reason; resumable from the last checkpoint), and errors propagate."""
        try:
            return self._run()
        finally:
            for hook in self.after_run:
                hook()

    def _run(self) -> list[dict[str, Any]]:
        self.write_start_files()
        try:
            self.executor.start()
            self.prepare()
            first = self.first_round()
            for rnd in range(first, self.rounds):
                self.check_stop()
                self.budget_stop = self.privacy.over_budget(rnd, released_rounds(self.records), self.sizes)
                if self.budget_stop is not None:
                    break
                rec = self.run_round(rnd)
                if self.policy.checkpoint_keep > 0:
                    self.make_durable()
                    resume.save(self, rnd, keep=self.policy.checkpoint_keep)
                if self.on_round is not None:
                    self.on_round(rec)
            self.save_model()
            self.make_durable()
            if self.budget_stop is None:
                self.status("done", self.rounds - 1, final_acc=runlog.final_accuracy(self.records))
            else:  # done early, cleanly: the model of the last round within the privacy budget
                self.status("done", self.records[-1]["round"] - 1 if self.records else None,
                            final_acc=runlog.final_accuracy(self.records), stopped_early=self.budget_stop)
        except runlog.ReplacedRunError:  # the directory is another run's now: write nothing more into it
            self.metrics.close()
            raise
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM where fedent.signals.stop_on_signals is on
            self.metrics.close()
            reason = stop_reason(e)
            try:
                self.status("stopped", self.round, reason=reason, rounds_completed=len(self.records))
            finally:
                self.executor.finish(False, f"run {reason}")
            raise
        except BaseException as e:
            self.metrics.close()
            error = f"{type(e).__name__}: {e}"
            try:
                self.status("failed", self.round, error=error)
            finally:
                self.executor.finish(False, f"run failed: {error}")
            raise
        self.metrics.close()
        self.executor.finish(True, "run finished")
        return self.records
