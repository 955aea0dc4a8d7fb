"""Probes do not depend on a slot an unauthenticated peer can hold (issue 25, class 3).

A real ``envelope serve`` on 127.0.0.1 with ``--max-connections 32`` and its metrics
listener (64 slots). An attacker thread keeps 96 idle TCP connections open to the
metrics port, and 48 to the HTTPS port that never send a ClientHello plus 48 that
finish TLS and send nothing, re-opening each one the server closes. Meanwhile the
kubelet's probes (``/healthz`` and ``/readyz`` on both ports, as the chart points them
with and without ``clientAuth``) and a review must all answer, each within 2 s: the
chart's probe ``timeoutSeconds``. Before, 40 idle connections filled the metrics
listener's 32 slots (the probe was closed unanswered) and 32 idle TLS connections
made uvicorn answer every request on the HTTPS port 503."""

from __future__ import annotations

import select
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.serve import REVIEW, Serve, closed_after, start_serve

PROBE_TIMEOUT = 2.0
"""The chart's probes' timeoutSeconds (values.yaml probes.*.timeoutSeconds)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Attacker:
    """Keeps ``count`` connections of each kind open, re-opening those closed."""

    def __init__(self, serve: Serve, metrics_port: int, count: int, source: str) -> None:
        self.serve, self.metrics_port, self.count = serve, metrics_port, count
        self.source = (source, 0)
        self.stop = threading.Event()
        self.opened = 0
        self.pools: dict[str, list[socket.socket]] = {"metrics": [], "pre-tls": [], "tls": []}

    def _open(self, kind: str) -> socket.socket | None:
        try:
            if kind == "metrics":
                return socket.create_connection(("127.0.0.1", self.metrics_port), timeout=2,
                                                source_address=self.source)
            raw = socket.create_connection(("127.0.0.1", self.serve.port), timeout=2,
                                           source_address=self.source)
            if kind == "pre-tls":
                return raw
            return self.serve.context.wrap_socket(raw, server_hostname="127.0.0.1")
        except OSError:
            return None

    @staticmethod
    def _alive(s: socket.socket) -> bool:
        """Idle, the server never writes: readable means closed (or a 408 on its way)."""
        try:
            return not select.select([s], [], [], 0)[0]
        except (OSError, ValueError):
            return False

    def run(self) -> None:
        while not self.stop.is_set():
            for kind, pool in self.pools.items():
                pool[:] = [s for s in pool if self._alive(s) or s.close()]
                while len(pool) < self.count and not self.stop.is_set():
                    s = self._open(kind)
                    if s is None:
                        break
                    pool.append(s)
                    self.opened += 1
            time.sleep(0.05)
        for pool in self.pools.values():
            for s in pool:
                s.close()


def _get_plain(port: int, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return b"".join(iter(lambda: s.recv(4096), b""))


def _get_tls(serve: Serve, path: str) -> bytes:
    with serve.connect() as s:
        s.settimeout(PROBE_TIMEOUT)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return closed_after(s, PROBE_TIMEOUT)[1]


def _review(serve: Serve) -> bytes:
    with serve.connect() as s:
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(REVIEW)).encode() + b"\r\nConnection: close\r\n\r\n"
                  + REVIEW)
        return closed_after(s, PROBE_TIMEOUT)[1]


@pytest.mark.parametrize("source", ["127.0.0.1", "127.0.0.2"],
                         ids=["attacker-on-the-probes-address", "attacker-on-its-own-address"])
def test_probes_answer_in_time_while_idle_connections_fill_both_listeners(
        tmp_path: Path, source: str) -> None:
    """From the probes' own address the attacker's connections go first because they
    are older and silent; from an address of its own (as a pod's), because that address
    holds the most slots."""
    metrics_port = _free_port()
    serve = start_serve(tmp_path, extra=("--metrics-port", str(metrics_port),
                                         "--max-connections", "32"))
    attacker = Attacker(serve, metrics_port, 48, source)
    thread = threading.Thread(target=attacker.run, daemon=True)
    try:
        thread.start()
        time.sleep(1.0)  # both listeners full of idle connections
        checks = {
            "metrics /healthz": lambda: _get_plain(metrics_port, "/healthz"),
            "metrics /readyz": lambda: _get_plain(metrics_port, "/readyz"),
            "https /healthz": lambda: _get_tls(serve, "/healthz"),
            "https /readyz": lambda: _get_tls(serve, "/readyz"),
            "review": lambda: _review(serve),
        }
        slowest: dict[str, float] = {}
        failures: list[str] = []
        deadline = time.monotonic() + 4.0
        rounds = 0
        while time.monotonic() < deadline:
            rounds += 1
            for name, check in checks.items():
                started = time.monotonic()
                try:
                    answer = check()
                except OSError as exc:
                    answer = repr(exc).encode()
                took = time.monotonic() - started
                slowest[name] = max(slowest.get(name, 0.0), took)
                if not answer.startswith(b"HTTP/1.1 200") or took > PROBE_TIMEOUT:
                    failures.append(f"{name}: {answer[:400]!r} after {took:.2f}s")
            time.sleep(0.2)
        print(f"{rounds} rounds, attacker opened {attacker.opened} connections; slowest "
              + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in slowest.items()))
        assert attacker.opened >= 3 * 48, attacker.opened  # the listeners really were full
        assert not failures, failures[:10]
    finally:
        attacker.stop.set()
        thread.join(10)
        serve.proc.terminate()
        serve.proc.wait(10)
