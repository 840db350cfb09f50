"""The aggregator service over real gRPC on loopback (port 0) with in-thread workers and hand-driven fakes.

Covers: equality with the simulator, one model fetch per worker per round, status codes for bad input,
exclusion of bad updates, deadlines/quorum, disconnects, health checking and reflection.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from conftest import FakeWorker, run_inthread_workers, tiny_config, tiny_inputs
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from client.settings import WorkerSettings
from client.worker import Worker, WorkerError, parse_client_ids
from fedent.model_file import load_model_file
from fedent.params import weighted_sum
from fedent.runlog import read_json, read_metrics
from fedent.sim.simulator import run_simulation
from fedent.strategies.base import ClientUpdate
from fedentrpc import codec, mappers
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from server.app import AggregatorHandle, start_aggregator
from server.launcher import split_clients
from server.settings import AggregatorSettings, SettingsError


def _stub(h: AggregatorHandle) -> pb_grpc.AggregatorServiceStub:
    return pb_grpc.AggregatorServiceStub(grpc.insecure_channel(f"127.0.0.1:{h.port}"))


@pytest.mark.parametrize("algorithm", ["fedavg", "fedent", "feddyn", "scaffold"])
def test_inthread_cluster_equals_simulation(start: Any, tmp_path: Path, algorithm: str) -> None:
    cfg = tiny_config(algorithm, rounds=3)
    inputs = tiny_inputs()
    h = start(cfg, inputs)
    run_inthread_workers(h, inputs, [(0, 1), (2, 3)])
    assert h.run.error is None
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    got = load_model_file(h.run_dir / "model_final.pt").params
    for a, b in zip(got, sim.params, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    recs = read_metrics(h.run_dir / "metrics.jsonl")
    assert [r["clients"] for r in recs] == [r["clients"] for r in sim.records]
    assert read_json(h.run_dir / "status.json")["phase"] == "done"
    if algorithm == "fedent":
        assert recs[0]["fedent"] is not None and sim.records[0]["fedent"] is not None


def test_model_is_fetched_once_per_round_per_worker(start: Any) -> None:
    cfg = tiny_config("fedavg", rounds=3, fraction=1.0)
    inputs = tiny_inputs()
    h = start(cfg, inputs)
    run_inthread_workers(h, inputs, [(0, 1, 2, 3)])
    blob = codec.encode_tensors({codec.PARAMS_GROUP: [p.detach() for p in inputs.make_model().parameters()]})
    (w,) = h.run.registry.workers.values()
    assert w.bytes_down == 3 * blob.wire_bytes  # 4 clients hosted, yet one download per round


def _register(stub: pb_grpc.AggregatorServiceStub, cids: list[int], md5: str, sizes: int = 12, token: str = "") -> str:
    wid = stub.Register(pb.RegisterRequest(worker_name="fake", client_ids=cids, token=token)).worker_id
    stub.Ready(pb.ReadyRequest(worker_id=wid, partition_md5=md5,
                               clients=[pb.ClientInfo(cid=c, num_samples=sizes) for c in cids]))
    return wid


def test_register_sends_the_config_as_a_struct_that_rebuilds_the_same_config(start: Any) -> None:
    """RegisterResponse.config (a Struct: numbers are doubles) gives the worker the aggregator's config
    exactly, ints as ints (seed, rounds, batch sizes), with secret-looking keys redacted."""
    from client.worker import config_from_register
    from server.app import worker_config

    inputs = tiny_inputs()
    cfg = tiny_config("fedent", rounds=3)
    h = start(cfg, inputs)
    reply = _stub(h).Register(pb.RegisterRequest(worker_name="fake", client_ids=[0]))
    assert reply.config.fields["train"].struct_value.fields["seed"].HasField("number_value")
    got = config_from_register(reply, None)
    assert got == h.run.cfg
    assert type(got.train.seed) is int and type(got.train.rounds) is int and type(got.train.batch_size) is int
    assert config_from_register(reply, "/elsewhere").data.root == "/elsewhere"
    raw = mappers.struct_to_dict(reply.config)
    assert raw == json.loads(json.dumps(h.run.cfg.to_dict()))

    class WithSecret:
        def to_dict(self) -> dict[str, Any]:
            return {"train": {"seed": 3, "rounds": 10**6}, "cluster": {"auth_token": "s3cret", "lr": 1.0}}

    sent = mappers.struct_to_dict(mappers.config_to_struct(worker_config(WithSecret())))  # type: ignore[arg-type]
    assert sent == {"train": {"seed": 3, "rounds": 10**6}, "cluster": {"auth_token": "***", "lr": 1}}
    with pytest.raises(codec.WireError, match="too large"):
        mappers.config_to_struct({"train": {"seed": 2**60}})
    with pytest.raises(codec.WireError, match="no config"):
        config_from_register(pb.RegisterResponse(), None)


def test_get_status_reports_the_phase_as_an_enum(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config(), inputs)
    st = _stub(h).GetStatus(pb.GetStatusRequest())
    assert st.phase == pb.RUN_PHASE_STARTING and st.error == "" and st.round == -1
    assert mappers.phase_from_msg(st.phase) == "starting"
    assert {mappers.phase_to_msg(p) for p in mappers.RUN_PHASES} == set(pb.RunPhase.values()) - {0}
    with pytest.raises(codec.WireError, match="RUN_PHASE_UNSPECIFIED is not allowed"):
        mappers.phase_from_msg(pb.RUN_PHASE_UNSPECIFIED)


def _code(fn: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code()


def test_registration_errors_map_to_status_codes(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config(), inputs, token="s3cret")
    stub = _stub(h)
    md5 = inputs.partition_info["md5"]
    assert _code(lambda: stub.Register(pb.RegisterRequest(client_ids=[0], token="nope"))) == \
        grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: stub.Register(pb.RegisterRequest(client_ids=[9], token="s3cret"))) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: stub.Register(pb.RegisterRequest(client_ids=[], token="s3cret"))) == \
        grpc.StatusCode.INVALID_ARGUMENT
    wid = _register(stub, [0, 1], md5, token="s3cret")
    assert _code(lambda: stub.Register(pb.RegisterRequest(client_ids=[1, 2], token="s3cret"))) == \
        grpc.StatusCode.ALREADY_EXISTS
    other = stub.Register(pb.RegisterRequest(client_ids=[2], token="s3cret")).worker_id
    assert _code(lambda: stub.Ready(pb.ReadyRequest(worker_id=other, partition_md5="0" * 32))) == \
        grpc.StatusCode.FAILED_PRECONDITION
    assert _code(lambda: stub.Ready(pb.ReadyRequest(worker_id="w-nobody", partition_md5=md5))) == \
        grpc.StatusCode.NOT_FOUND
    assert _code(lambda: list(stub.FetchBlob(pb.AggregatorServiceFetchBlobRequest(blob_id="r99-model")))) == \
        grpc.StatusCode.NOT_FOUND
    assert _code(lambda: stub.SubmitProbes(pb.SubmitProbesRequest(worker_id=wid, task_id=1, round=0))) == \
        grpc.StatusCode.FAILED_PRECONDITION
    assert stub.Heartbeat(pb.HeartbeatRequest(worker_id=wid)).known
    assert not stub.Heartbeat(pb.HeartbeatRequest(worker_id="w-nobody")).known


def test_bad_updates_get_clear_errors_and_are_excluded(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, quorum=0.5)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    fit = fake.next("fit").task
    assert list(fit.client_ids) == [0, 1, 2, 3]
    w = fake.model(fit.model_blob)
    nan = [p.clone() for p in w]
    nan[0][0, 0] = float("nan")
    with pytest.raises(grpc.RpcError) as e:
        fake.upload(fit, 0, nan)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not finite" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        fake.upload(fit, 1, [w[0][:, :4].clone(), w[1].clone()])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "expected" in e.value.details()
    headless = list(mappers.update_to_parts(ClientUpdate(2, w, 12, 0.0), mappers.UpdateMeta(fake.wid, 0, 0)))[1:]
    with pytest.raises(grpc.RpcError) as e:
        fake.stub.SubmitUpdate(iter(headless))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        fake.upload(fit, 2, [p + 1 for p in w], n=999)  # lies about its sample count
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    good3 = [p + 2 for p in w]
    fake.upload(fit, 3, good3)
    with pytest.raises(grpc.RpcError) as e:
        fake.upload(fit, 3, good3)  # a second upload for the same client
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION or e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert h.wait(20) and h.run.error is None
    (rec,) = read_metrics(h.run_dir / "metrics.jsonl")
    # 1 of 4 valid updates is below the quorum (2): the round is skipped and the model kept
    assert "skipped" in rec["diagnostics"] and set(rec["diagnostics"]["failed_clients"]) == {"0", "1", "2"}
    final = load_model_file(h.run_dir / "model_final.pt").params
    assert all(torch.equal(a, b) for a, b in zip(final, w, strict=True))


def test_an_upload_stream_that_ends_early_is_kept_and_the_resumed_upload_completes_it(start: Any) -> None:
    # a stream the worker's stall watch cancels can end on the aggregator like one closed early, without an
    # error: its verified chunks must be kept for the resumption, not discarded as corrupt
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    fit = fake.next("fit").task
    w = fake.model(fit.model_blob)
    spec, meta = codec.TransferSpec(chunk_bytes=16), mappers.UpdateMeta(fake.wid, fit.task_id, fit.round)
    ups = {c: [p + c for p in w] for c in range(4)}
    parts = list(mappers.update_to_parts(ClientUpdate(0, ups[0], 12, 0.1), meta, spec))
    assert len(parts) > 5
    with pytest.raises(grpc.RpcError) as e:
        fake.stub.SubmitUpdate(iter(parts[:4]))  # the header and 3 chunks, then the stream ends
    assert e.value.code() == grpc.StatusCode.ABORTED and "kept" in e.value.details()
    query = pb.QueryUploadRequest(worker_id=fake.wid, task_id=fit.task_id, round=fit.round, cid=0)
    state = fake.stub.QueryUpload(query)
    assert (state.state, state.next_chunk, state.received_bytes) == (pb.UPLOAD_STATE_PARTIAL, 3, 48)
    fake.stub.SubmitUpdate(mappers.update_to_parts(ClientUpdate(0, ups[0], 12, 0.1), meta, spec, resume_from=3))
    assert fake.stub.QueryUpload(query).state == pb.UPLOAD_STATE_COMPLETE
    for c in (1, 2, 3):
        fake.upload(fit, c, ups[c])
    assert h.wait(20) and h.run.error is None
    final = load_model_file(h.run_dir / "model_final.pt").params
    expect = weighted_sum([ups[c] for c in range(4)], [0.25] * 4)
    assert all(torch.allclose(a, b) for a, b in zip(final, expect, strict=True))


def test_a_whole_upload_that_is_no_update_fails_its_client_and_cannot_be_sent_again(start: Any) -> None:
    # verified chunks that decode to no update (here: no 'params' group) cost the aggregator a decode; the
    # client fails this round, as for an update the acceptance rule refuses, so the stream cannot be repeated
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, quorum=0.5)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    fit = fake.next("fit").task
    w = fake.model(fit.model_blob)
    header = pb.SubmitUpdateRequest(header=pb.UpdateHeader(worker_id=fake.wid, task_id=fit.task_id,
                                                           round=fit.round, cid=0, num_samples=12))
    junk = []
    for c in codec.tensor_chunks({"junk": [torch.zeros(0)] * 50}, codec.TransferSpec()):
        m = pb.SubmitUpdateRequest()
        c.fill(m.chunk)
        junk.append(m)
    for expect in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS):
        with pytest.raises(grpc.RpcError) as e:
            fake.stub.SubmitUpdate(iter([header, *junk]))
        assert e.value.code() == expect, e.value.details()
    assert "params" in h.run.remote.collector.failed[0]
    ups = {c: [p + c for p in w] for c in (1, 2, 3)}
    for c, params in ups.items():
        fake.upload(fit, c, params)
    assert h.wait(20) and h.run.error is None
    final = load_model_file(h.run_dir / "model_final.pt").params
    expect_w = weighted_sum(list(ups.values()), [1 / 3] * 3)
    assert all(torch.allclose(a, b) for a, b in zip(final, expect_w, strict=True))


def test_valid_updates_are_aggregated_without_the_bad_one(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, quorum=0.5)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    fit = fake.next("fit").task
    w = fake.model(fit.model_blob)
    ups = {c: [p + c for p in w] for c in (1, 2, 3)}
    bad = [p.clone() for p in w]
    bad[1][0] = float("inf")
    with pytest.raises(grpc.RpcError):
        fake.upload(fit, 0, bad)
    for c, params in ups.items():
        fake.upload(fit, c, params)
    assert h.wait(20) and h.run.error is None
    final = load_model_file(h.run_dir / "model_final.pt").params
    expect = weighted_sum([ups[1], ups[2], ups[3]], [1 / 3] * 3)
    assert all(torch.allclose(a, b) for a, b in zip(final, expect, strict=True))


def test_silent_worker_hits_the_deadline_and_the_run_goes_on(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=2, fraction=1.0), inputs, round_deadline_s=0.4)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    t0 = time.monotonic()
    assert h.wait(20) and h.run.error is None
    assert time.monotonic() - t0 < 10
    recs = read_metrics(h.run_dir / "metrics.jsonl")
    assert len(recs) == 2 and all("skipped" in r["diagnostics"] for r in recs)
    assert recs[0]["diagnostics"]["failed_clients"]["0"] == "deadline"
    fake.channel.close()


def test_disconnect_fails_the_clients_at_once_not_at_the_deadline(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, round_deadline_s=60)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    fake.next("fit")
    t0 = time.monotonic()
    fake.call.cancel()
    assert h.wait(20), "a dropped worker must not hang the round until its deadline"
    assert time.monotonic() - t0 < 10
    (rec,) = read_metrics(h.run_dir / "metrics.jsonl")
    assert rec["diagnostics"]["failed_clients"]["0"] == "worker disconnected"


def test_health_and_reflection(start: Any) -> None:
    h = start(tiny_config(), tiny_inputs())
    ch = grpc.insecure_channel(f"127.0.0.1:{h.port}")
    health = health_pb2_grpc.HealthStub(ch)
    for name in ("", "fedentrpc.v1.AggregatorService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=name)).status == \
            health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(ch)
    (resp,) = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in resp.list_services_response.service}
    assert {"fedentrpc.v1.AggregatorService", "grpc.health.v1.Health"} <= names


def test_worker_refuses_a_different_partition(start: Any) -> None:
    h = start(tiny_config(), tiny_inputs())
    other = tiny_inputs(per_client=11)
    w = Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=(0, 1), device="cpu",
                              connect_timeout_s=10), inputs=other)
    with pytest.raises(WorkerError, match="partition md5"):
        w.run()


def test_parse_client_ids_and_split() -> None:
    assert parse_client_ids("0-3,7, 9") == (0, 1, 2, 3, 7, 9)
    for bad in ("", "3-1", "a", "-2"):
        with pytest.raises(ValueError, match="client id"):
            parse_client_ids(bad)
    assert split_clients(10, 3) == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]
    assert split_clients(2, 5) == [(0,), (1,)]


def test_settings_reject_unknown_keys_and_bad_values() -> None:
    with pytest.raises(SettingsError, match="unknown"):
        AggregatorSettings.from_mapping({"deadline": 3})
    with pytest.raises(SettingsError, match="quorum"):
        AggregatorSettings(quorum=2.0)
    with pytest.raises(SettingsError, match="wire_dtype"):
        AggregatorSettings(wire_dtype="int8")


def test_worker_cli_rejects_bad_arguments_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from client.__main__ import main

    assert main(["--aggregator", "127.0.0.1:1", "--clients", "5-2", "--insecure"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("worker: bad client id list") and "Traceback" not in err
    assert main(["--aggregator", "nohostport", "--clients", "0-1", "--insecure"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_half_precision_and_zlib_transfer_settings_still_train(start: Any, tmp_path: Path) -> None:
    cfg = tiny_config("fedavg", rounds=2)
    inputs = tiny_inputs()
    h = start(cfg, inputs, wire_dtype="float16", compression="zlib")
    run_inthread_workers(h, inputs, [(0, 1, 2, 3)])
    assert h.run.error is None
    sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
    got = load_model_file(h.run_dir / "model_final.pt").params
    assert all(torch.allclose(a, b, atol=1e-2) for a, b in zip(got, sim.params, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(got, sim.params, strict=True))  # it really was lossy


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_fedent_through_the_estimator_service_equals_simulation(tmp_path: Path, mode: str) -> None:
    """Online: φ2 from SolveOnline. Offline: Algorithm 1 on the service, gradients from the workers' Oracle
    streams (they dial out to the estimator). Both must reproduce the in-process simulation."""
    from estimator.service import create_estimator_service
    from estimator.settings import EstimatorSettings
    from fedent.config import config_from_dict

    est = create_estimator_service(EstimatorSettings(wait_workers_s=20, oracle_timeout_s=20))
    try:
        base = tiny_config("fedent", rounds=3)
        raw = base.to_dict()
        raw["algorithm"].update(estimator=mode, max_sweeps=3)
        cfg = config_from_dict(raw)
        inputs = tiny_inputs()
        settings = AggregatorSettings(register_timeout_s=20, round_deadline_s=20, estimator=f"127.0.0.1:{est.port}")
        h = start_aggregator(cfg, settings, tmp_path / "run", inputs=inputs)
        try:
            workers = [Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=g, device="cpu",
                                             estimator=f"127.0.0.1:{est.port}", connect_timeout_s=10), inputs=inputs)
                       for g in [(0, 1), (2, 3)]]
            threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
            for t in threads:
                t.start()
            assert h.wait(60) and h.run.error is None, h.run.error
        finally:
            h.stop(grace_s=0.5)
        sim = run_simulation(cfg, tmp_path / "sim", progress=False, inputs=inputs, plots=False)
        got = load_model_file(h.run_dir / "model_final.pt").params
        for a, b in zip(got, sim.params, strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
        rec = read_metrics(h.run_dir / "metrics.jsonl")[0]
        assert rec["fedent"]["phi2_pred"] == pytest.approx(sim.records[0]["fedent"]["phi2_pred"], rel=1e-9)
        if mode == "offline":
            assert read_json(h.run_dir / "estimator.json")["report"], "Algorithm 1's report is kept"
    finally:
        est.stop(0.5)


def test_more_workers_than_rpc_threads_is_refused_not_a_deadlock(start: Any) -> None:
    inputs = tiny_inputs(num_clients=8, per_client=3)
    h = start(tiny_config(num_clients=8), inputs, max_workers=8)
    stub = _stub(h)
    for c in range(4):  # 4 streams + 4 spare threads fill the pool of 8
        stub.Register(pb.RegisterRequest(client_ids=[c]))
    assert _code(lambda: stub.Register(pb.RegisterRequest(client_ids=[5]))) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_nan_probe_is_excluded_and_the_others_are_kept(start: Any) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config("fedent", rounds=1, fraction=1.0), inputs, quorum=0.5, round_deadline_s=20)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])
    probe = fake.next("probe").task
    msgs = [pb.Probe(cid=c, num_samples=12, scalars={"a": 0.1, "b": 1.0, "eta_prev": 0.01}) for c in range(4)]
    msgs[1].scalars["a"] = float("nan")
    with pytest.raises(grpc.RpcError) as e:
        fake.stub.SubmitProbes(pb.SubmitProbesRequest(worker_id=fake.wid, task_id=probe.task_id, round=0, probes=msgs))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "[1]" in e.value.details()
    fit = fake.next("fit").task
    assert list(fit.client_ids) == [0, 2, 3]  # the NaN prober is not asked to train
    fake.call.cancel()
    assert h.wait(20)


@pytest.mark.parametrize("encoding", ["full", "delta"])
def test_fetch_blob_answers_a_held_model_by_the_download_encoding(start: Any, encoding: str) -> None:
    """Registration tells the worker the download encoding; a FetchBlob naming a held model gets a delta stream
    (its first message says so) only under ``delta`` and only for a held model the aggregator has with that
    digest; a malformed held model is INVALID_ARGUMENT."""
    from fedentrpc import model_delta

    inputs = tiny_inputs()
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, download_encoding=encoding, chunk_bytes=4)
    stub = _stub(h)
    md5 = inputs.partition_info["md5"]
    reg = stub.Register(pb.RegisterRequest(worker_name="raw", client_ids=[0, 1]), timeout=10)
    assert mappers.download_encoding_from_msg(reg.download_encoding) == encoding
    stub.Ready(pb.ReadyRequest(worker_id=reg.worker_id, partition_md5=md5,
                               clients=[pb.ClientInfo(cid=c, num_samples=12) for c in (0, 1)]))
    fake = FakeWorker(h.port, [2, 3], md5)
    fit = fake.next("fit").task
    w = fake.model(fit.model_blob)
    held = model_delta.Held.of(fit.model_blob, w, "native").ref

    def fetch(ref: Any, start_chunk: int = 0) -> list[pb.AggregatorServiceFetchBlobResponse]:
        return list(stub.FetchBlob(pb.AggregatorServiceFetchBlobRequest(blob_id=fit.model_blob, held=ref,
                                                                         start_chunk=start_chunk)))

    same = fetch(mappers.held_to_msg(held))
    assert same[0].HasField("delta") is (encoding == "delta")
    if encoding == "delta":  # w(t) from w(t) itself: an all-zero XOR, a few hundred bytes
        info = mappers.delta_from_msg(same[0])
        assert info is not None and info.base_blob == fit.model_blob and info.digest == held.digest
        assert sum(len(m.chunk.data) for m in same) < 0.2 * sum(p.numel() * 4 for p in w)
        before = dict(h.run.remote.traffic)
        rest = fetch(mappers.held_to_msg(held), start_chunk=2)  # a cut delta download, resumed: the same chunks
        assert len(same) > 2 and [m.SerializeToString() for m in rest] == [m.SerializeToString() for m in same[2:]]
        after = h.run.remote.traffic
        assert after["bytes_down"] - before["bytes_down"] == sum(len(m.chunk.data) for m in rest)
        assert after["downloads_delta"] == before["downloads_delta"]  # a resumption is not a new download
    wrong = fetch(mappers.held_to_msg(model_delta.Held.of(fit.model_blob, [p + 1 for p in w], "native").ref))
    assert not wrong[0].HasField("delta")
    assert _code(lambda: fetch(pb.HeldModel(blob_id=fit.model_blob, digest=b"short"))) == \
        grpc.StatusCode.INVALID_ARGUMENT


def test_a_work_stream_without_heartbeats_is_closed_by_the_aggregator(start: Any) -> None:
    """The Work stream idles between rounds on purpose, so its deadline is its worker's heartbeats
    (fedentrpc.stream_deadline calls it a session): a worker that stops heartbeating loses the stream."""
    inputs = tiny_inputs()
    h = start(tiny_config(rounds=1), inputs, heartbeat_s=0.2, heartbeat_misses=2, register_timeout_s=30)
    fake = FakeWorker(h.port, [0, 1, 2, 3], inputs.partition_info["md5"])  # never heartbeats
    deadline = time.monotonic() + 20
    while not fake.call.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.call.done() and fake.call.code() == grpc.StatusCode.OK  # ended by the server, not cut by us
    assert not _stub(h).Heartbeat(pb.HeartbeatRequest(worker_id=fake.wid), timeout=5).known
    fake.channel.close()
