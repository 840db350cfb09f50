"""TLS, mutual TLS and token authentication on real gRPC servers (port 0), plus log/config redaction.

The protected service is grpc_health's servicer with the interceptor told to protect it (by default
health checks stay open, which is also tested).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedentrpc.security.errors import SecurityConfigError
from fedentrpc.security.flags import (
    ClientSecurity,
    ServerSecurity,
    add_client_security_args,
    add_server_security_args,
    client_security_from_args,
    server_security_from_args,
)
from fedentrpc.security.interceptors import AuthInterceptor, bearer_token
from fedentrpc.security.redaction import RedactingFilter, install_log_redaction, redact_config, redact_text
from fedentrpc.security.tls import bind, open_channel
from fedentrpc.security.tokens import TokenRegistry, read_worker_token, token_hash
from server.certs import CertBundle, make_dev_pki, revoke_workers

SERVING = health_pb2.HealthCheckResponse.SERVING
TIMEOUT = 5.0


@pytest.fixture(scope="module")
def pki_master(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    return make_dev_pki(tmp_path_factory.mktemp("pki"), hosts=["localhost", "127.0.0.1"],
                        workers=["worker-0", "worker-1"], days=1)


@pytest.fixture()
def pki(pki_master: CertBundle, tmp_path: Path) -> CertBundle:
    """A per-test copy, so revoking in one test does not leak into another."""
    out = tmp_path / "pki"
    shutil.copytree(pki_master.out_dir, out)
    return make_bundle_at(out)


def make_bundle_at(out: Path) -> CertBundle:
    return CertBundle(out_dir=out, ca_cert=out / "ca.crt", ca_key=out / "ca.key", server_cert=out / "server.crt",
                      server_key=out / "server.key",
                      client_certs={w: (out / "clients" / f"{w}.crt", out / "clients" / f"{w}.key")
                                    for w in ("worker-0", "worker-1")},
                      tokens_file=out / "tokens.json",
                      token_files={w: out / "tokens" / f"{w}.token" for w in ("worker-0", "worker-1")})


def token_of(pki: CertBundle, worker: str) -> str:
    assert pki.tokens_file is not None
    return json.loads(pki.tokens_file.read_text())["workers"][worker]


ServerFactory = Callable[..., int]


@pytest.fixture()
def serve() -> Iterator[ServerFactory]:
    """Start a health server with the given security; returns its port. Stopped at teardown."""
    servers: list[grpc.Server] = []

    def start(sec: ServerSecurity, protect_health: bool = True, tokens: TokenRegistry | None = None,
              servicer: health.HealthServicer | None = None) -> int:
        interceptors = []
        if sec.authenticates:
            reg = tokens or (TokenRegistry(sec.token_file, min_reload_interval_s=0.0) if sec.token_file else None)
            interceptors.append(AuthInterceptor(tokens=reg, accept_client_certs=sec.require_client_auth,
                                                open_prefixes=() if protect_health else
                                                ("/grpc.health.v1.Health/",)))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=interceptors)
        health_pb2_grpc.add_HealthServicer_to_server(servicer or health.HealthServicer(), server)
        port = bind(server, "127.0.0.1:0", sec)
        server.start()
        servers.append(server)
        return port

    yield start
    for s in servers:
        s.stop(None)


def check(port: int, sec: ClientSecurity, host: str = "localhost") -> int:
    with open_channel(f"{host}:{port}", sec) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status


def code_of(port: int, sec: ClientSecurity, host: str = "localhost") -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as ei:
        check(port, sec, host)
    return ei.value.code()  # type: ignore[attr-defined]


def tls_server(pki: CertBundle, mtls: bool = False, tokens: bool = True) -> ServerSecurity:
    return ServerSecurity(cert=pki.server_cert, key=pki.server_key, ca=pki.ca_cert if mtls else None,
                          require_client_auth=mtls, token_file=pki.tokens_file if tokens else None).validate()


def client(pki: CertBundle, token: str | None = None, cert_of: str | None = None) -> ClientSecurity:
    crt, key = pki.client_certs[cert_of] if cert_of else (None, None)
    return ClientSecurity(ca=pki.ca_cert, cert=crt, key=key, token=token).validate()


# ---- TLS and mutual TLS ------------------------------------------------------------------------------

def test_tls_handshake_with_generated_ca_and_right_token(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(tls_server(pki))
    assert check(port, client(pki, token_of(pki, "worker-0"))) == SERVING
    assert check(port, client(pki, token_of(pki, "worker-1")), host="127.0.0.1") == SERVING  # IP SAN


def test_plaintext_client_to_tls_server_fails(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(tls_server(pki, tokens=False))
    assert code_of(port, ClientSecurity(insecure=True)) == grpc.StatusCode.UNAVAILABLE


def test_client_trusting_another_ca_fails(pki: CertBundle, serve: ServerFactory, tmp_path: Path) -> None:
    other = make_dev_pki(tmp_path / "other", workers=["worker-0"])
    port = serve(tls_server(pki, tokens=False))
    assert code_of(port, ClientSecurity(ca=other.ca_cert)) == grpc.StatusCode.UNAVAILABLE


def test_mtls_without_client_cert_fails(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(tls_server(pki, mtls=True))
    # even a valid token does not get past a missing client certificate
    assert code_of(port, client(pki, token_of(pki, "worker-0"))) == grpc.StatusCode.UNAVAILABLE


def test_mtls_identity_alone_authenticates(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(tls_server(pki, mtls=True))
    assert check(port, client(pki, cert_of="worker-1")) == SERVING


def test_mtls_cert_and_token_must_name_the_same_worker(pki: CertBundle, serve: ServerFactory,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    port = serve(tls_server(pki, mtls=True))
    tok0 = token_of(pki, "worker-0")
    assert check(port, client(pki, tok0, cert_of="worker-0")) == SERVING
    with caplog.at_level(logging.WARNING, logger="fedent.security"):
        assert code_of(port, client(pki, tok0, cert_of="worker-1")) == grpc.StatusCode.UNAUTHENTICATED
    assert "certificate of worker-1" in caplog.text and tok0 not in caplog.text


def test_mtls_revoked_certificate_is_rejected(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(tls_server(pki, mtls=True))
    assert pki.tokens_file is not None
    revoke_workers(pki.tokens_file, ["worker-1"])
    assert code_of(port, client(pki, cert_of="worker-1")) == grpc.StatusCode.UNAUTHENTICATED
    assert check(port, client(pki, cert_of="worker-0")) == SERVING


# ---- tokens ------------------------------------------------------------------------------------------

def test_wrong_or_missing_token_is_unauthenticated(pki: CertBundle, serve: ServerFactory,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    port = serve(tls_server(pki))
    wrong = "x" * 43
    with caplog.at_level(logging.WARNING, logger="fedent.security"):
        assert code_of(port, client(pki, wrong)) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(port, client(pki, None)) == grpc.StatusCode.UNAUTHENTICATED
    assert "unknown token" in caplog.text and "no credentials" in caplog.text
    assert "/grpc.health.v1.Health/Check" in caplog.text and "127.0.0.1" in caplog.text  # method and peer
    assert wrong not in caplog.text


def test_revoked_token_is_unauthenticated_after_reload(pki: CertBundle, serve: ServerFactory,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    port = serve(tls_server(pki))
    tok1 = token_of(pki, "worker-1")
    assert check(port, client(pki, tok1)) == SERVING
    assert pki.tokens_file is not None
    revoke_workers(pki.tokens_file, ["worker-1"])  # the running server picks the change up
    with caplog.at_level(logging.INFO, logger="fedent.security"):
        assert code_of(port, client(pki, tok1)) == grpc.StatusCode.UNAUTHENTICATED
    assert "(worker worker-1): revoked" in caplog.text and tok1 not in caplog.text
    assert check(port, client(pki, token_of(pki, "worker-0"))) == SERVING


def test_streaming_method_is_protected_too(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(tls_server(pki))
    with open_channel(f"localhost:{port}", client(pki, "y" * 43)) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        with pytest.raises(grpc.RpcError) as ei:
            next(stream)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    with open_channel(f"localhost:{port}", client(pki, token_of(pki, "worker-0"))) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        assert next(stream).status == SERVING
        stream.cancel()


def test_revocation_cuts_an_open_stream_at_its_next_message(pki: CertBundle, serve: ServerFactory) -> None:
    servicer = health.HealthServicer()
    servicer.set("", SERVING)
    port = serve(tls_server(pki), servicer=servicer)
    with open_channel(f"localhost:{port}", client(pki, token_of(pki, "worker-1"))) as ch:
        stream = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=TIMEOUT)
        assert next(stream).status == SERVING
        assert pki.tokens_file is not None
        revoke_workers(pki.tokens_file, ["worker-1"])
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # the stream's next message
        with pytest.raises(grpc.RpcError) as ei:
            next(stream)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]


def test_health_stays_open_by_default(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(tls_server(pki), protect_health=False)
    assert check(port, client(pki, None)) == SERVING


def test_insecure_mode_still_checks_tokens(pki: CertBundle, serve: ServerFactory) -> None:
    port = serve(ServerSecurity(insecure=True, token_file=pki.tokens_file).validate())
    assert check(port, ClientSecurity(insecure=True, token=token_of(pki, "worker-0"))) == SERVING
    assert code_of(port, ClientSecurity(insecure=True, token="z" * 43)) == grpc.StatusCode.UNAUTHENTICATED


def test_token_never_reaches_captured_logs(pki: CertBundle, serve: ServerFactory,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Every path that logs (rejections, insecure-channel warning, reload) keeps tokens out."""
    tok0, tok1 = token_of(pki, "worker-0"), token_of(pki, "worker-1")
    with caplog.at_level(logging.DEBUG):
        port = serve(tls_server(pki))
        check(port, client(pki, tok0))
        code_of(port, client(pki, tok0[::-1]))
        assert pki.tokens_file is not None
        revoke_workers(pki.tokens_file, ["worker-1"])
        code_of(port, client(pki, tok1))
        iport = serve(ServerSecurity(insecure=True, token_file=pki.tokens_file).validate())
        check(iport, ClientSecurity(insecure=True, token=tok0))
    assert caplog.records, "expected some log lines"
    for secret in (tok0, tok1, tok0[::-1], token_hash(tok0)):
        assert secret not in caplog.text


