"""Failure handling of the cluster runtime over real gRPC on loopback (port 0), aggregator in-process.

Missed heartbeats, a worker whose stream is cut (it reconnects with backoff), a round that misses its
quorum (retried with fresh clients, then the run fails loudly), a replayed update from an old round and
oversized messages, and payloads that break their strategy's PayloadSpec (a FedEnt probe without `a`,
SCAFFOLD's NaN Δc, a NaN train_loss). The kill -9 scenarios with real processes are in test_faults_process.py.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from conftest import FakeWorker, tiny_config, tiny_inputs

from client.settings import WorkerSettings
from client.worker import Worker, WorkerError
from fedent.inputs import RunInputs
from fedent.model_file import load_model_file
from fedent.rng import sample_clients
from fedent.runlog import read_json, read_metrics
from fedent.strategies.base import ClientUpdate
from fedentrpc import codec, mappers
from fedentrpc.backoff import backoff_delay
from fedentrpc.options import MAX_MESSAGE_BYTES
from fedentrpc.v1 import aggregator_pb2 as pb
from server.app import AggregatorHandle, start_aggregator
from server.settings import AggregatorSettings, SettingsError


def Silent(h: AggregatorHandle, cids: list[int], md5: str, name: str = "silent") -> FakeWorker:
    """A registered, ready worker that opens its Work stream and never answers (nor heartbeats)."""
    return FakeWorker(h.port, cids, md5, name=name)


def _worker(h: AggregatorHandle, inputs: RunInputs, cids: tuple[int, ...], **kw: Any) -> tuple[Worker, Any]:
    w = Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=cids, device="cpu",
                              connect_timeout_s=10, name=f"w{cids[0]}", **kw), inputs=inputs)
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["ok"] = w.run()
        except WorkerError as e:
            box["error"] = str(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return w, (t, box)


def _wait_ready(h: AggregatorHandle, cids: list[int], timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with h.run.registry.lock:
            if all(h.run.registry.hosted(c) for c in cids):
                return
        time.sleep(0.02)
    raise AssertionError(f"clients {cids} never became ready")


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    rng = random.Random(3)
    for attempt in range(12):
        bound = min(2.0, 0.1 * 2 ** attempt)
        draws = [backoff_delay(attempt, 0.1, 2.0, rng) for _ in range(300)]
        assert all(0.0 <= d <= bound for d in draws)
        assert max(draws) > 0.8 * bound and min(draws) < 0.2 * bound  # the whole range, not a fixed delay
    assert backoff_delay(10_000, 0.1, 2.0, rng) <= 2.0
    with pytest.raises(ValueError):
        WorkerSettings(aggregator="h:1", client_ids=(0,), backoff_base_s=1.0, backoff_cap_s=0.5)


def test_backoff_draws_match_the_former_worker_and_offline_formulas() -> None:
    """One ``uniform`` draw per delay, as the worker's and the offline runner's inline formulas drew: a seeded
    generator gives the same sequence as before they shared fedentrpc.backoff."""
    ours, worker_rng, offline_rng = random.Random(7), random.Random(7), random.Random(7)
    for attempt in range(40):
        got = backoff_delay(attempt, 0.5, 10.0, ours)
        assert got == worker_rng.uniform(0.0, min(10.0, 0.5 * 2.0 ** min(attempt, 30)))
        assert got == offline_rng.uniform(0.0, min(10.0, 0.5 * 2.0 ** attempt))


def test_settings_validate_the_failure_knobs() -> None:
    for bad in ({"heartbeat_s": 0}, {"heartbeat_misses": -1}, {"round_retries": -2}):
        with pytest.raises(SettingsError):
            AggregatorSettings(**bad)  # type: ignore[arg-type]


def test_silent_worker_is_expired_by_missed_heartbeats_not_the_deadline(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=2, fraction=1.0), inputs, quorum=0.5, round_deadline_s=60,
              heartbeat_s=0.2, heartbeat_misses=2)
    _, (thread, box) = _worker(h, inputs, (2, 3))
    _wait_ready(h, [2, 3])
    silent = Silent(h, [0, 1], inputs.partition_info["md5"])
    t0 = time.monotonic()
    silent.next("fit")  # holds clients 0 and 1 of round 0 and goes quiet
    assert h.wait(20) and h.run.error is None, h.run.error
    assert time.monotonic() - t0 < 10, "the round waited for its 60 s deadline instead of the heartbeats"
    recs = read_metrics(h.run_dir / "metrics.jsonl")
    assert len(recs) == 2 and all("skipped" not in r["diagnostics"] for r in recs)
    assert recs[0]["diagnostics"]["failed_clients"]["0"].startswith("missed heartbeats")
    assert recs[1]["diagnostics"]["failed_clients"]["1"] == "no live worker"
    states = {c["cid"]: c["state"] for c in read_json(h.run_dir / "clients.json")["clients"]}
    assert states[0] == states[1] == "down"
    thread.join(10)
    assert box.get("ok") is True  # the live worker (heartbeating every 0.2 s) was never expired


def test_worker_killed_between_register_and_ready_expires_and_its_restart_registers(start: Any) -> None:
    """A worker that registered and died before Ready has no Work stream to break: it expires by the heartbeat
    limit like a ready one, releasing its clients, and its restart (another process, another name) registers
    them and the run completes. A slow data load between Register and Ready is kept alive by heartbeats."""
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=2, fraction=1.0), inputs, quorum=1.0, register_timeout_s=30,
              heartbeat_s=0.2, heartbeat_misses=2)
    channel = grpc.insecure_channel(f"127.0.0.1:{h.port}")
    from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

    crashed = pb_grpc.AggregatorServiceStub(channel).Register(
        pb.RegisterRequest(worker_name="host-111-c0", client_ids=[0, 1])).worker_id
    channel.close()  # killed before Ready: no Work stream, no heartbeats
    end = time.monotonic() + 10
    while [c["state"] for c in read_json(h.run_dir / "clients.json")["clients"]][:2] != ["down", "down"]:
        assert time.monotonic() < end, "the unready worker was never expired: it holds clients 0 and 1 for good"
        time.sleep(0.02)
    assert h.run.registry.workers[crashed].gone

    real_load = Worker._load

    def slow_load(self: Worker, reply: Any) -> None:
        time.sleep(1.5)  # longer than heartbeat_misses x heartbeat_s = 0.4 s
        real_load(self, reply)

    restarted = Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=(0, 1), device="cpu",
                                      connect_timeout_s=10, name="host-222-c0", reconnect_attempts=0),
                       inputs=inputs)
    restarted._load = slow_load.__get__(restarted)  # type: ignore[method-assign]
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(ok=restarted.run()), daemon=True)
    thread.start()
    _, (other, other_box) = _worker(h, inputs, (2, 3))
    assert h.wait(30) and h.run.error is None, h.run.error
    thread.join(10)
    other.join(10)
    assert box.get("ok") is True and other_box.get("ok") is True, (box, other_box)
    assert restarted.reconnects == 0  # registered at once and never expired while loading
    assert len(read_metrics(h.run_dir / "metrics.jsonl")) == 2


def test_worker_reconnects_after_its_stream_is_cut_and_finishes_the_run(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=3, fraction=1.0), inputs, quorum=1.0, round_retries=3,
              round_deadline_s=5)
    gate = threading.Event()
    real_fit = Worker.do_fit

    def slow_fit(self: Worker, t: pb.FitTask) -> Any:
        gate.wait(10)  # hold round 0 until the aggregator has cut this worker's stream
        return real_fit(self, t)

    w, (thread, box) = _worker(h, inputs, (0, 1, 2, 3), backoff_base_s=0.05, backoff_cap_s=0.2)
    w.do_fit = slow_fit.__get__(w)  # type: ignore[method-assign]
    _wait_ready(h, [0, 1, 2, 3])
    while h.run.remote.collector is None:
        time.sleep(0.01)
    first_id = w.worker_id
    with h.run.registry.lock:
        handle = h.run.registry.workers[first_id]
    h.run.registry.retire(handle, "down", "test: connection lost")  # what an expiry or a broken link does
    gate.set()
    assert h.wait(30) and h.run.error is None, h.run.error
    thread.join(10)
    assert box.get("ok") is True and w.reconnects >= 1 and w.worker_id != first_id
    recs = read_metrics(h.run_dir / "metrics.jsonl")
    assert len(recs) == 3
    assert "retried" in recs[0]["diagnostics"]  # round 0 lost its worker, ran again once it was back
    assert all(r["num_clients"] == 4 and "skipped" not in r["diagnostics"] for r in recs)


def test_round_missing_quorum_is_retried_with_fresh_clients(start: Any) -> None:
    inputs = tiny_inputs(num_clients=6)
    cfg = tiny_config("fedavg", num_clients=6, rounds=1, fraction=0.5)
    first = sample_clients(cfg.train.seed, 0, 6, 0.5)
    h = start(cfg, inputs, quorum=1.0, round_deadline_s=0.5, round_retries=2)
    others = tuple(c for c in range(6) if c != first[0])
    _, (thread, box) = _worker(h, inputs, others)
    _wait_ready(h, list(others))
    Silent(h, [first[0]], inputs.partition_info["md5"])
    assert h.wait(20) and h.run.error is None, h.run.error
    (rec,) = read_metrics(h.run_dir / "metrics.jsonl")
    assert rec["diagnostics"]["retried"][0]["clients"] == first
    assert first[0] not in rec["clients"] and len(rec["clients"]) == 3 and rec["num_clients"] == 3
    assert "skipped" not in rec["diagnostics"]
    assert read_json(h.run_dir / "status.json")["phase"] == "done"
    thread.join(10)


def test_round_that_never_reaches_quorum_fails_the_run_loudly(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=3, fraction=0.5), inputs, quorum=1.0, round_deadline_s=0.3,
              round_retries=1)
    Silent(h, [0, 1, 2, 3], inputs.partition_info["md5"])
    t0 = time.monotonic()
    assert h.wait(20), "a run whose rounds cannot reach quorum must end, not hang"
    assert time.monotonic() - t0 < 10
    assert h.run.error is not None and "missed its quorum in 2 attempt(s)" in h.run.error
    assert "\n" not in h.run.error
    status = read_json(h.run_dir / "status.json")
    assert status["phase"] == "failed" and "round 1" in str(status)
    assert read_metrics(h.run_dir / "metrics.jsonl") == []


def test_replayed_update_from_an_old_round_is_rejected(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=2, fraction=1.0), inputs, quorum=0.5)
    fake = Silent(h, [0, 1, 2, 3], inputs.partition_info["md5"])
    fit0 = fake.next("fit").task
    w0 = fake.model(fit0.model_blob)
    for c in range(4):
        fake.upload(fit0, c, [p + c for p in w0])
    fit1 = fake.next("fit").task
    assert fit1.round == 1
    # refused on the stream's header, before the upload book is touched: the exact replay of a taken upload and
    # the edited ones alike name no open fit task (within its own round a second upload is ALREADY_EXISTS:
    # test_bad_updates_get_clear_errors_and_are_excluded)
    for header, code in ((fit0, grpc.StatusCode.FAILED_PRECONDITION),
                         (pb.TaskHeader(task_id=fit0.task_id, round=1), grpc.StatusCode.FAILED_PRECONDITION),
                         (pb.TaskHeader(task_id=fit1.task_id, round=0), grpc.StatusCode.FAILED_PRECONDITION)):
        with pytest.raises(grpc.RpcError) as e:
            fake.upload(header, 0, [p + 7 for p in w0])  # a captured round-0 update sent again
        assert e.value.code() == code, e.value.details()
    for c in range(4):
        fake.upload(fit1, c, [p + 1 for p in w0])
    assert h.wait(20) and h.run.error is None
    final = load_model_file(h.run_dir / "model_final.pt").params
    assert all(torch.allclose(a, b + 1) for a, b in zip(final, w0, strict=True))  # the replay changed nothing


def test_oversized_messages_are_rejected_and_the_service_goes_on(start: Any) -> None:
    inputs = tiny_inputs()
    # 3 s: the uploads below must land inside the fit phase even on a loaded 2-core box (1 s raced it there);
    # client 1, whose oversized update is refused, still misses it and is recorded as "deadline"
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, quorum=0.5, round_deadline_s=3)
    fake = Silent(h, [0, 1, 2, 3], inputs.partition_info["md5"])
    fit = fake.next("fit").task
    # one message over the server's 8 MiB receive limit
    big = pb.SubmitProbesRequest(worker_id="x" * (MAX_MESSAGE_BYTES + 1024), task_id=fit.task_id, round=0)
    with pytest.raises(grpc.RpcError) as e:
        fake.stub.SubmitProbes(big)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # a stream of legal 4 MiB chunks whose total passes the cap: cut off, not buffered to the end
    w = fake.model(fit.model_blob)
    huge = [torch.zeros(3 * 1024 * 1024)]  # 12 MiB of float32, far above this tiny model's limit
    parts = list(mappers.update_to_parts(ClientUpdate(1, w, 12, 0.0, tensors={"extra": huge}),
                                         mappers.UpdateMeta(fake.wid, fit.task_id, 0)))
    assert len(parts) > 3
    with pytest.raises(grpc.RpcError) as e:
        fake.stub.SubmitUpdate(iter(parts))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds" in e.value.details()
    # a header that merely promises 32 GiB is refused while decoding, before anything is allocated, at the
    # model-sized bound (in the fit phase: the sender must still own the client for its stream to be read)
    liar = list(mappers.update_to_parts(ClientUpdate(1, w, 12, 0.0), mappers.UpdateMeta(fake.wid, fit.task_id, 0)))
    lh = liar[1].chunk.header
    lh.wire_bytes = lh.raw_bytes = 32 << 30
    lh.num_chunks = (32 << 30) // codec.MAX_CHUNK_BYTES
    with pytest.raises(grpc.RpcError) as e:
        fake.stub.SubmitUpdate(iter(liar))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"exceeds this receiver's limit of {h.run.remote.max_update_bytes()}" in e.value.details()
    for c in (0, 2, 3):
        fake.upload(fit, c, [p + 1 for p in w])
    assert h.wait(20) and h.run.error is None
    (rec,) = read_metrics(h.run_dir / "metrics.jsonl")
    assert rec["num_clients"] == 4 and "skipped" not in rec["diagnostics"]
    assert rec["diagnostics"]["failed_clients"] == {"1": "deadline"}  # the oversized update never counted


def test_estimator_lost_mid_fixed_point_restarts_and_the_run_recovers(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """FedEnt offline: the estimator dies while Algorithm 1 waits on a worker's gradient (its server is cut
    off hard, every stream and the aggregator's long poll broken, as a kill -9 would); a new estimator on the
    same port gets the job started again by the aggregator and the workers' re-opened Oracle streams; the
    run then equals the simulation."""
    from estimator.service import create_estimator_service
    from estimator.settings import EstimatorSettings
    from fedent.config import config_from_dict
    from fedent.meanfield.oracle import TrainerOracle
    from fedent.sim.simulator import run_simulation

    started, gate = threading.Event(), threading.Event()
    real = TrainerOracle.gradient

    def gated(self: TrainerOracle, *args: Any, **kwargs: Any) -> Any:
        started.set()
        gate.wait(10)  # the first estimator dies while this gradient is outstanding
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TrainerOracle, "gradient", gated)
    est = create_estimator_service(EstimatorSettings(wait_workers_s=20, oracle_timeout_s=20))
    port = est.port
    raw = tiny_config("fedent", rounds=2).to_dict()
    raw["algorithm"].update(estimator="offline", max_sweeps=3)
    cfg = config_from_dict(raw)
    inputs = tiny_inputs()
    h = start_aggregator(cfg, AggregatorSettings(register_timeout_s=20, round_deadline_s=20,
                                                 estimator=f"127.0.0.1:{port}"), tmp_path / "run", inputs=inputs)
    again = None
    try:
        for g in [(0, 1), (2, 3)]:
            _worker(h, inputs, g, estimator=f"127.0.0.1:{port}", backoff_base_s=0.05, backoff_cap_s=0.3)
        assert started.wait(20), "Algorithm 1 never asked a worker for a gradient"
        est.server.stop(0)  # hard: no graceful job shutdown the aggregator could observe
        est.jobs._cancel.set()
        gate.set()
        again = create_estimator_service(EstimatorSettings(port=port, wait_workers_s=20, oracle_timeout_s=20))
        assert h.wait(60) and h.run.error is None, h.run.error
    finally:
        h.stop(grace_s=0.5)
        if again is not None:
            again.stop(0.5)
    assert read_json(h.run_dir / "estimator.json")["report"]["mode"] == "offline"
    monkeypatch.undo()
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    got = load_model_file(h.run_dir / "model_final.pt").params
    for a, b in zip(got, sim.params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


# ---- a strategy's payload is checked before it is acknowledged ------------------------------------------------


def _send(fake: FakeWorker, task: Any, update: ClientUpdate) -> None:
    fake.stub.SubmitUpdate(mappers.update_to_parts(update, mappers.UpdateMeta(fake.wid, task.task_id, task.round)))


def _rejected(call: Any, needle: str) -> None:
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in e.value.details(), e.value.details()
    assert "\n" not in e.value.details()


def _mixed(start: Any, algorithm: str, rounds: int) -> tuple[AggregatorHandle, FakeWorker, Any]:
    """Clients 1-3 on a real worker, client 0 on a hand-driven fake; any 2 updates make a quorum."""
    inputs = tiny_inputs()
    h = start(tiny_config(algorithm, rounds=rounds, fraction=1.0), inputs, quorum=0.5)
    _, (thread, _box) = _worker(h, inputs, (1, 2, 3))
    _wait_ready(h, [1, 2, 3])
    return h, FakeWorker(h.port, [0], inputs.partition_info["md5"]), thread


def test_fedent_probe_without_scalar_a_is_rejected_and_the_run_goes_on(start: Any) -> None:
    h, fake, thread = _mixed(start, "fedent", rounds=1)
    probe = fake.next("probe").task
    msg = pb.Probe(cid=0, num_samples=12, scalars={"b": 1.0, "eta_prev": 0.01})
    _rejected(lambda: fake.stub.SubmitProbes(pb.SubmitProbesRequest(
        worker_id=fake.wid, task_id=probe.task_id, round=0, probes=[msg])), "lacks scalars ['a']")
    assert h.wait(30) and h.run.error is None, h.run.error
    (rec,) = read_metrics(h.run_dir / "metrics.jsonl")
    assert "skipped" not in rec["diagnostics"] and set(rec["diagnostics"]["failed_clients"]) == {"0"}
    assert "lacks scalars ['a']" in rec["diagnostics"]["failed_clients"]["0"]
    assert read_json(h.run_dir / "status.json")["phase"] == "done"
    thread.join(10)


def test_fedent_update_without_its_scalars_is_rejected_and_the_run_goes_on(start: Any) -> None:
    h, fake, thread = _mixed(start, "fedent", rounds=1)
    probe = fake.next("probe").task
    ok = pb.Probe(cid=0, num_samples=12, scalars={"a": 0.1, "b": 1.0, "eta_prev": 0.01})
    fake.stub.SubmitProbes(pb.SubmitProbesRequest(worker_id=fake.wid, task_id=probe.task_id, round=0, probes=[ok]))
    fit = fake.next("fit").task
    w = fake.model(fit.model_blob)
    _rejected(lambda: _send(fake, fit, ClientUpdate(0, w, 12, 0.1)), "lacks scalars")
    assert h.wait(30) and h.run.error is None, h.run.error
    (rec,) = read_metrics(h.run_dir / "metrics.jsonl")
    assert "skipped" not in rec["diagnostics"] and set(rec["diagnostics"]["failed_clients"]) == {"0"}
    assert "lacks scalars" in rec["diagnostics"]["failed_clients"]["0"]
    assert read_json(h.run_dir / "status.json")["phase"] == "done"
    thread.join(10)


def test_scaffold_nan_delta_c_is_rejected_and_the_control_variate_stays_finite(start: Any) -> None:
    h, fake, thread = _mixed(start, "scaffold", rounds=2)
    fit = fake.next("fit").task
    w = fake.model(fit.model_blob)
    dc = [torch.zeros_like(p) for p in w]
    dc[0][0, 0] = float("nan")
    _rejected(lambda: _send(fake, fit, ClientUpdate(0, [p.clone() for p in w], 12, 0.1, tensors={"delta_c": dc})),
              "'delta_c' is not finite")
    fit1 = fake.next("fit").task  # the next round goes on, and a valid upload of the same client is taken
    w1 = fake.model(fit1.model_blob)
    _send(fake, fit1, ClientUpdate(0, w1, 12, 0.1, tensors={"delta_c": [torch.zeros_like(p) for p in w1]}))
    assert h.wait(30) and h.run.error is None, h.run.error
    recs = read_metrics(h.run_dir / "metrics.jsonl")
    assert [("skipped" in r["diagnostics"]) for r in recs] == [False, False]
    assert "'delta_c' is not finite" in recs[0]["diagnostics"]["failed_clients"]["0"]
    assert "failed_clients" not in recs[1]["diagnostics"]
    assert all(bool(torch.isfinite(c).all()) for c in h.run.engine.strategy.server_state()["c"])
    assert all(bool(torch.isfinite(p).all()) for p in load_model_file(h.run_dir / "model_final.pt").params)
    assert read_json(h.run_dir / "status.json")["phase"] == "done"
    thread.join(10)


def test_nan_train_loss_and_undeclared_payload_are_rejected(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, quorum=0.25)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    fit = fake.next("fit").task
    w = fake.model(fit.model_blob)
    _rejected(lambda: _send(fake, fit, ClientUpdate(0, w, 12, float("nan"))), "non-finite train_loss")
    _rejected(lambda: _send(fake, fit, ClientUpdate(1, w, 12, 0.1, scalars={"eta": 0.1})), "unknown scalars")
    _rejected(lambda: _send(fake, fit, ClientUpdate(2, w, 12, 0.1, tensors={"delta_c": w})), "unknown tensor groups")
    _send(fake, fit, ClientUpdate(3, w, 12, 0.5))
    assert h.wait(20) and h.run.error is None, h.run.error
    (rec,) = read_metrics(h.run_dir / "metrics.jsonl")
    assert rec["train_loss"] == pytest.approx(0.5) and set(rec["diagnostics"]["failed_clients"]) == {"0", "1", "2"}
    assert read_json(h.run_dir / "status.json")["phase"] == "done"
