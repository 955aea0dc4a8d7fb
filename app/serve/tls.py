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
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertPaths", "FileWatcher", "KeyPair", "TlsState", "client_ca_problem",
           "issue_serving", "make_ca", "not_after", "peer_names", "reusable_self_signed",
           "save_self_signed", "self_signed_paths", "write_self_signed"]

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
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"the CA key is a {type(ca_key).__name__}; Envelope signs with an EC or "
                         "RSA CA key (SHA-256)")
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
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def not_after(cert_pem: bytes) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


SELF_SIGNED_NAMES = ["localhost", "127.0.0.1", "::1"]


def write_self_signed(directory: Path, names: list[str] | None = None,
                      days: int = 365) -> CertPaths:
    """Make a CA and a serving certificate signed by it, with SANs for ``names``
    (default localhost, 127.0.0.1, ::1), and write them (:func:`save_self_signed`)."""
    names = names or SELF_SIGNED_NAMES
    ca = make_ca(days=days)
    return save_self_signed(directory, ca, issue_serving(ca, names, days))


def self_signed_paths(directory: Path) -> CertPaths:
    return CertPaths(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")


def save_self_signed(directory: Path, ca: KeyPair, serving: KeyPair) -> CertPaths:
    """Write ca.crt, tls.crt and tls.key (mode 0600) into ``directory``, all or none:
    each goes to a temporary file next to it, flushed to disk, and only when all three
    are written are they renamed over the old ones. A failed write (a full disk, a
    read-only directory) leaves the files that were there intact and raises an
    OSError whose ``filename`` is the path that could not be written."""
    paths = self_signed_paths(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        for target, data, mode in ((paths.ca, ca.cert_pem, 0o644),
                                   (paths.cert, serving.cert_pem, 0o644),
                                   (paths.key, serving.key_pem, 0o600)):
            temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
                staged.append((temporary, target))
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(target)) from exc
        for temporary, target in staged:
            try:
                os.replace(temporary, target)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(target)) from exc
        staged = []
    finally:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
    return paths


