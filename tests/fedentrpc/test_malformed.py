"""Garbage bytes on a gRPC method: INVALID_ARGUMENT and one log line, for both services (real servers on
port 0), unary and streamed requests, and authentication still first."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from conftest import FakeWorker, tiny_config, tiny_inputs

from estimator.service import EstimatorHandle, create_estimator_service
from estimator.settings import EstimatorSettings
from fedentrpc import codec
from fedentrpc.malformed import Malformed, MalformedRequestInterceptor, guard_deserializer, message_name
from fedentrpc.security.flags import ServerSecurity
from fedentrpc.security.interceptors import (
    AuthInterceptor,
    MetadataClientInterceptor,
    bearer_metadata,
    server_interceptors,
)
from fedentrpc.security.tokens import read_worker_token
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from fedentrpc.v1 import estimator_pb2 as est_pb
from fedentrpc.v1 import estimator_pb2_grpc as est_grpc
from server.certs import make_dev_pki

GARBAGE = b"\xff\xff\xff\xff\x0f garbage"
AGG = "/fedentrpc.v1.AggregatorService/"
EST = "/fedentrpc.v1.EstimatorService/"
TIMEOUT = 10


@pytest.fixture
def estimator() -> Iterator[EstimatorHandle]:
    h = create_estimator_service(EstimatorSettings(port=0))
    yield h
    h.stop(0.5)


def _raw_unary(ch: grpc.Channel, path: str, data: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        ch.unary_unary(path)(data, timeout=TIMEOUT)
    return ei.value


def _raw_unary_stream(ch: grpc.Channel, path: str, data: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        list(ch.unary_stream(path)(data, timeout=TIMEOUT))
    return ei.value


def _raw_stream_unary(ch: grpc.Channel, path: str, parts: list[bytes]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        ch.stream_unary(path)(iter(parts), timeout=TIMEOUT)
    return ei.value


def _raw_stream_stream(ch: grpc.Channel, path: str, parts: list[bytes]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        list(ch.stream_stream(path)(iter(parts), timeout=TIMEOUT))
    return ei.value


def _assert_rejected(err: grpc.RpcError, message: str) -> None:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())  # type: ignore[attr-defined]
    assert err.details().startswith(f"malformed {message}: ")  # type: ignore[attr-defined]


def _assert_one_line(caplog: pytest.LogCaptureFixture, message: str) -> None:
    lines = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert message in lines[0].getMessage() and "\n" not in lines[0].getMessage()
    assert lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    assert "Traceback" not in caplog.text and "Exception deserializing" not in caplog.text
    caplog.clear()


def test_garbage_to_the_aggregator_is_invalid_argument_with_one_line(start: Any,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    inputs = tiny_inputs()
    h = start(tiny_config(), inputs)
    # a registered worker with an open fit task: the header of its upload stream passes, so the next message is read
    fake = FakeWorker(h.port, [0, 1, 2, 3], str(inputs.partition_info["md5"]))
    fit = fake.next("fit").task
    with grpc.insecure_channel(f"127.0.0.1:{h.port}") as ch, caplog.at_level(logging.INFO):
        _assert_rejected(_raw_unary(ch, AGG + "Heartbeat", GARBAGE), "HeartbeatRequest")
        _assert_one_line(caplog, "HeartbeatRequest")
        # client-streaming: garbage as the first message, and after a parseable one
        _assert_rejected(_raw_stream_unary(ch, AGG + "SubmitUpdate", [GARBAGE]), "SubmitUpdateRequest")
        _assert_one_line(caplog, "SubmitUpdateRequest")
        first = pb.SubmitUpdateRequest(header=pb.UpdateHeader(worker_id=fake.wid, task_id=fit.task_id, round=fit.round,
                                                              cid=0, num_samples=1)).SerializeToString()
        _assert_rejected(_raw_stream_unary(ch, AGG + "SubmitUpdate", [first, GARBAGE, GARBAGE]),
                         "SubmitUpdateRequest")
        _assert_one_line(caplog, "SubmitUpdateRequest")
        # server-streaming method with a garbage request
        _assert_rejected(_raw_unary_stream(ch, AGG + "Work", GARBAGE), "WorkRequest")
        _assert_one_line(caplog, "WorkRequest")
        # the server keeps serving
        assert pb_grpc.AggregatorServiceStub(ch).GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT).phase == \
            pb.RUN_PHASE_TRAINING


def test_garbage_to_the_estimator_is_invalid_argument_with_one_line(estimator: EstimatorHandle,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    tensors = [torch.randn(3, 4)]
    chunks = [m.SerializeToString() for m in codec.stream_tensors({"params": tensors}, est_pb.PutBlobRequest,
                                                                   codec.TransferSpec(chunk_bytes=16))]
    assert len(chunks) > 2
    with grpc.insecure_channel(f"127.0.0.1:{estimator.port}") as ch, caplog.at_level(logging.INFO):
        _assert_rejected(_raw_unary(ch, EST + "SolveOnline", GARBAGE), "SolveOnlineRequest")
        _assert_one_line(caplog, "SolveOnlineRequest")
        # a garbage chunk mid-upload ends the call there; nothing is stored
        _assert_rejected(_raw_stream_unary(ch, EST + "PutBlob", [chunks[0], GARBAGE, *chunks[2:]]),
                         "PutBlobRequest")
        _assert_one_line(caplog, "PutBlobRequest")
        # bidirectional stream: garbage after the hello (read on the hub's own thread) ends the stream too
        hello = est_pb.OracleRequest(hello=est_pb.OracleHello(worker_id="w0", run_id="r", client_ids=[0]))
        _assert_rejected(_raw_stream_stream(ch, EST + "Oracle", [hello.SerializeToString(), GARBAGE]), "OracleRequest")
        _assert_one_line(caplog, "OracleRequest")
        # the server keeps serving: the same upload without the garbage is stored and reads back
        stub = est_grpc.EstimatorServiceStub(ch)
        ref = stub.PutBlob(iter([est_pb.PutBlobRequest.FromString(c) for c in chunks]), timeout=TIMEOUT)
        back = codec.decode_tensors(stub.FetchBlob(est_pb.EstimatorServiceFetchBlobRequest(blob_id=ref.blob_id),
                                                   timeout=TIMEOUT))
        assert torch.equal(back["params"][0], tensors[0])


def test_authentication_still_runs_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pki = make_dev_pki(tmp_path, hosts=["127.0.0.1"], workers=["worker-0"])
    sec = ServerSecurity(insecure=True, token_file=pki.tokens_file).validate()
    assert [type(i) for i in server_interceptors(sec)] == [AuthInterceptor, MalformedRequestInterceptor]
    assert [type(i) for i in server_interceptors(ServerSecurity(insecure=True))] == [MalformedRequestInterceptor]
    h = create_estimator_service(EstimatorSettings(port=0, security=sec))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{h.port}") as ch, caplog.at_level(logging.INFO):
            for err in (_raw_unary(ch, EST + "SolveOnline", GARBAGE),
                        _raw_stream_unary(ch, EST + "PutBlob", [GARBAGE])):
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
            assert "malformed" not in caplog.text and "Traceback" not in caplog.text
            token = read_worker_token(pki.token_files["worker-0"])
            authed = grpc.intercept_channel(ch, MetadataClientInterceptor(bearer_metadata(token)))
            _assert_rejected(_raw_unary(authed, EST + "SolveOnline", GARBAGE), "SolveOnlineRequest")
            _assert_one_line(caplog, "SolveOnlineRequest")
    finally:
        h.stop(0.5)


def test_the_guarded_deserializer_never_raises() -> None:
    des = guard_deserializer(pb.RegisterRequest.FromString)
    assert message_name(pb.RegisterRequest.FromString) == "RegisterRequest"
    ok = pb.RegisterRequest(worker_name="w")
    assert des(ok.SerializeToString()) == ok
    bad = des(GARBAGE)
    assert isinstance(bad, Malformed) and bad.type_name == "RegisterRequest" and "\n" not in bad.error
