"""What connections that never finish a TLS handshake leave behind in ``envelope serve``
(issue 38, class 2): RSS of a real server on 127.0.0.1 (self-signed, no cluster view,
a ballast of Deployment-shaped objects standing in for the live view) through rounds of
half-open connection storms — each round opens ``--connections`` TCP connections that
send nothing (beyond ``--max-connections`` they evict each other; the rest are closed by
the handshake timeout), waits for them all to go, and records RSS.

    .venv/bin/python bench/halfopen.py [--tree DIR] [--rounds 5] [--connections 4000]
        [--view 30000] [--trim on|off]

``--tree`` runs another checkout's ``app`` (the code before a change); ``--trim off``
sets ENVELOPE_MALLOC_TRIM=off (app/serve/httplimits.py ``Trimmer``). Prints one line per
round and the full collection's pause (``gc.collect()`` timed in the server, from its
log) when the server reports it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.serve.tls import write_self_signed  # noqa: E402

# A stand-in for the live view: ``n`` Deployment-shaped dicts kept for the process's
# life, allocated before the server starts (so the TLS objects land among them).
SERVE = """
import sys, runpy
n = int(sys.argv.pop(1))
ballast = [{"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"d{i}", "namespace": f"ns{i % 500}", "uid": str(i) * 4,
                         "labels": {"app": f"a{i}", "team": f"t{i % 50}"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x" * 600}},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "c", "image": f"registry/app{i}:1",
                 "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}}}} for i in range(n)]
sys.argv[0] = "envelope"
runpy.run_module("app", run_name="__main__", alter_sys=True)
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def start(tmp: Path, tree: Path, view: int, max_connections: int, timeout: float,
          trim: str) -> tuple[subprocess.Popen[bytes], int]:
    certs = write_self_signed(tmp / "certs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(view), "serve", "--host", "127.0.0.1", "--port", str(port),
         "--cert-file", str(certs.cert), "--key-file", str(certs.key), "--metrics-port", "0",
         "--cluster-view", "none", "--log-level", "warning",
         "--max-connections", str(max_connections), "--tls-handshake-timeout", str(timeout)],
        cwd=tree, stdout=log, stderr=log,
        env={**os.environ, "ENVELOPE_CONFIG": "", "ENVELOPE_MALLOC_TRIM": trim,
             "PYTHONPATH": str(tree)})
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError((tmp / "serve.log").read_text()) from None
            time.sleep(0.2)


def storm(port: int, count: int, handshake: bool = False) -> None:
    """``count`` connections that never send a byte (``handshake``: that finish a TLS
    handshake and then send nothing), held until the server closes them."""
    import ssl
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    socks: list[socket.socket] = []
    for _ in range(count):
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            socks.append(context.wrap_socket(raw) if handshake else raw)
        except OSError:
            time.sleep(0.01)
    deadline = time.monotonic() + 30
    for s in socks:  # wait for the server to close each (timeout or eviction)
        s.settimeout(max(0.01, deadline - time.monotonic()))
        with contextlib.suppress(OSError):
            s.recv(1)
        s.close()


def measure(tree: Path, rounds: int, connections: int, view: int, max_connections: int,
            timeout: float, trim: str, settle: float = 3.0, handshake: bool = False) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start(Path(tmp), tree, view, max_connections, timeout, trim)
        try:
            time.sleep(1)
            out = [rss_mib(proc.pid)]
            for _ in range(rounds):
                storm(port, connections, handshake)
                time.sleep(settle)
                out.append(rss_mib(proc.pid))
            return out
        finally:
            proc.terminate()
            proc.wait(15)
            pauses = [line for line in (Path(tmp) / "serve.log").read_text().splitlines()
                      if "pause" in line]
            if pauses:
                print(f"{len(pauses)} collections+trims; last: {pauses[-3:]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=4000)
    parser.add_argument("--view", type=int, default=30000)
    parser.add_argument("--max-connections", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--trim", default="on")
    parser.add_argument("--handshake", action="store_true",
                        help="connections finish the TLS handshake, then send nothing")
    args = parser.parse_args()
    rss = measure(args.tree, args.rounds, args.connections, args.view, args.max_connections,
                  args.timeout, args.trim, handshake=args.handshake)
    print(f"load {os.getloadavg()[0]:.2f}; view {args.view}; {args.connections} half-open "
          f"connections a round; RSS MiB: start {rss[0]:.0f}, after each round "
          f"{[round(r) for r in rss[1:]]}")


if __name__ == "__main__":
    main()
