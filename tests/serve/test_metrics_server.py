"""The metrics listener: answers /metrics, and closes what is slow, oversized or over
the connection cap, on a real socket on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from app.serve.metrics_server import MetricsServer


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("envelope_test_total", "a test counter", registry=registry).inc(3)
    srv = MetricsServer(registry, "127.0.0.1", 0, max_connections=4, read_timeout=0.5,
                        max_request=1024)
    srv.start()
    yield srv
    srv.stop()


def _connect(srv: MetricsServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=5)


def _get(srv: MetricsServer, request: bytes) -> bytes:
    with _connect(srv) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _closed_within(s: socket.socket, seconds: float) -> float:
    """Seconds until the server closes ``s`` (fails if it is still open after ``seconds``)."""
    started = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_serves_metrics_and_nothing_else(server: MetricsServer) -> None:
    answer = _get(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert b"envelope_test_total 3.0" in answer
    assert _get(server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404")
    assert _get(server, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405")


def test_a_stalled_request_is_closed_after_the_read_timeout(server: MetricsServer) -> None:
    with _connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
        assert _closed_within(s, 5) < 2
    assert server.timed_out >= 1


def test_an_oversized_head_is_closed(server: MetricsServer) -> None:
    with _connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 4096)
        assert _closed_within(s, 5) < 2


def test_a_full_listener_evicts_an_idle_connection_for_a_new_one(
        server: MetricsServer) -> None:
    """Four idle connections fill the four slots: a fifth is served, the oldest idle one
    is closed at once (not at its read timeout)."""
    held = [_connect(server) for _ in range(4)]
    try:
        time.sleep(0.1)
        answer = _get(server, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200")
        assert _closed_within(held[0], 5) < 0.4  # evicted, well before the 0.5 s timeout
        assert server.refused >= 1
    finally:
        for s in held:
            s.close()


def test_health_and_readiness_are_served_when_asked_for() -> None:
    """With mTLS the kubelet's probes come to the metrics port (no client certificate)."""
    import socket as socket_

    from prometheus_client import CollectorRegistry

    from app.serve.metrics_server import MetricsServer

    problems: list[str] = ["cluster view: Node not synced"]
    with socket_.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", port, ready=lambda: list(problems))
    server.start()
    try:
        def get(path: str) -> bytes:
            with socket_.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                return b"".join(iter(lambda: c.recv(4096), b""))

        assert get("/healthz").startswith(b"HTTP/1.1 200")
        answer = get("/readyz")
        assert answer.startswith(b"HTTP/1.1 503") and b"Node not synced" in answer
        problems.clear()
        assert get("/readyz").startswith(b"HTTP/1.1 200")
    finally:
        server.stop()
