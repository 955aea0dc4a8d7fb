"""What the HTTP layer's own bookkeeping costs a review: latency of ``POST /validate``
on a real ``envelope serve`` (127.0.0.1, self-signed, no cluster view), one client,
on a kept-alive connection and on a new connection (TLS handshake) per review.

    .venv/bin/python bench/http_layer.py [--tree DIR] [--requests N]

``--tree`` runs another checkout's ``app`` (e.g. a ``git worktree`` of the code before
a change) so the two are measured the same way. Prints p50/p99 in ms.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.serve.tls import write_self_signed

REVIEW = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1",'
          b'"kind":{"group":"","version":"v1","kind":"ConfigMap"},"operation":"CREATE",'
          b'"namespace":"a","object":{"apiVersion":"v1","kind":"ConfigMap",'
          b'"metadata":{"name":"x"}}}}')
REQUEST = (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + str(len(REVIEW)).encode() + b"\r\n\r\n" + REVIEW)


def _answer(s: ssl.SSLSocket) -> None:
    got = b""
    while b"\r\n\r\n" not in got:
        got += s.recv(65536)
    head, _, rest = got.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += s.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    certs = write_self_signed(tmp / "certs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--cert-file", str(certs.cert), "--key-file", str(certs.key), "--metrics-port", "0",
         "--cluster-view", "none", "--log-level", "warning"], cwd=args.tree,
        stdout=subprocess.DEVNULL, stderr=(tmp / "serve.log").open("wb"))
    context = ssl.create_default_context(cafile=str(certs.ca))

    def connect() -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        return context.wrap_socket(raw, server_hostname="127.0.0.1")

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                connect().close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        kept: list[float] = []
        with connect() as s:
            for _ in range(args.requests):
                started = time.perf_counter()
                s.sendall(REQUEST)
                _answer(s)
                kept.append(time.perf_counter() - started)
        fresh: list[float] = []
        for _ in range(args.requests // 10):
            started = time.perf_counter()
            with connect() as s:
                s.sendall(REQUEST)
                _answer(s)
            fresh.append(time.perf_counter() - started)
    finally:
        proc.terminate()
        proc.wait(10)

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000

    print(f"{args.tree}: keep-alive p50 {pct(kept, 50):.3f} ms p99 {pct(kept, 99):.3f} ms "
          f"({len(kept)}); new connection p50 {pct(fresh, 50):.3f} ms p99 {pct(fresh, 99):.3f} ms "
          f"({len(fresh)})")


if __name__ == "__main__":
    main()
