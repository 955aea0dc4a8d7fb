"""Caller authentication (mTLS), on a real uvicorn server on 127.0.0.1 with the
reloadable TLS state and the guarded protocol: a client without a certificate, or
with one from another CA, fails the handshake; one from the right CA but with a name
not on the allow-list is cut right after it; the allowed name is served — also after
the serving certificate is reloaded."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.serve.httplimits import Limits, guarded_protocol
from app.serve.tls import KeyPair, TlsState, issue_serving, make_ca

NAMES = ["localhost", "127.0.0.1"]


def client_pair(ca: KeyPair, cn: str, dns: str | None = None) -> KeyPair:
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                              critical=False))
    if dns:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]),
                                        critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM),
                   key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class Env:
    def __init__(self, tmp: Any) -> None:
        self.tmp = tmp
        self.server_ca = make_ca("serving-ca")
        self.client_ca = make_ca("client-ca")
        self.state = TlsState(client_ca=self.client_ca.cert_pem,
                              client_names=frozenset({"kube-apiserver"}))
        assert self.state.load(issue_serving(self.server_ca, NAMES))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.protocol = guarded_protocol(Limits(), self.state.peer_allowed)
        config = uvicorn.Config(_app, host="127.0.0.1", port=self.port, log_config=None,
                                access_log=False, lifespan="off", http=self.protocol)
        config.load()
        config.ssl = self.state.context
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def get(self, pair: KeyPair | None) -> bytes:
        context = ssl.create_default_context(cadata=self.server_ca.cert_pem.decode())
        if pair is not None:
            cert, key = self.tmp / "c.crt", self.tmp / "c.key"
            cert.write_bytes(pair.cert_pem)
            key.write_bytes(pair.key_pem)
            context.load_cert_chain(cert, key)
        with (socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
              context.wrap_socket(raw, server_hostname="127.0.0.1") as tls):
            tls.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := tls.recv(4096):
                data += chunk
            return data


    def refused(self, pair: KeyPair | None) -> bool:
        try:
            return self.get(pair) == b""
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            return True


@pytest.fixture
def env(tmp_path: Any) -> Iterator[Env]:
    e = Env(tmp_path)
    e.thread.start()
    deadline = time.monotonic() + 10
    while not e.server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    yield e
    e.server.should_exit = True
    e.thread.join(10)


def test_only_the_allowed_name_from_the_client_ca_is_served(env: Env) -> None:
    allowed = client_pair(env.client_ca, "kube-apiserver")
    assert env.get(allowed).startswith(b"HTTP/1.1 200")
    # By SAN as well as by CN.
    by_san = client_pair(env.client_ca, "something-else", dns="kube-apiserver")
    assert env.get(by_san).startswith(b"HTTP/1.1 200")

    # No certificate, or one from another CA: refused in the TLS handshake (with TLS
    # 1.3 the client learns it on its first read: the connection ends unanswered).
    assert env.refused(None)
    assert env.refused(client_pair(make_ca("other-ca"), "kube-apiserver"))
    assert env.protocol.state.counts["peer_refused"] == 0  # never reached HTTP
    # The client CA's certificate for another name: cut right after the handshake.
    assert env.refused(client_pair(env.client_ca, "mallory"))
    assert env.protocol.state.counts["peer_refused"] == 1

    # A reloaded serving certificate keeps requiring client certificates.
    assert env.state.load(issue_serving(env.server_ca, NAMES))
    assert env.get(allowed).startswith(b"HTTP/1.1 200")
    assert env.refused(None)