def reusable_self_signed(directory: Path, names: list[str] | None = None,
                         min_left: dt.timedelta = dt.timedelta(days=7)) -> CertPaths | str:
    """The pair already in ``directory`` if it can serve as it is (both files and the
    CA readable, the certificate signed by that CA, its key matching, SANs covering
    ``names``, more than ``min_left`` before it expires), else why not. Reusing it
    keeps the CA a client was given across restarts."""
    paths = self_signed_paths(directory)
    try:
        ca_pem, cert_pem, key_pem = (p.read_bytes() for p in (paths.ca, paths.cert, paths.key))
    except OSError as exc:
        return f"cannot read {exc.filename}: {exc.strerror}"
    try:
        ca_cert = x509.load_pem_x509_certificate(ca_pem)
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(ca_cert)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if key.public_key().public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo) != \
                cert.public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo):
            return f"{paths.key} does not match {paths.cert}"
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception as exc:  # unparsable, not signed by the CA, no SANs: make a new pair
        return f"unusable pair in {directory}: {type(exc).__name__}: {str(exc)[:200]}"
    have = {str(v) for v in sans.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    missing = [n for n in (names or SELF_SIGNED_NAMES) if str(_normal(n)) not in have]
    if missing:
        return f"{paths.cert} lacks the names {', '.join(missing)}"
    left = min(cert.not_valid_after_utc, ca_cert.not_valid_after_utc) - _now()
    if left < min_left:
        return f"{paths.cert} expires in {left} (less than {min_left})"
    return paths


def _normal(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


class TlsState:
    """The serving certificate in use, reloadable without a restart.

    The server is handed :attr:`context` once; it is never reloaded. Its SNI callback
    (OpenSSL calls it for every ClientHello, with or without a server name) points each
    new handshake at the *current* context. A new pair is loaded into a fresh context
    — both read from one snapshot, the key checked against the certificate — and only a
    context that loaded completely is swapped in. A bad pair (a certificate rewritten
    in place with the old key, a swap that landed between two reads) is refused and the
    previous context keeps serving, untouched. (Loading into the live context, as before,
    left it holding the new certificate next to the old key when the key check failed.)

    With ``client_ca`` every context requires a client certificate that chains to it
    (mTLS); :meth:`peer_allowed` then checks the certificate's names.
    """

    def __init__(self, on_load: Callable[[dt.datetime], None] | None = None,
                 client_ca: bytes | None = None,
                 client_names: frozenset[str] | None = None) -> None:
        self._client_ca = client_ca
        self.client_names = client_names or frozenset()
        self._current: ssl.SSLContext | None = None
        self.context = self._base()
        self.context.sni_callback = self._select
        self.cert_pem: bytes | None = None
        self.key_pem: bytes | None = None
        self.expires: dt.datetime | None = None
        self.rejected = 0
        self._on_load = on_load
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="envelope-tls-"))
        os.chmod(self._dir, 0o700)

    def _base(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self._client_ca is not None:
            context.load_verify_locations(cadata=self._client_ca.decode())
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _select(self, ssl_obj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                context: ssl.SSLContext) -> None:
        current = self._current
        if current is not None:
            ssl_obj.context = current

    def build(self, pair: KeyPair) -> ssl.SSLContext:
        """A fresh server context holding ``pair``; raises if the pair is unusable."""
        context = self._base()
        fd, name = tempfile.mkstemp(dir=self._dir, suffix=".pem")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(pair.cert_pem.rstrip(b"\n") + b"\n" + pair.key_pem)
            # OpenSSL reads the chain, then the key, and checks the key matches the
            # certificate: a mismatch raises here, on a context nobody serves from.
            context.load_cert_chain(name)
        finally:
            os.unlink(name)
        return context

    def load(self, pair: KeyPair) -> bool:
        """Use ``pair`` for every new handshake; returns False (the context in use
        untouched) if it is unusable."""
        if pair.cert_pem == self.cert_pem and pair.key_pem == self.key_pem:
            return True
        try:
            expires = not_after(pair.cert_pem)
            context = self.build(pair)
        except (ssl.SSLError, ValueError, OSError) as exc:
            self.rejected += 1
            log.error("certificate rejected; keeping the one in use",
                      extra={"fields": {"error": str(exc)[:300]}})
            return False
        with self._lock:
            self._current = context
            self.cert_pem, self.key_pem, self.expires = pair.cert_pem, pair.key_pem, expires
        log.info("serving certificate loaded",
                 extra={"fields": {"notAfter": expires.isoformat()}})
        if self._on_load:
            self._on_load(expires)
        return True

    def peer_allowed(self, peercert: dict[str, Any] | None) -> bool:
        """With an allow-list, whether a verified client certificate (as
        ``SSLObject.getpeercert()`` gives it) names one of ``client_names`` in its
        subject CN or a DNS/URI SAN. Without an allow-list every verified peer passes."""
        if not self.client_names:
            return True
        if not peercert:
            return False
        return bool(peer_names(peercert) & self.client_names)

    def problems(self) -> list[str]:
        if self.cert_pem is None:
            return ["no serving certificate loaded"]
        if self.expires is not None and self.expires <= _now():
            return [f"serving certificate expired at {self.expires.isoformat()}"]
        return []


def client_ca_problem(pem: bytes) -> str | None:
    """Why ``pem`` cannot serve as the client CA bundle (None when it can): it must
    hold at least one PEM certificate that OpenSSL loads as a CA."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        return f"not a PEM certificate bundle ({exc})"
    for cert in certs:
        try:
            constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            continue  # a v1 root without extensions: OpenSSL accepts it as a trust anchor
        if not constraints.ca:
            return (f"{cert.subject.rfc4514_string()} is not a CA certificate "
                    f"(basicConstraints CA:FALSE); give the CA that signs the client certificates")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=pem.decode())
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        return f"OpenSSL cannot load it ({exc})"
    return None


def peer_names(peercert: dict[str, Any]) -> set[str]:
    """Subject common names and DNS/URI/IP SANs of a decoded peer certificate."""
    names: set[str] = set()
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(value)
    for kind, value in peercert.get("subjectAltName", ()):
        if kind in ("DNS", "URI", "IP Address"):
            names.add(value)
    return names


class FileWatcher:
    """Reload cert/key files when they change (cert-manager and user Secrets are
    mounted files that the kubelet swaps in place)."""

    def __init__(self, state: TlsState, cert_file: Path, key_file: Path,
                 interval: float = 10.0) -> None:
        self.state, self.cert_file, self.key_file = state, cert_file, key_file
        self.interval = interval
        self._seen: tuple[bytes, bytes] | None = None
        self._refused: tuple[bytes, bytes] | None = None
        self._stop = threading.Event()

    def snapshot(self) -> tuple[bytes, bytes] | None:
        """Cert and key as one consistent pair: read both, then read both again and
        accept only if nothing changed in between (a kubelet ``..data`` swap or an
        in-place write that lands between the reads shows up as a difference; the
        next check reads again). None when the files cannot be read or are moving."""
        try:
            first = (self.cert_file.read_bytes(), self.key_file.read_bytes())
            second = (self.cert_file.read_bytes(), self.key_file.read_bytes())
        except OSError as exc:
            log.error("cannot read certificate files", extra={"fields": {"error": str(exc)}})
            return None
        return first if first == second else None

    def check(self) -> None:
        pair = self.snapshot()
        if pair is None or pair == self._seen or pair == self._refused:
            return  # unreadable or mid-write: look again next time; refused: said so once
        if self.state.load(KeyPair(*pair)):
            self._seen, self._refused = pair, None
        else:
            self._refused = pair

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.check()

        threading.Thread(target=loop, daemon=True, name="tls-files").start()

    def stop(self) -> None:
        self._stop.set()
