"""``/metrics`` (and, for the kubelet, ``/healthz`` and ``/readyz``) over plain HTTP,
from a small asyncio server that no client can stall.

prometheus_client's ``start_http_server`` runs a thread per connection with no read
timeout and no cap: 2,000 half-open ``GET /metrics`` connections stalled the webhook
port for seconds. Here one event loop on one thread serves every metrics connection:
at most ``max_connections`` at once (:class:`app.serve.httplimits.Slots`; a newcomer
evicts an idle one from the peer holding the most, so a probe or a scrape is never kept
out), the request head within ``read_timeout`` and ``max_request`` bytes, the answer
taken within ``write_timeout``, one ``GET``/``HEAD`` per connection. The limits and
their defaults: docs/security.md, "The metrics listener".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from app.serve.httplimits import BUSY, Slots, peer_address, socket_fd

__all__ = ["MetricsServer"]

log = logging.getLogger("envelope.metrics")


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, host: str, port: int, *,
                 max_connections: int = 64, read_timeout: float = 2.0,
                 write_timeout: float = 10.0, max_request: int = 8192,
                 ready: Callable[[], list[str]] | None = None,
                 serving: Callable[[], str] | None = None) -> None:
        self.registry = registry
        self.ready = ready
        """With it, ``/healthz`` and ``/readyz`` are served here too: the kubelet presents
        no client certificate, so with mTLS on the HTTPS port its probes come here."""
        self.serving = serving
        """Which policy serves, said in ``/readyz``'s body as on the HTTPS port."""
        self.host, self.port = host, port
        self.max_connections = max_connections
        self.slots = Slots(max_connections)
        self.read_timeout, self.write_timeout = read_timeout, write_timeout
        self.max_request = max_request
        self.timed_out = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """Listen on a thread of its own; returns once bound (raises if it cannot bind)."""
        threading.Thread(target=self._run, daemon=True, name="metrics").start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(asyncio.start_server(
                self._handle, self.host, self.port, limit=self.max_request,
                family=socket.AF_UNSPEC, backlog=128))
            sockets = self._server.sockets or ()
            if sockets and self.port == 0:
                self.port = sockets[0].getsockname()[1]
        except BaseException as exc:  # bind failure: report it to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        log.info("metrics listening", extra={"fields": {"host": self.host, "port": self.port}})
        try:
            loop.run_forever()
        finally:
            # Connections still waiting for their head: end their handlers on a live
            # loop (closed with it, they would close their writers on a dead one).
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        def close() -> None:
            server.close()
            loop.stop()

        loop.call_soon_threadsafe(close)

    # -- one connection -----------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self.slots)

    @property
    def refused(self) -> int:
        """Connections closed for want of a slot: evicted ones and refused newcomers."""
        return self.slots.evicted + self.slots.refused

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.slots.admit(writer, peer_address(writer.transport), writer.transport.abort,
                                socket_fd(writer.transport)):
            writer.transport.abort()
            return
        try:
            await self._serve(reader, writer)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            pass  # slow, oversized, malformed, evicted or gone: closed below
        finally:
            self.slots.release(writer)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout)
        except TimeoutError:
            self.timed_out += 1
            raise
        self.slots.mark(writer, BUSY)
        line = head.split(b"\r\n", 1)[0].split()
        method, target = (line[0], line[1]) if len(line) == 3 else (b"", b"")
        if method not in (b"GET", b"HEAD"):
            status, body, ctype = b"405 Method Not Allowed", b"use GET\n", b"text/plain"
        elif self.ready is not None and target.split(b"?", 1)[0] in (b"/healthz", b"/readyz"):
            failing = self.ready() if target.startswith(b"/readyz") else []
            status = b"503 Service Unavailable" if failing else b"200 OK"
            which = f" ({self.serving()})" if self.serving is not None and \
                target.startswith(b"/readyz") else ""
            body = ((("not ready: " + "; ".join(failing)) if failing else "ok") + which).encode()
            ctype = b"text/plain"
        elif target.split(b"?", 1)[0] != b"/metrics":
            status, body, ctype = b"404 Not Found", b"metrics are at /metrics\n", b"text/plain"
        else:
            status, body, ctype = b"200 OK", generate_latest(self.registry), \
                CONTENT_TYPE_LATEST.encode()
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype
                     + b"\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\nConnection: close\r\n\r\n" + (b"" if method == b"HEAD" else body))
        try:
            await asyncio.wait_for(writer.drain(), self.write_timeout)
        except TimeoutError:
            self.timed_out += 1
            raise
        with contextlib.suppress(OSError):
            writer.write_eof()
