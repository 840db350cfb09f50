"""``fedent certs``: a development CA, server/client certificates with the right names, 0600 secrets."""

from __future__ import annotations

import ipaddress
import json
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedent.cli import main as fedent_main
from server.certs import CertsError, make_dev_pki, revoke_workers


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_pki_names_signatures_and_permissions(tmp_path: Path) -> None:
    b = make_dev_pki(tmp_path, hosts=["localhost", "127.0.0.1", "aggregator"], workers=["w-a", "w-b"], days=3)
    ca = _load(b.ca_cert)
    srv = _load(b.server_cert)
    srv.verify_directly_issued_by(ca)
    san = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "aggregator"}
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert ExtendedKeyUsageOID.SERVER_AUTH in srv.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    life = srv.not_valid_after_utc - srv.not_valid_before_utc
    assert 3 * 86400 <= life.total_seconds() <= 3 * 86400 + 600
    for w in ("w-a", "w-b"):
        crt, key = b.client_certs[w]
        cert = _load(crt)
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == w
        assert ExtendedKeyUsageOID.CLIENT_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert _mode(key) == 0o600
    for secret in (b.ca_key, b.server_key, b.tokens_file, *b.token_files.values()):
        assert _mode(secret) == 0o600, secret
    assert _mode(b.ca_cert) == 0o644
    tokens = json.loads(b.tokens_file.read_text())
    assert tokens["revoked"] == [] and set(tokens["workers"]) == {"w-a", "w-b"}
    assert len(set(tokens["workers"].values())) == 2 and all(len(t) >= 40 for t in tokens["workers"].values())
    for w, p in b.token_files.items():
        assert p.read_text().strip() == tokens["workers"][w]


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    first = make_dev_pki(tmp_path, workers=["w"])
    old = first.ca_cert.read_bytes()
    with pytest.raises(CertsError, match="--force"):
        make_dev_pki(tmp_path, workers=["w"])
    make_dev_pki(tmp_path, workers=["w"], force=True)
    assert first.ca_cert.read_bytes() != old


@pytest.mark.parametrize("kwargs, match", [
    ({"workers": ["bad id"]}, "bad worker id"),
    ({"workers": ["a", "a"]}, "twice"),
    ({"hosts": [" "]}, "at least one host"),
    ({"days": 0}, "--days"),
])
def test_bad_requests(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(CertsError, match=match):
        make_dev_pki(tmp_path, **kwargs)


def test_revoke_appends_once(tmp_path: Path) -> None:
    b = make_dev_pki(tmp_path, workers=["w0", "w1"])
    assert b.tokens_file is not None
    assert revoke_workers(b.tokens_file, ["w1"]) == ["w1"]
    assert revoke_workers(b.tokens_file, ["w1", "w0"]) == ["w1", "w0"]
    assert _mode(b.tokens_file) == 0o600
    assert set(json.loads(b.tokens_file.read_text())["workers"]) == {"w0", "w1"}


def test_cli_prints_paths_never_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pki"
    rc = fedent_main(["certs", "--out", str(out), "--hosts", "localhost,10.0.0.5", "--workers", "worker-0,worker-1"])
    assert rc == 0
    printed = capsys.readouterr()
    tokens = json.loads((out / "tokens.json").read_text())["workers"]
    assert str(out / "ca.crt") in printed.out and "worker-1" in printed.out
    for tok in tokens.values():
        assert tok not in printed.out and tok not in printed.err
    assert "BEGIN" not in printed.out  # no key or certificate material either

    assert fedent_main(["certs", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and err.count("\n") == 1

    assert fedent_main(["certs", "--out", str(out), "--revoke", "worker-1"]) == 0
    assert json.loads((out / "tokens.json").read_text())["revoked"] == ["worker-1"]
    assert fedent_main(["certs", "--out", str(tmp_path / "none"), "--revoke", "worker-1"]) == 2
    assert "cannot read tokens file" in capsys.readouterr().err
