"""Certificates for the control plane and the webhook (``cryptography``): a CA, serving
and client certificates, and the control plane's PKI."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signing for every certificate; certificate and CRL signing for a CA only."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA that can issue leaf certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, common_name: str) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert=cert, key=key)

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        sans: Iterable[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """Issue a leaf certificate; ``sans`` are IP addresses or DNS names."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = []
        for san in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key

    def write(self, path: Path) -> Path:
        return _write(path, _cert_pem(self.cert))


def write_cert_and_key(
    cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    cert_path: Path,
    key_path: Path,
) -> tuple[Path, Path]:
    _write(cert_path, _cert_pem(cert))
    _write(key_path, _key_pem(key), 0o600)
    return cert_path, key_path


def make_serving_cert(
    tmpdir: Path | str,
    sans: Iterable[str] = ("127.0.0.1", "localhost"),
    *,
    name: str = "serving",
) -> tuple[Path, Path, Path]:
    """Make a fresh CA and a TLS serving certificate signed by it.

    Returns ``(ca_pem_path, cert_path, key_path)`` in ``tmpdir``: the files
    ``<name>-ca.crt``, ``<name>.crt`` and ``<name>.key`` (PEM, PKCS#8 key).
    The certificate carries every entry of ``sans`` as a SAN (IP or DNS name),
    and the first one as its common name.
    """
    sans = list(sans)
    if not sans:
        raise ValueError("a serving certificate needs at least one SAN")
    directory = Path(tmpdir)
    ca = CertificateAuthority.create(f"envelope-e2e-{name}-ca")
    cert, key = ca.issue(sans[0], sans=sans, server=True)
    ca_path = ca.write(directory / f"{name}-ca.crt")
    cert_path, key_path = write_cert_and_key(cert, key, directory / f"{name}.crt", directory / f"{name}.key")
    return ca_path, cert_path, key_path


@dataclass(frozen=True)
class ControlPlanePKI:
    """All certificates and keys the control plane needs, as file paths."""

    serving_ca: Path
    serving_cert: Path
    serving_key: Path
    client_ca: Path
    admin_cert: Path
    admin_key: Path
    sa_private_key: Path
    sa_public_key: Path


def make_control_plane_pki(directory: Path) -> ControlPlanePKI:
    """API server serving cert (SANs 127.0.0.1/localhost), client CA, an admin
    client cert in ``system:masters`` and the service-account RSA key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    serving_ca, serving_cert, serving_key = make_serving_cert(
        directory,
        # 10.0.0.1 is the "kubernetes" Service IP in --service-cluster-ip-range.
        ("127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default.svc"),
        name="apiserver",
    )
    client_ca = CertificateAuthority.create("envelope-e2e-client-ca")
    admin, admin_key = client_ca.issue("envelope-e2e-admin", organizations=["system:masters"], client=True)
    admin_cert_path, admin_key_path = write_cert_and_key(
        admin, admin_key, directory / "admin.crt", directory / "admin.key"
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_private = _write(directory / "sa.key", _key_pem(sa_key), 0o600)
    sa_public = _write(
        directory / "sa.pub",
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return ControlPlanePKI(
        serving_ca=serving_ca,
        serving_cert=serving_cert,
        serving_key=serving_key,
        client_ca=client_ca.write(directory / "client-ca.crt"),
        admin_cert=admin_cert_path,
        admin_key=admin_key_path,
        sa_private_key=sa_private,
        sa_public_key=sa_public,
    )


