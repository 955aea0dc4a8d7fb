"""An `envelope serve` process for the tests that talk to it over HTTPS, and a review to send it."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.serve.tls import write_self_signed

ROOT = Path(__file__).resolve().parent.parent.parent


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


def start_serve(tmp: Path, tree: Path = ROOT, extra: tuple[str, ...] = (),
                preexec_fn: Callable[[], None] | None = None) -> Serve:
    certs = write_self_signed(tmp / "certs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--cert-file", str(certs.cert), "--key-file", str(certs.key), "--metrics-port", "0",
         "--cluster-view", "none", "--log-level", "warning", *extra],
        cwd=tree, stdout=log, stderr=log, env={**os.environ, "ENVELOPE_CONFIG": ""},
        preexec_fn=preexec_fn)
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