def test_token_registry_hashes_reload_and_bad_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"workers": {"a": "tok-a-123456789", "b": "sha256:" + token_hash("tok-b-123456789")}}))
    reg = TokenRegistry(path, min_reload_interval_s=0.0)
    assert reg.identify("tok-a-123456789") == "a" and reg.identify("tok-b-123456789") == "b"
    assert reg.identify("nope") is None and reg.workers == ["a", "b"]
    assert "tok-a-123456789" not in repr(vars(reg))  # only hashes are kept
    path.write_text("{ half written")
    with caplog.at_level(logging.ERROR, logger="fedent.security"):
        reg.reload_if_due()
    assert reg.identify("tok-a-123456789") == "a" and "keeping the previous" in caplog.text
    with pytest.raises(SecurityConfigError, match="expected"):
        bad = tmp_path / "bad.json"
        bad.write_text("[]")
        TokenRegistry(bad)


def test_bearer_token_parsing() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("Authorization", "bearer  abc ")]) == "abc"
    assert bearer_token([("authorization", "Basic abc")]) is None
    assert bearer_token([("x", "Bearer abc")]) is None and bearer_token(None) is None


def test_interceptor_needs_some_credential_source() -> None:
    with pytest.raises(SecurityConfigError):
        AuthInterceptor(tokens=None, accept_client_certs=False)


