"""A development PKI for a local or docker cluster: one CA, a server certificate, one client certificate
per worker (for mutual TLS) and per-worker bearer tokens.

Production deployments bring their own certificates; this exists so that ``fedent cluster up`` is secured
by default without any manual setup. Keys are ECDSA P-256 (fast to make, supported by gRPC). Private keys
and token files are written 0600.

Layout of ``out_dir``::

    ca.crt ca.key                 the development CA (keep ca.key private; only ca.crt is distributed)
    server.crt server.key         SANs: every --hosts entry (DNS names and IP addresses)
    clients/<worker>.crt|.key     CN = SAN = worker id, extended key usage clientAuth
    tokens.json                   {"workers": {id: token}, "revoked": []} — read by the servers
    tokens/<worker>.token         one worker's token alone, for distributing to that worker
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedent.runlog import atomic_write_bytes

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "aggregator", "estimator")
DEFAULT_WORKERS = ("worker-0", "worker-1")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class CertsError(ValueError):
    """Bad certificate request (one-line message)."""


@dataclass(frozen=True)
class CertBundle:
    """Paths of everything :func:`make_dev_pki` wrote (no secrets in here)."""

    out_dir: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_certs: dict[str, tuple[Path, Path]] = field(default_factory=dict)  # worker -> (crt, key)
    tokens_file: Path | None = None
    token_files: dict[str, Path] = field(default_factory=dict)

    def files(self) -> list[Path]:
        out = [self.ca_cert, self.ca_key, self.server_cert, self.server_key]
        for crt, key in self.client_certs.values():
            out += [crt, key]
        if self.tokens_file is not None:
            out.append(self.tokens_file)
        out += list(self.token_files.values())
        return out


def validate_identity(name: str, what: str = "worker id") -> str:
    if not _ID.match(name):
        raise CertsError(f"bad {what} {name!r}: use letters, digits, '.', '_' or '-' (max 63 characters)")
    return name


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _san(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedent development"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             now: dt.datetime, days: int) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate small clock skew between containers
            .not_valid_after(now + dt.timedelta(days=days)))


def make_ca(now: dt.datetime, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_key()
    name = _name("fedent development CA")
    cert = (_builder(name, name, key.public_key(), now, days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str, sans: Sequence[str],
              client: bool, now: dt.datetime, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server (serverAuth) or client (clientAuth) certificate signed by the CA."""
    key = _new_key()
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    cert = (_builder(_name(cn), ca_cert.subject, key.public_key(), now, days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(_san(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def _write(path: Path, data: bytes, private: bool) -> Path:
    atomic_write_bytes(path, data, mode=0o600 if private else 0o644)  # private from the first byte
    return path


def new_token() -> str:
    """256 random bits, URL-safe (fits an HTTP/gRPC header unchanged)."""
    return secrets.token_urlsafe(32)


def write_tokens(out_dir: Path, workers: Sequence[str]) -> tuple[Path, dict[str, Path]]:
    tokens = {w: new_token() for w in workers}
    tokens_file = _write(out_dir / "tokens.json",
                         (json.dumps({"workers": tokens, "revoked": []}, indent=1) + "\n").encode(), True)
    (out_dir / "tokens").mkdir(exist_ok=True)
    per_worker = {w: _write(out_dir / "tokens" / f"{w}.token", (t + "\n").encode(), True) for w, t in tokens.items()}
    return tokens_file, per_worker


def make_dev_pki(out_dir: str | Path, hosts: Sequence[str] = DEFAULT_HOSTS,
                 workers: Sequence[str] = DEFAULT_WORKERS, days: int = 30, force: bool = False,
                 now: dt.datetime | None = None) -> CertBundle:
    """Create the CA, server and client certificates and the tokens under ``out_dir`` (see module doc)."""
    if days < 1:
        raise CertsError(f"--days must be >= 1, got {days}")
    hosts = [h.strip() for h in hosts if h.strip()]
    if not hosts:
        raise CertsError("--hosts needs at least one host name or address")
    workers = [validate_identity(w.strip()) for w in workers if w.strip()]
    if len(set(workers)) != len(workers):
        raise CertsError("--workers lists a worker twice")
    out = Path(out_dir)
    if (out / "ca.key").exists() and not force:
        raise CertsError(f"{out} already holds a CA; pass --force to replace it (old tokens stop working)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "clients").mkdir(exist_ok=True)
    now = now or dt.datetime.now(dt.timezone.utc)

    ca_key, ca_cert = make_ca(now, days)
    srv_key, srv_cert = make_leaf(ca_key, ca_cert, hosts[0], hosts, client=False, now=now, days=days)
    bundle_clients: dict[str, tuple[Path, Path]] = {}
    for w in workers:
        k, c = make_leaf(ca_key, ca_cert, w, [w], client=True, now=now, days=days)
        bundle_clients[w] = (_write(out / "clients" / f"{w}.crt", _cert_pem(c), False),
                             _write(out / "clients" / f"{w}.key", _key_pem(k), True))
    tokens_file, token_files = write_tokens(out, workers)
    return CertBundle(
        out_dir=out,
        ca_cert=_write(out / "ca.crt", _cert_pem(ca_cert), False),
        ca_key=_write(out / "ca.key", _key_pem(ca_key), True),
        server_cert=_write(out / "server.crt", _cert_pem(srv_cert), False),
        server_key=_write(out / "server.key", _key_pem(srv_key), True),
        client_certs=bundle_clients,
        tokens_file=tokens_file,
        token_files=token_files,
    )


def add_dev_workers(out_dir: str | Path, workers: Sequence[str], days: int = 30,
                    now: dt.datetime | None = None) -> list[str]:
    """Issue certificates and tokens for ``workers`` that ``out_dir``'s existing CA does not cover yet.

    Why: a resumed ``fedent cluster up`` with more ``--workers`` used to regenerate the whole PKI, CA
    included, so every certificate and token handed out for the run stopped working. The CA, the server
    certificate and the existing identities are kept; returns the identities added.
    """
    out = Path(out_dir)
    try:
        ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
        data = json.loads((out / "tokens.json").read_text())
    except (OSError, ValueError) as e:
        raise CertsError(f"cannot extend the PKI in {out}: {type(e).__name__}: {e}") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or not isinstance(data.get("workers"), dict):
        raise CertsError(f"cannot extend the PKI in {out}: not a development CA and tokens file")
    now = now or dt.datetime.now(dt.timezone.utc)
    added = []
    for w in (validate_identity(w) for w in workers):
        crt, key = out / "clients" / f"{w}.crt", out / "clients" / f"{w}.key"
        if not (crt.is_file() and key.is_file()):
            k, c = make_leaf(ca_key, ca_cert, w, [w], client=True, now=now, days=days)
            _write(key, _key_pem(k), True)
            _write(crt, _cert_pem(c), False)
        token_file = out / "tokens" / f"{w}.token"
        if w not in data["workers"] or not token_file.is_file():
            token = new_token()
            data["workers"][w] = token
            (out / "tokens").mkdir(exist_ok=True)
            _write(token_file, (token + "\n").encode(), True)
            added.append(w)
    if added:
        _write(out / "tokens.json", (json.dumps(data, indent=1) + "\n").encode(), True)
    return added


def revoke_workers(tokens_file: str | Path, workers: Sequence[str]) -> list[str]:
    """Add workers to the revocation list of a tokens file (running servers reload it); returns the list."""
    path = Path(tokens_file)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CertsError(f"cannot read tokens file {path}: {e.__class__.__name__}") from None
    if not isinstance(data, dict) or not isinstance(data.get("workers"), dict):
        raise CertsError(f"{path} is not a tokens file (no 'workers' mapping)")
    revoked = list(data.get("revoked") or [])
    for w in workers:
        validate_identity(w)
        if w not in revoked:
            revoked.append(w)
    data["revoked"] = revoked
    _write(path, (json.dumps(data, indent=1) + "\n").encode(), True)
    return revoked
