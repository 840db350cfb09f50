"""client.worker: a worker that finds the run already finished has nothing to do and ends normally (exit 0,
so `restart: on-failure` leaves it stopped); a run that failed is still an error (it restarts with the
aggregator). A damaged client-state file fails that client alone, in a probe as in a fit. Delta downloads: each
round's model is rebuilt bit for bit from the last one; a worker that missed a round, restarted, or holds a model
under the right name with another digest gets the whole model, and a delta that rebuilds to the wrong digest is
fetched again whole."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import torch
from conftest import tiny_config, tiny_inputs
from finished_runs import make_finished_run

from client.settings import WorkerSettings
from client.worker import RunOverError, Worker, WorkerError, connect_reason
from fedent.rng import sample_clients
from fedent.runlog import read_metrics
from fedentrpc import codec, mappers, model_delta
from fedentrpc.v1 import aggregator_pb2 as pb
from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc
from fedentrpc.v1.aggregator_pb2 import AggregatorServiceFetchBlobResponse as BlobMessage
from server.app import start_aggregator
from server.downloads import DeltaDownloads
from server.finished import serve_finished
from server.settings import AggregatorSettings

SETTINGS = AggregatorSettings(register_timeout_s=20.0, round_deadline_s=20.0, quorum=0.5)


def _worker(port: int) -> Worker:
    return Worker(WorkerSettings(aggregator=f"127.0.0.1:{port}", client_ids=(0, 1), device="cpu", name="w",
                                 connect_timeout_s=10, reconnect_attempts=0))


def test_a_finished_run_means_nothing_to_do(tmp_path: Path) -> None:
    h = serve_finished(make_finished_run(tmp_path / "run"), "127.0.0.1", 0)
    try:
        assert _worker(h.port).run() is True
    finally:
        h.stop()


class _Failed(pb_grpc.AggregatorServiceServicer):
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the run is over (round 3 missed its quorum); nothing to do")
        raise AssertionError


def test_a_failed_run_is_an_error_not_nothing_to_do() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_AggregatorServiceServicer_to_server(_Failed(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(WorkerError, match="missed its quorum") as e:
            _worker(port).run()
        assert not isinstance(e.value, RunOverError)
    finally:
        server.stop(0)


def _first_new_client(seed: int, clients: int, fraction: float) -> tuple[int, int]:
    """(round r >= 1, a client sampled in r and in no earlier round): its state is loaded, never saved, first."""
    seen: set[int] = set()
    for rnd in range(20):
        picked = sample_clients(seed, rnd, clients, fraction)
        fresh = [c for c in picked if c not in seen]
        if rnd >= 1 and fresh:
            return rnd, fresh[0]
        seen.update(picked)
    raise AssertionError("no client joins late")


@pytest.mark.parametrize("algorithm", ["fedent", "scaffold"])  # FedEnt probes with the state, SCAFFOLD fits
def test_a_damaged_state_file_fails_only_its_client(tmp_path: Path, algorithm: str) -> None:
    cfg, inputs = tiny_config(algorithm, rounds=1), tiny_inputs()
    rnd, victim = _first_new_client(cfg.train.seed, cfg.data.num_clients, cfg.train.fraction)
    cfg = tiny_config(algorithm, rounds=rnd + 1)
    run_dir, state_dir = tmp_path / "run", tmp_path / "state"
    run_dir.mkdir()
    (run_dir / "instance").write_text("0123456789ab\n")  # the run key is known: <run id>.<instance>
    store = state_dir / f"{run_dir.name}.0123456789ab"
    store.mkdir(parents=True)
    (store / f"c{victim:06d}-r{rnd - 1:08d}.state").write_bytes(b"not a fedent state file")
    h = start_aggregator(cfg, SETTINGS, run_dir, inputs=inputs)
    worker = Worker(WorkerSettings(aggregator=f"127.0.0.1:{h.port}", client_ids=(0, 1, 2, 3), device="cpu",
                                   connect_timeout_s=10, state_dir=str(state_dir)), inputs=inputs)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        assert h.wait(60) and h.run.error is None, h.run.error
        t.join(10)
    finally:
        h.stop(grace_s=0.5)
    rec = read_metrics(run_dir / "metrics.jsonl")[rnd]
    failed = rec["diagnostics"].get("failed_clients", {})
    assert list(failed) == [str(victim)] and "ClientStoreError" in failed[str(victim)], rec["diagnostics"]
    assert "skipped" not in rec["diagnostics"]  # the worker's other client was aggregated


# ---- a worker pointed at a wrong address (issue 27: 60 s of silence, then one message for every cause): each
# failed attempt is logged with its reason, and the final error names the reason and --connect-timeout ------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("address", "why"), [(f"127.0.0.1:{_free_port()}", "connection refused"),
                                              ("no-such-host.invalid:50051", "name not resolved")])
def test_each_failed_attempt_says_why(address: str, why: str, caplog: pytest.LogCaptureFixture) -> None:
    w = Worker(WorkerSettings(aggregator=address, client_ids=(0,), device="cpu", name="w", connect_timeout_s=2.5,
                              reconnect_attempts=0))
    with caplog.at_level(logging.WARNING, logger="fedent.worker"), pytest.raises(WorkerError) as e:
        w.connect(attempt_s=0.5)
    attempts = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert len(attempts) >= 2 and all(why in a and "--connect-timeout" in a for a in attempts), attempts
    assert why in str(e.value) and "--connect-timeout" in str(e.value) and address in str(e.value)


def test_a_tls_failure_is_named() -> None:
    details = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:50051: "
               "Ssl handshake failed: SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED")
    assert connect_reason(details).startswith("TLS handshake failed (check --tls-ca")


# ---- delta downloads (--download-encoding delta): the worker offers the model it holds and rebuilds the next
# one from a delta; a worker that missed rounds, restarted or holds a mismatched base gets the whole model --------

def _round_models(rounds: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(4)
    out = [[torch.randn(40, 30, generator=g), torch.randn(30, generator=g)]]
    for _ in range(rounds - 1):
        out.append([t + 1e-3 * torch.randn(t.shape, generator=g) for t in out[-1]])
    return out


class _Models(pb_grpc.AggregatorServiceServicer):
    """FetchBlob over server.downloads: ``requests`` lists (blob, held blob or None, "delta" | "full");
    ``corrupt``: a delta's first message names a wrong rebuilt digest."""

    def __init__(self, history: int = 1, corrupt: bool = False) -> None:
        self.deltas = DeltaDownloads(codec.TransferSpec(), history)
        self.full: dict[str, codec.EncodedTensors] = {}
        self.requests: list[tuple[str, str | None, str]] = []
        self.corrupt = corrupt

    def publish(self, rnd: int, params: list[torch.Tensor]) -> None:
        self.deltas.publish(rnd, f"r{rnd}-model", params)
        self.full[f"r{rnd}-model"] = codec.encode_tensors({"params": params}, codec.TransferSpec(), BlobMessage)

    def FetchBlob(self, request: pb.AggregatorServiceFetchBlobRequest,
                  context: grpc.ServicerContext) -> Iterator[BlobMessage]:
        held = mappers.held_from_msg(request)
        full = self.full[request.blob_id]
        enc = self.deltas.serve(request.blob_id, held, full.wire_bytes) if held else None
        self.requests.append((request.blob_id, held.blob_id if held else None, "full" if enc is None else "delta"))
        msgs = list((enc or full).as_messages(BlobMessage))
        if enc is not None and self.corrupt:
            first = BlobMessage()
            first.CopyFrom(msgs[0])
            first.delta.digest = b"\0" * 32
            msgs[0] = first
        yield from msgs[request.start_chunk:]