# ---- settings at the process edge -------------------------------------------------------------------

def _parse(add: Callable[[argparse.ArgumentParser], None], argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


def test_server_settings_flags_env_and_errors(pki: CertBundle) -> None:
    env = {"FEDENT_TLS_CERT": str(pki.server_cert), "FEDENT_TLS_KEY": str(pki.server_key),
           "FEDENT_TOKEN_FILE": str(pki.tokens_file)}
    sec = server_security_from_args(_parse(add_server_security_args, []), env=env)
    assert sec.cert == pki.server_cert and sec.token_file == pki.tokens_file and not sec.insecure
    sec2 = server_security_from_args(_parse(add_server_security_args, ["--tls-ca", str(pki.ca_cert),
                                                                       "--require-client-auth"]), env=env)
    assert sec2.require_client_auth and sec2.ca == pki.ca_cert
    with pytest.raises(SecurityConfigError, match="--insecure"):
        server_security_from_args(_parse(add_server_security_args, []), env={})
    assert server_security_from_args(_parse(add_server_security_args, ["--insecure"]), env={}).insecure
    assert server_security_from_args(_parse(add_server_security_args, []), env={"FEDENT_INSECURE": "1"}).insecure
    with pytest.raises(SecurityConfigError, match="excludes"):
        server_security_from_args(_parse(add_server_security_args, ["--insecure"]), env=env)
    with pytest.raises(SecurityConfigError, match="not found"):
        server_security_from_args(_parse(add_server_security_args, ["--tls-cert", "/nope.crt"]), env=env)
    with pytest.raises(SecurityConfigError, match="--tls-ca"):
        server_security_from_args(_parse(add_server_security_args, ["--require-client-auth"]), env=env)


def test_client_settings_and_token_files(pki: CertBundle, tmp_path: Path) -> None:
    tok = token_of(pki, "worker-1")
    args = _parse(add_client_security_args, ["--tls-ca", str(pki.ca_cert), "--token-file", str(pki.tokens_file)])
    sec = client_security_from_args(args, worker="worker-1", env={})
    assert sec.token == tok and tok not in repr(sec)
    one = _parse(add_client_security_args, ["--tls-ca", str(pki.ca_cert),
                                            "--token-file", str(pki.token_files["worker-1"])])
    assert client_security_from_args(one, env={}).token == tok
    with pytest.raises(SecurityConfigError, match="--name"):
        client_security_from_args(args, worker=None, env={})
    with pytest.raises(SecurityConfigError, match="no usable token"):
        client_security_from_args(args, worker="worker-9", env={})
    with pytest.raises(SecurityConfigError, match="--tls-ca"):
        client_security_from_args(_parse(add_client_security_args, []), env={})
    with pytest.raises(SecurityConfigError, match="both"):
        ClientSecurity(ca=pki.ca_cert, cert=pki.client_certs["worker-0"][0]).validate()
    two = tmp_path / "two.token"
    two.write_text("a b")
    with pytest.raises(SecurityConfigError, match="exactly one"):
        read_worker_token(two)
    with pytest.raises(SecurityConfigError, match="cannot read"):
        read_worker_token(tmp_path / "missing")


# ---- redaction ---------------------------------------------------------------------------------------

def test_redact_text_variants() -> None:
    tok = "AbC123-_xyzXYZ987654"
    for line in (f"authorization: Bearer {tok}", f"Authorization=bearer%20{tok}", f"token={tok}",
                 f"{{'authorization': 'Bearer {tok}'}}", f'"token": "{tok}"'):
        out = redact_text(line)
        assert tok not in out and "***" in out, line
    assert redact_text("round 3 done, 12 tokens of text") == "round 3 done, 12 tokens of text"
    assert redact_text(f"worker says {tok}", secrets=[tok]) == "worker says ***"


def test_log_filter_scrubs_messages_args_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    tok = "s3cr3t-token-value-42"
    logger = logging.getLogger("fedent.test.redact")
    filt = RedactingFilter([tok])
    caplog.handler.addFilter(filt)
    try:
        with caplog.at_level(logging.INFO, logger="fedent.test.redact"):
            logger.info("metadata %s", [("authorization", f"Bearer {tok}")])
            logger.info("plain %s", tok)
            try:
                raise RuntimeError(f"failed with {tok}")
            except RuntimeError:
                logger.exception("call failed")
    finally:
        caplog.handler.removeFilter(filt)
    assert tok not in caplog.text and caplog.text.count("***") >= 3


def test_install_log_redaction_on_root_handlers() -> None:
    root = logging.getLogger()
    handler = logging.StreamHandler()
    root.addHandler(handler)
    try:
        filt = install_log_redaction(["topsecret-123456"])
        assert filt in handler.filters and filt in root.filters
    finally:
        root.removeHandler(handler)
        root.removeFilter(filt)


def test_redact_config_for_dashboard() -> None:
    cfg = {"train": {"rounds": 3, "lr": 0.1}, "cluster": {"token": "abcdefgh12", "tls_key": "/x/server.key",
                                                          "api_key": "k", "monkey": "banana", "keys": None,
                                                          "note": "Bearer abcdefghijk"},
           "workers": [{"password": "p"}]}
    red = redact_config(cfg)
    assert red["train"] == {"rounds": 3, "lr": 0.1}
    assert red["cluster"]["token"] == red["cluster"]["tls_key"] == red["cluster"]["api_key"] == "***"
    assert red["cluster"]["monkey"] == "banana" and red["cluster"]["keys"] is None
    assert red["cluster"]["note"] == "Bearer ***" and red["workers"][0]["password"] == "***"
    assert cfg["cluster"]["token"] == "abcdefgh12"  # the input is not modified


# ---- the aggregator and workers, secured --------------------------------------------------------------

def test_secured_aggregator_serves_authenticated_workers_only(pki: CertBundle, tmp_path: Path) -> None:
    """A whole (tiny) run over mutual TLS + tokens; an intruder with a CA-signed cert but a wrong token is
    refused at registration."""
    import threading

    from conftest import tiny_config, tiny_inputs

    from client.settings import WorkerSettings
    from client.worker import Worker, WorkerError
    from server.app import start_aggregator
    from server.settings import AggregatorSettings

    cfg, inputs = tiny_config("fedavg", rounds=2), tiny_inputs()
    h = start_aggregator(cfg, AggregatorSettings(register_timeout_s=20.0, round_deadline_s=20.0),
                         tmp_path / "run", inputs=inputs, security=tls_server(pki, mtls=True))
    try:
        intruder = Worker(WorkerSettings(aggregator=f"localhost:{h.port}", client_ids=(0, 1), device="cpu",
                                         connect_timeout_s=10,
                                         security=client(pki, "not-a-token-0123456789", cert_of="worker-0")),
                          inputs=inputs)
        with pytest.raises(WorkerError, match="UNAUTHENTICATED"):
            intruder.run()
        workers = [Worker(WorkerSettings(aggregator=f"localhost:{h.port}", client_ids=g, device="cpu",
                                         connect_timeout_s=10, security=client(pki, token_of(pki, w), cert_of=w)),
                          inputs=inputs) for w, g in (("worker-0", (0, 1)), ("worker-1", (2, 3)))]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        for t in threads:
            t.start()
        assert h.wait(60), "the secured run did not finish"
        assert h.run.error is None, h.run.error
        for t in threads:
            t.join(10)
        assert all(w.tasks_done > 0 for w in workers)
    finally:
        h.stop(grace_s=0.5)


def test_launcher_makes_the_pki_once_and_reuses_it_on_resume(tmp_path: Path) -> None:
    from conftest import tiny_config

    from server.launcher import Cluster, LaunchSettings

    cl = Cluster(tiny_config("fedavg"), tmp_path / "run", LaunchSettings(workers=2))
    first = cl.ensure_pki(["aggregator", "worker-0", "worker-1"])
    ca = first.ca_cert.read_bytes()
    again = cl.ensure_pki(["aggregator", "worker-0", "worker-1"])
    assert again.ca_cert.read_bytes() == ca  # a resumed launch keeps certificates and tokens
    cl.pki = again
    args = cl.client_security_args("worker-1")
    assert args[args.index("--tls-cert") + 1].endswith("worker-1.crt") and "--insecure" not in args
    assert "--require-client-auth" in cl.server_security_args()
    assert cl.client_security("aggregator").token == token_of(again, "aggregator")
    # more workers: the same CA issues the new identity (tests/server/test_launcher.py checks the rest)
    grown = cl.ensure_pki(["aggregator", "worker-0", "worker-1", "worker-2"])
    assert grown.ca_cert.read_bytes() == ca and "worker-2" in grown.client_certs
    plain = Cluster(tiny_config("fedavg"), tmp_path / "plain", LaunchSettings(workers=2, secure=False))
    assert plain.server_security_args() == ["--insecure"] and plain.client_security_args("worker-0") == ["--insecure"]


def test_process_entry_points_refuse_to_start_without_tls_or_insecure(capsys: pytest.CaptureFixture[str]) -> None:
    from client.__main__ import main as worker_main
    from server.__main__ import main as aggregator_main

    assert aggregator_main(["--config", "configs/demo.yaml", "--port", "0"]) == 2
    assert worker_main(["--aggregator", "127.0.0.1:1", "--clients", "0-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["aggregator: TLS needs --tls-cert and --tls-key (or --insecure for local experiments)",
                   "worker: TLS needs --tls-ca to verify the server (or pass --insecure)"]


def test_aggregator_dials_the_estimator_as_itself(pki: CertBundle) -> None:
    from server.__main__ import estimator_client_security

    tls = tls_server(pki, mtls=True)
    assert estimator_client_security(tls, None, "") is None
    assert estimator_client_security(ServerSecurity(insecure=True), None, "h:1") == ClientSecurity(insecure=True)
    sec = estimator_client_security(tls, None, "h:1", str(pki.client_certs["worker-0"][0]),
                                    str(pki.client_certs["worker-0"][1]))
    assert sec is not None and sec.ca == pki.ca_cert and sec.cert == pki.client_certs["worker-0"][0]
    assert sec.token is None  # the dev tokens file here has no 'aggregator' entry
    with pytest.raises(SecurityConfigError, match="--tls-ca"):
        estimator_client_security(ServerSecurity(cert=pki.server_cert, key=pki.server_key), None, "h:1")


# ---- identity bound to credentials: a worker acts only for itself ------------------------------------

def _agg_stub(port: int, sec: ClientSecurity) -> tuple[grpc.Channel, Any]:
    from fedentrpc.v1 import aggregator_pb2_grpc as pb_grpc

    ch = open_channel(f"localhost:{port}", sec)
    return ch, pb_grpc.AggregatorServiceStub(ch)


def _denied(call: Callable[[], Any]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as ei:
        call()
    return ei.value.code()  # type: ignore[attr-defined]


def _update_parts(wid: str, cid: int, params: Any, task_id: int = 1, rnd: int = 0) -> Any:
    from fedent.strategies.base import ClientUpdate
    from fedentrpc import mappers

    u = ClientUpdate(cid=cid, params=params, num_samples=12, train_loss=0.1)
    return mappers.update_to_parts(u, mappers.UpdateMeta(wid, task_id, rnd))


PD = grpc.StatusCode.PERMISSION_DENIED


def test_register_under_another_workers_name_or_clients_is_denied(
        pki: CertBundle, start: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Worker-1 (its own valid token) claiming worker-0's name or clients: PERMISSION_DENIED, logged, and
    worker-0's registration, Work stream and clients stay its own. Worker-0 itself may re-register."""
    from conftest import FakeWorker, tiny_config, tiny_inputs

    from fedentrpc.v1 import aggregator_pb2 as pb

    inputs = tiny_inputs()
    md5 = str(inputs.partition_info["md5"])
    h = start(tiny_config("fedavg"), inputs, security=tls_server(pki))
    tok0, tok1 = token_of(pki, "worker-0"), token_of(pki, "worker-1")
    a = FakeWorker(h.port, [0, 1], md5, name="worker-0", security=client(pki, tok0))
    ch, b = _agg_stub(h.port, client(pki, tok1))
    with caplog.at_level(logging.WARNING, logger="fedent.security"):
        for name in ("worker-0", "worker-1", ""):  # A's name, or B's own (or none) with A's clients
            assert _denied(lambda n=name: b.Register(pb.RegisterRequest(worker_name=n, client_ids=[0, 1]),
                                                     timeout=TIMEOUT)) == PD
        assert _denied(lambda: b.Register(pb.RegisterRequest(worker_name="worker-0", client_ids=[2, 3]),
                                          timeout=TIMEOUT)) == PD
    wa = h.run.registry.workers[a.wid]
    assert not wa.gone and wa.streaming and a.call.is_active()  # A's Work stream stays open
    assert h.run.registry.owner == {0: a.wid, 1: a.wid} and len(h.run.registry.workers) == 1  # nothing registered for B
    assert wa.name == "worker-0" and wa.identity == "worker-0"
    assert "denied Register by worker worker-1 (claimed worker-0): that worker is registered" in caplog.text
    assert "denied Register by worker worker-1 (claimed clients [0, 1])" in caplog.text
    assert tok0 not in caplog.text and tok1 not in caplog.text
    # B registers its own clients: its name is its identity, whatever label it sends (a worker's default name
    # is host-pid-cN); A reconnecting retires A's old registration
    for label in ("", "host-b-c2"):
        reg = b.Register(pb.RegisterRequest(worker_name=label, client_ids=[2, 3]), timeout=TIMEOUT)
        assert h.run.registry.workers[reg.worker_id].name == "worker-1"
    ch.close()
    a2 = FakeWorker(h.port, [0, 1], md5, name="worker-0", security=client(pki, tok0))
    assert h.run.registry.workers[a.wid].gone and h.run.registry.owner[0] == a2.wid


def test_calls_for_another_workers_registration_are_denied_and_change_nothing(
        pki: CertBundle, start: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Worker-1 calling Heartbeat/Ready/Work/FetchBlob/SubmitProbes/SubmitUpdate/ReportFailure with worker-0's
    worker_id, or submitting for worker-0's clients under its own id: PERMISSION_DENIED (not ``known: true``)
    and nothing recorded; then both workers' own calls still complete the run."""
    from conftest import FakeWorker, tiny_config, tiny_inputs

    from fedentrpc.v1 import aggregator_pb2 as pb

    inputs = tiny_inputs()
    md5 = str(inputs.partition_info["md5"])
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, security=tls_server(pki))
    tok0, tok1 = token_of(pki, "worker-0"), token_of(pki, "worker-1")
    a = FakeWorker(h.port, [0, 1], md5, name="worker-0", security=client(pki, tok0))
    b = FakeWorker(h.port, [2, 3], md5, name="worker-1", security=client(pki, tok1))
    fit_a, fit_b = a.next("fit"), b.next("fit")  # the fit phase is open: a forged result would count
    col = h.run.remote.collector
    assert col is not None and col.kind == "fit"
    wa = h.run.registry.workers[a.wid]
    seen, down = wa.last_seen, wa.bytes_down
    params = a.model(fit_a.task.model_blob)
    s = b.stub
    with caplog.at_level(logging.WARNING, logger="fedent.security"):
        assert _denied(lambda: s.Heartbeat(pb.HeartbeatRequest(worker_id=a.wid), timeout=TIMEOUT)) == PD
        assert _denied(lambda: s.Ready(pb.ReadyRequest(worker_id=a.wid, partition_md5=md5), timeout=TIMEOUT)) == PD
        assert _denied(lambda: next(s.Work(pb.WorkRequest(worker_id=a.wid), timeout=TIMEOUT))) == PD
        assert _denied(lambda: list(s.FetchBlob(pb.AggregatorServiceFetchBlobRequest(
            blob_id=fit_a.task.model_blob, worker_id=a.wid), timeout=TIMEOUT))) == PD
        for wid in (a.wid, b.wid):  # A's registration, or B's own with A's client
            assert _denied(lambda w=wid: s.SubmitUpdate(_update_parts(w, 0, params, fit_a.task.task_id),
                                                        timeout=TIMEOUT)) == PD
            assert _denied(lambda w=wid: s.SubmitProbes(pb.SubmitProbesRequest(
                worker_id=w, task_id=fit_a.task.task_id, probes=[pb.Probe(cid=0, num_samples=12)]),
                timeout=TIMEOUT)) == PD
            assert _denied(lambda w=wid: s.ReportFailure(pb.ReportFailureRequest(
                worker_id=w, task_id=fit_a.task.task_id, round=0, cid=0, message="forged"), timeout=TIMEOUT)) == PD
        assert _denied(lambda: s.ReportFailure(pb.ReportFailureRequest(
            worker_id=a.wid, task_id=fit_a.task.task_id, round=0, cid=-1, message="forged"), timeout=TIMEOUT)) == PD
    assert col.results == {} and col.failed == {}  # nothing recorded
    assert not wa.gone and wa.streaming and a.call.is_active() and wa.last_seen == seen
    assert wa.bytes_down == down and wa.bytes_up == 0
    for method in ("Heartbeat", "Ready", "Work", "FetchBlob", "SubmitUpdate", "SubmitProbes", "ReportFailure"):
        assert f"denied {method} by worker worker-1 (claimed {a.wid})" in caplog.text, method
    assert tok0 not in caplog.text and tok1 not in caplog.text
    # the rightful owners' calls still work (regression)
    assert a.stub.Heartbeat(pb.HeartbeatRequest(worker_id=a.wid), timeout=TIMEOUT).known
    for w, fit in ((a, fit_a), (b, fit_b)):
        for cid in fit.task.client_ids:
            w.upload(fit.task, cid, params)
    assert h.wait(30), "the run did not finish"
    assert h.run.error is None, h.run.error


def test_a_forged_upload_stream_cannot_take_over_or_drop_the_owners_kept_chunks(pki: CertBundle, start: Any) -> None:
    """Worker-1 (its own valid token) opening an upload stream for worker-0's client while worker-0's cut
    upload is held: PERMISSION_DENIED before the stream touches the held chunks; streams for its own client
    under another round or task: FAILED_PRECONDITION, the book untouched. Worker-0 resumes and its update is
    the one aggregated."""
    import torch
    from conftest import FakeWorker, tiny_config, tiny_inputs

    from fedent.model_file import load_model_file
    from fedent.params import weighted_sum
    from fedent.strategies.base import ClientUpdate
    from fedentrpc import codec, mappers
    from fedentrpc.v1 import aggregator_pb2 as pb

    inputs = tiny_inputs()
    md5 = str(inputs.partition_info["md5"])
    h = start(tiny_config("fedavg", rounds=1, fraction=1.0), inputs, security=tls_server(pki))
    a = FakeWorker(h.port, [0, 1], md5, name="worker-0", security=client(pki, token_of(pki, "worker-0")))
    b = FakeWorker(h.port, [2, 3], md5, name="worker-1", security=client(pki, token_of(pki, "worker-1")))
    fit_a, fit_b = a.next("fit").task, b.next("fit").task
    w = a.model(fit_a.model_blob)
    spec, meta = codec.TransferSpec(chunk_bytes=16), mappers.UpdateMeta(a.wid, fit_a.task_id, fit_a.round)
    mine = ClientUpdate(0, [p + 1 for p in w], 12, 0.1)
    with pytest.raises(grpc.RpcError) as e:
        a.stub.SubmitUpdate(iter(list(mappers.update_to_parts(mine, meta, spec))[:4]), timeout=TIMEOUT)
    assert e.value.code() == grpc.StatusCode.ABORTED  # cut after 3 chunks: held
    forged = ClientUpdate(0, [p + 50 for p in w], 12, 0.1)
    assert _denied(lambda: b.stub.SubmitUpdate(mappers.update_to_parts(forged, meta, spec), timeout=TIMEOUT)) == PD
    # its own client, under a header naming a far later round (which would drop every earlier round's kept
    # chunks) or other tasks (which would fill the book): refused before the book is touched
    own = ClientUpdate(2, w, 12, 0.1)
    for task, rnd in ((fit_b.task_id, 2**31 - 1), (fit_b.task_id + 1000, fit_b.round), (fit_a.task_id, fit_b.round)):
        bad_meta = mappers.UpdateMeta(b.wid, task, rnd)
        assert _denied(lambda m=bad_meta: b.stub.SubmitUpdate(iter(list(mappers.update_to_parts(own, m, spec))[:3]),
                                                              timeout=TIMEOUT)) == grpc.StatusCode.FAILED_PRECONDITION
    assert h.run.remote.uploads.latest_round == 0 and len(h.run.remote.uploads.partials) == 1
    query = pb.QueryUploadRequest(worker_id=a.wid, task_id=fit_a.task_id, round=fit_a.round, cid=0)
    state = a.stub.QueryUpload(query, timeout=TIMEOUT)
    assert (state.state, state.next_chunk) == (pb.UPLOAD_STATE_PARTIAL, 3)
    a.stub.SubmitUpdate(mappers.update_to_parts(mine, meta, spec, resume_from=3), timeout=TIMEOUT)
    a.upload(fit_a, 1, w)
    for cid in fit_b.client_ids:
        b.upload(fit_b, cid, w)
    assert h.wait(30) and h.run.error is None, h.run.error
    final = load_model_file(h.run_dir / "model_final.pt").params
    expect = weighted_sum([mine.params, w, w, w], [0.25] * 4)
    assert all(torch.allclose(x, y) for x, y in zip(final, expect, strict=True))


def test_mtls_certificate_identity_is_bound_too(pki: CertBundle, start: Any) -> None:
    """Under mutual TLS without tokens the certificate's name is the identity: worker-1's certificate can
    neither register as worker-0 nor heartbeat worker-0's registration."""
    from conftest import FakeWorker, tiny_config, tiny_inputs

    from fedentrpc.v1 import aggregator_pb2 as pb

    inputs = tiny_inputs()
    md5 = str(inputs.partition_info["md5"])
    h = start(tiny_config("fedavg"), inputs, security=tls_server(pki, mtls=True, tokens=False))
    a = FakeWorker(h.port, [0, 1], md5, name="worker-0", security=client(pki, cert_of="worker-0"))
    ch, b = _agg_stub(h.port, client(pki, cert_of="worker-1"))
    with ch:
        assert _denied(lambda: b.Register(pb.RegisterRequest(worker_name="worker-0", client_ids=[0, 1]),
                                          timeout=TIMEOUT)) == PD
        assert _denied(lambda: b.Heartbeat(pb.HeartbeatRequest(worker_id=a.wid), timeout=TIMEOUT)) == PD
        assert a.stub.Heartbeat(pb.HeartbeatRequest(worker_id=a.wid), timeout=TIMEOUT).known
    assert h.run.registry.workers[a.wid].identity == "worker-0" and a.call.is_active()


def test_without_authentication_there_is_no_identity_and_nothing_changes(start: Any) -> None:
    """Plaintext without tokens (local runs, in-process tests): no caller identity; any worker id is usable
    and a same-name re-registration replaces the old one, as before."""
    from conftest import FakeWorker, tiny_config, tiny_inputs

    from fedentrpc.security.interceptors import IdentifiedContext, caller_identity
    from fedentrpc.v1 import aggregator_pb2 as pb

    plain: Any = object()
    assert caller_identity(plain) is None and caller_identity(IdentifiedContext(plain, "w")) == "w"
    inputs = tiny_inputs()
    md5 = str(inputs.partition_info["md5"])
    h = start(tiny_config("fedavg"), inputs)
    a = FakeWorker(h.port, [0, 1], md5, name="worker-0")
    b = FakeWorker(h.port, [2, 3], md5, name="worker-1")
    assert h.run.registry.workers[a.wid].identity is None
    assert b.stub.Heartbeat(pb.HeartbeatRequest(worker_id=a.wid), timeout=TIMEOUT).known
    a2 = FakeWorker(h.port, [0, 1], md5, name="worker-0")
    assert h.run.registry.workers[a.wid].gone and h.run.registry.owner[0] == a2.wid
