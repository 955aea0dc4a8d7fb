"""Certificate reload under load: a real uvicorn server on 127.0.0.1, clients doing
full TLS handshakes in a loop, while the certificate files are rewritten in place
(certificate first, key a moment later: the window where the pair does not match)
and swapped atomically the way the kubelet updates a mounted Secret (a ``..data``
symlink renamed over). Every handshake must succeed; the old pair keeps serving
until a complete new pair is there."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from app.serve.tls import FileWatcher, KeyPair, TlsState, issue_serving, make_ca, peer_names

NAMES = ["localhost", "127.0.0.1"]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, state: TlsState) -> None:
        self.port = _free_port()
        config = uvicorn.Config(_app, host="127.0.0.1", port=self.port, log_config=None,
                                access_log=False, lifespan="off")
        config.load()
        config.ssl = state.context
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def _client_context(ca: KeyPair) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    return context


def _handshake(port: int, context: ssl.SSLContext) -> bytes:
    with (socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
          context.wrap_socket(raw, server_hostname="127.0.0.1") as tls):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


class _KubeletDir:
    """A directory laid out like a kubelet Secret volume: tls.crt -> ..data/tls.crt,
    ..data -> a timestamped directory, updated by renaming a new ..data symlink."""

    def __init__(self, root: Path, pair: KeyPair) -> None:
        self.root = root
        self.n = 0
        self.swap(pair)
        for name in ("tls.crt", "tls.key"):
            os.symlink(f"..data/{name}", root / name)

    def swap(self, pair: KeyPair) -> None:
        self.n += 1
        target = self.root / f"..{self.n}"
        target.mkdir()
        (target / "tls.crt").write_bytes(pair.cert_pem)
        (target / "tls.key").write_bytes(pair.key_pem)
        tmp = self.root / "..data_tmp"
        os.symlink(target.name, tmp)
        os.replace(tmp, self.root / "..data")


def _run(tmp_path: Path, seconds: float, in_place: bool) -> dict[str, int]:
    ca = make_ca()
    pairs = [issue_serving(ca, NAMES) for _ in range(4)]
    state = TlsState()
    files = _KubeletDir(tmp_path, pairs[0])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    if in_place:  # plain files, rewritten in place (cert first, then key)
        for path, data in ((cert, pairs[0].cert_pem), (key, pairs[0].key_pem)):
            path.unlink()
            path.write_bytes(data)
    assert state.load(pairs[0])
    watcher = FileWatcher(state, cert, key, interval=0.005)
    counts = {"ok": 0, "failed": 0, "served": 0, "writes": 0}
    stop = threading.Event()
    served: set[bytes] = set()

    def client() -> None:
        context = _client_context(ca)
        while not stop.is_set():
            try:
                served.add(_handshake(server.port, context))
                counts["ok"] += 1
            except (OSError, ssl.SSLError):
                counts["failed"] += 1

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            pair = pairs[i % len(pairs)]
            if in_place:
                cert.write_bytes(pair.cert_pem)  # new certificate, old key: no match
                time.sleep(0.15)
                key.write_bytes(pair.key_pem)
            else:
                files.swap(pair)
            counts["writes"] += 1
            time.sleep(0.15)

    with _Server(state) as server:
        watcher.start()
        threads = [threading.Thread(target=client) for _ in range(4)] + [
            threading.Thread(target=writer)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(10)
        watcher.stop()
    counts["served"] = len(served)
    counts["rejected"] = state.rejected
    return counts


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "atomic-swap"])
def test_reload_never_fails_a_handshake(tmp_path: Path, in_place: bool) -> None:
    counts = _run(tmp_path, 4.0, in_place)
    print(counts)
    assert counts["failed"] == 0, counts
    assert counts["ok"] > 50, counts
    assert counts["served"] >= 2, f"the new certificates were never served: {counts}"
    if in_place:
        assert counts["rejected"] > 0, f"the mismatched window was never seen: {counts}"


def test_a_mismatched_pair_leaves_the_old_context_serving(tmp_path: Path) -> None:
    ca = make_ca()
    good, other = issue_serving(ca, NAMES), issue_serving(ca, NAMES)
    state = TlsState()
    assert state.load(good)
    assert not state.load(KeyPair(other.cert_pem, good.key_pem))
    assert not state.load(KeyPair(b"not a certificate", good.key_pem))
    assert state.cert_pem == good.cert_pem and state.rejected == 2
    with _Server(state) as server:
        der = _handshake(server.port, _client_context(ca))
    from cryptography import x509
    served = x509.load_der_x509_certificate(der)
    assert served == x509.load_pem_x509_certificate(good.cert_pem)


def test_no_certificate_yet_refuses_handshakes_then_serves(tmp_path: Path) -> None:
    ca = make_ca()
    state = TlsState()
    with _Server(state) as server:
        with pytest.raises((ssl.SSLError, OSError)):
            _handshake(server.port, _client_context(ca))
        assert state.load(issue_serving(ca, NAMES))
        assert _handshake(server.port, _client_context(ca))


def test_peer_names_reads_cn_and_sans() -> None:
    cert = {"subject": ((("organizationName", "system:masters"),),
                        (("commonName", "kube-apiserver"),)),
            "subjectAltName": (("DNS", "apiserver.local"), ("IP Address", "10.0.0.1"))}
    assert peer_names(cert) == {"kube-apiserver", "apiserver.local", "10.0.0.1"}
