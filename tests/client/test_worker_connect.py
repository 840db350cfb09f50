"""A worker pointed at a wrong address (issue 27: 60 s of silence, then one message for every cause): each failed
attempt is logged with its reason, and the final error names the reason and --connect-timeout."""

from __future__ import annotations

import logging
import socket

import pytest

from client.settings import WorkerSettings
from client.worker import Worker, WorkerError, connect_reason


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
