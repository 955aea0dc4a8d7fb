"""HTTP abuse limits on the real ``envelope serve`` (HTTPS on 127.0.0.1): stalled heads
and bodies are closed within their timeouts, an endless header is refused with 431
after the limit and RSS stays flat, bodies beyond the in-flight budget get 503 at
once, and ordinary reviews are untouched."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.tls import write_self_signed

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 1.0
HEAD = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
REVIEW = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1",'
          b'"kind":{"group":"","version":"v1","kind":"ConfigMap"},"operation":"CREATE",'
          b'"namespace":"a","object":{"apiVersion":"v1","kind":"ConfigMap",'
          b'"metadata":{"name":"x"}}}}')


@dataclass
class Serve:
    proc: subprocess.Popen[bytes]
    port: int
    context: ssl.SSLContext

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def connect(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        return self.context.wrap_socket(raw, server_hostname="127.0.0.1")


def start_serve(tmp: Path, tree: Path = ROOT, extra: tuple[str, ...] = ()) -> Serve:
    certs = write_self_signed(tmp / "certs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--cert-file", str(certs.cert), "--key-file", str(certs.key), "--metrics-port", "0",
         "--cluster-view", "none", "--log-level", "warning", *extra],
        cwd=tree, stdout=log, stderr=log, env={**os.environ, "ENVELOPE_CONFIG": ""})
    serve = Serve(proc, port, ssl.create_default_context(cafile=str(certs.ca)))
    deadline = time.monotonic() + 30
    while True:
        try:
            with serve.connect():
                return serve
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError((tmp / "serve.log").read_text()) from None
            time.sleep(0.1)


def closed_after(sock: ssl.SSLSocket, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closes ``sock`` (``limit`` if it never does) and what it sent."""
    started = time.monotonic()
    sock.settimeout(limit)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return limit, got
    except (ConnectionResetError, ssl.SSLError, OSError):
        pass
    return time.monotonic() - started, got


def review(serve: Serve) -> bytes:
    with serve.connect() as s:
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(REVIEW)).encode() + b"\r\nConnection: close\r\n\r\n"
                  + REVIEW)
        return closed_after(s, 10)[1]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    srv = start_serve(tmp_path_factory.mktemp("limits"), extra=(
        "--header-timeout", str(TIMEOUT), "--body-timeout", str(TIMEOUT),
        "--max-inflight-body-bytes", str(4 * 1024 * 1024)))
    yield srv
    srv.proc.terminate()
    srv.proc.wait(10)


def test_a_review_still_works(serve: Serve) -> None:
    assert review(serve).startswith(b"HTTP/1.1 200")


def test_a_silent_connection_is_closed_after_the_header_timeout(serve: Serve) -> None:
    with serve.connect() as s:
        waited, got = closed_after(s, 10)
    assert waited < TIMEOUT + 1.5 and got.startswith(b"HTTP/1.1 408"), (waited, got)


def test_a_stalled_head_is_closed_after_the_header_timeout(serve: Serve) -> None:
    with serve.connect() as s:
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Le")
        waited, got = closed_after(s, 10)
    assert waited < TIMEOUT + 1.5 and got.startswith(b"HTTP/1.1 408"), (waited, got)


def test_a_stalled_body_is_closed_after_the_body_timeout(serve: Serve) -> None:
    before = serve.rss_mib()
    socks = []
    for _ in range(8):
        s = serve.connect()
        s.sendall(HEAD + b"400000\r\n\r\n"
                  + b"{" * 300_000)
        socks.append(s)
    waits = [closed_after(s, 10)[0] for s in socks]
    for s in socks:
        s.close()
    print(f"stalled bodies closed after {max(waits):.2f}s; RSS {before:.0f} -> "
          f"{serve.rss_mib():.0f} MiB")
    assert max(waits) < TIMEOUT + 1.5, waits


def test_bodies_beyond_the_inflight_budget_get_503_at_once(serve: Serve) -> None:
    held = serve.connect()  # reserves 3 MiB of the 4 MiB budget, then stalls
    held.sendall(HEAD + b"3000000\r\n\r\n{")
    time.sleep(0.2)
    with serve.connect() as s:
        s.sendall(HEAD + b"2000000\r\n\r\n{")
        waited, got = closed_after(s, 10)
    held.close()
    assert got.startswith(b"HTTP/1.1 503") and waited < TIMEOUT, (waited, got[:100])
    time.sleep(TIMEOUT + 0.5)  # the stalled one is gone and has given its budget back
    assert review(serve).startswith(b"HTTP/1.1 200")


def test_an_endless_header_gets_431_and_rss_stays_flat(serve: Serve) -> None:
    before = serve.rss_mib()
    sent, cut = 0, False
    with serve.connect() as s:
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * (1024 * 1024)
        try:
            while sent < 200 * 1024 * 1024:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            cut = True
        _, got = closed_after(s, 10)
    after = serve.rss_mib()
    print(f"endless header: refused after {sent / 2**20:.0f} MiB sent; RSS {before:.0f} -> "
          f"{after:.0f} MiB")
    # Refused: answered 431 (and dropped what followed) or cut while we were sending.
    assert got.startswith(b"HTTP/1.1 431") or (cut and got == b""), (cut, got[:100])
    assert after - before < 20, (before, after)
