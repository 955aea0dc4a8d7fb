"""Certificates: CAs and serving certificates (cryptography), and the server's TLS
state — TLS 1.2 or newer only, reloadable without a restart."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertPaths", "FileWatcher", "KeyPair", "TlsState", "issue_serving", "make_ca",
           "not_after", "write_self_signed"]

log = logging.getLogger("envelope.tls")


@dataclass(frozen=True)
class CertPaths:
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(common_name: str = "envelope-ca", days: int = 3650) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                       critical=True)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def issue_serving(ca: KeyPair, names: list[str], days: int = 365) -> KeyPair:
    """A serving certificate with SANs for every name/IP (a CN-only cert is refused)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[0])).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(_san(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def not_after(cert_pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def write_self_signed(directory: Path, names: list[str] | None = None,
                      days: int = 365) -> CertPaths:
    """Make a CA and a serving certificate signed by it, with SANs for ``names``
    (default localhost, 127.0.0.1, ::1). Keys are written with mode 0600."""
    names = names or ["localhost", "127.0.0.1", "::1"]
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(days=days)
    serving = issue_serving(ca, names, days)
    paths = CertPaths(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    paths.ca.write_bytes(ca.cert_pem)
    paths.cert.write_bytes(serving.cert_pem)
    paths.key.touch(mode=0o600)
    paths.key.write_bytes(serving.key_pem)
    return paths


class TlsState:
    """The serving certificate in use. Loading a new one swaps it for every new
    handshake of the running server: no restart, no dropped requests."""

    def __init__(self, on_load: Callable[[dt.datetime], None] | None = None) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.cert_pem: bytes | None = None
        self.expires: dt.datetime | None = None
        self._on_load = on_load
        self._dir = Path(tempfile.mkdtemp(prefix="envelope-tls-"))
        os.chmod(self._dir, 0o700)

    def load(self, pair: KeyPair) -> bool:
        """Use ``pair`` from now on; returns False (keeping the old one) if it is unusable."""
        if pair.cert_pem == self.cert_pem:
            return True
        cert, key = self._dir / "tls.crt", self._dir / "tls.key"
        key.touch(mode=0o600)
        key.write_bytes(pair.key_pem)
        cert.write_bytes(pair.cert_pem)
        try:
            self.context.load_cert_chain(str(cert), str(key))
        except (ssl.SSLError, ValueError) as exc:
            log.error("certificate rejected; keeping the one in use",
                      extra={"fields": {"error": str(exc)}})
            return False
        self.cert_pem = pair.cert_pem
        self.expires = not_after(pair.cert_pem)
        log.info("serving certificate loaded",
                 extra={"fields": {"notAfter": self.expires.isoformat()}})
        if self._on_load:
            self._on_load(self.expires)
        return True

    def problems(self) -> list[str]:
        if self.cert_pem is None:
            return ["no serving certificate loaded"]
        if self.expires is not None and self.expires <= _now():
            return [f"serving certificate expired at {self.expires.isoformat()}"]
        return []


class FileWatcher:
    """Reload cert/key files when they change (cert-manager and user Secrets are
    mounted files that the kubelet swaps in place)."""

    def __init__(self, state: TlsState, cert_file: Path, key_file: Path,
                 interval: float = 10.0) -> None:
        self.state, self.cert_file, self.key_file = state, cert_file, key_file
        self.interval = interval
        self._seen: tuple[bytes, bytes] | None = None
        self._stop = threading.Event()

    def check(self) -> None:
        try:
            pair = (self.cert_file.read_bytes(), self.key_file.read_bytes())
        except OSError as exc:
            log.error("cannot read certificate files", extra={"fields": {"error": str(exc)}})
            return
        if pair != self._seen and self.state.load(KeyPair(*pair)):
            self._seen = pair

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.check()

        threading.Thread(target=loop, daemon=True, name="tls-files").start()

    def stop(self) -> None:
        self._stop.set()