def _delta_worker(port: int, delta: bool = True) -> Worker:
    w = _worker(port)
    w.worker_id, w.download_delta = "w", delta
    return w


def _same(got: codec.Bundle, want: list[torch.Tensor]) -> bool:
    return all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(got["params"], want, strict=True))


@contextlib.contextmanager
def _models_server(agg: _Models) -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_AggregatorServiceServicer_to_server(agg, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(0)


def test_a_worker_rebuilds_each_round_from_the_last_and_rejoins_whole() -> None:
    models = _round_models(5)
    agg = _Models(history=1)
    with _models_server(agg) as port:
        w = _delta_worker(port)
        for r in (0, 1, 2):
            agg.publish(r, models[r])
            assert _same(w.download_model(f"r{r}-model"), models[r])  # bit-identical, rebuilt or not
        for r in (3, 4):  # the worker misses round 3: its r2 model is older than delta_history allows
            agg.publish(r, models[r])
        assert _same(w.download_model("r4-model"), models[4])
        restarted = _delta_worker(port)  # a new process holds nothing
        assert _same(restarted.download_model("r4-model"), models[4])
        w.close()
        restarted.close()
    assert agg.requests == [("r0-model", None, "full"), ("r1-model", "r0-model", "delta"),
                            ("r2-model", "r1-model", "delta"), ("r4-model", "r2-model", "full"),
                            ("r4-model", None, "full")]
    assert w.held is not None and w.held.blob_id == "r4-model" and w.held.digest == agg.deltas.digest_of("r4-model")


def test_a_mismatched_base_gets_the_whole_model_and_a_bad_delta_is_fetched_again_whole(
        caplog: pytest.LogCaptureFixture) -> None:
    models = _round_models(3)
    agg = _Models()
    with _models_server(agg) as port:
        w = _delta_worker(port)
        agg.publish(0, models[0])
        agg.publish(1, models[1])
        w.held = model_delta.Held.of("r0-model", models[2], "native")  # the right name, another model
        assert _same(w.download_model("r1-model"), models[1])
        bad = _Models(corrupt=True)
        bad.publish(0, models[0])
        bad.publish(1, models[1])
        with _models_server(bad) as port2:
            v = _delta_worker(port2)
            v.held = model_delta.Held.of("r0-model", models[0], "native")
            with caplog.at_level(logging.WARNING, logger="fedent.worker"):
                assert _same(v.download_model("r1-model"), models[1])
            v.close()
        off = _delta_worker(port, delta=False)  # --download-encoding full: nothing offered, nothing kept
        off.held = model_delta.Held.of("r0-model", models[0], "native")
        assert _same(off.download_model("r1-model"), models[1])
        w.close()
        off.close()
    assert agg.requests == [("r1-model", "r0-model", "full"), ("r1-model", None, "full")]
    assert bad.requests == [("r1-model", "r0-model", "delta"), ("r1-model", None, "full")]
    assert any("did not rebuild the model" in r.getMessage() for r in caplog.records)
    assert w.held is not None and w.held.digest == agg.deltas.digest_of("r1-model")
