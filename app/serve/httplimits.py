"""Abuse limits at the HTTP layer: what uvicorn's httptools protocol does not bound.

uvicorn (httptools) has no limit on the size of a request head, no timeout for a head
or a body that stops arriving, no bound on the bodies held by requests in flight, and
it counts a connection only once its TLS handshake is done. This module is a subclass
of uvicorn's ``HttpToolsProtocol`` (and, with :func:`uvicorn_options` ``tls=``, the
TLS layer under it) that adds, per connection: connection slots taken before the TLS
handshake, with eviction of connections that never completed a request (:class:`Slots`);
a head size and a head timeout; a body size, time and rate; and an in-flight body budget
shared by all connections. uvicorn's own settings cover the rest (idle keep-alive, a cap
on tasks, the listen backlog), and :func:`uvicorn_options` raises the soft open-file limit.

Each limit, its flag, its default, what a client gets past it (and why a silent
handshaken connection is idle, not timed out): docs/security.md, "Limits"; the eviction
order and why probes stay safe follow that table.

Why one module of ~850 lines: every limit is a state of the same per-connection
protocol object (the slot, the head and body counters, the timers share its callbacks);
split, each part would reach into the others' state.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import resource
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
else:
    _Base = object  # uvicorn is imported when a server is made, not by ``envelope check``

__all__ = [
    "MAX_BODY",
    "LimitState",
    "Limits",
    "Slots",
    "add_arguments",
    "guarded_protocol",
    "limits_from_args",
    "raise_open_file_limit",
    "uvicorn_options",
]

log = logging.getLogger("envelope.limits")

MIB = 1024 * 1024
API_SERVER_MAX_REQUEST_BODY = 3 * MIB
"""kube-apiserver's default ``MaxRequestBodyBytes`` (k8s.io/apiserver
pkg/server/config.go, ``3 * 1024 * 1024``): the largest body a *client* may send. It
does not bound the review: the API server sends the object re-encoded, not as sent."""
ETCD_MAX_REQUEST_BYTES = 3 * MIB // 2
"""etcd's default ``--max-request-bytes`` (1.5 MiB): the largest object the API server
can store (protobuf for built-in kinds, JSON for custom resources)."""
JSON_ESCAPE_FACTOR = 6
"""The most one stored byte can become in the review's JSON: Go's encoder writes ``<``,
``>``, ``&`` and control characters as ``\\u00XX`` (one byte in protobuf, or as the
client sent it, six in the review). Field names make JSON ~2-3x protobuf, less than that."""
REVIEW_ENVELOPE = MIB
"""The review around the objects: uid, kind, resource, userInfo (groups, extra), options."""
MAX_BODY = 2 * JSON_ESCAPE_FACTOR * ETCD_MAX_REQUEST_BYTES + REVIEW_ENVELOPE
"""Default largest review body, 19 MiB: an UPDATE carries ``object`` and ``oldObject``,
each at most etcd's 1.5 MiB stored, re-encoded at most 6x, plus the envelope. Every
review of an object the API server can store fits. ``--max-body-bytes`` changes it."""

ABORT_GRACE = 0.25
"""Seconds a refused connection has to take its answer before it is cut."""
RATE_WINDOW = 1.0
"""Seconds between two checks of a body's receive rate."""
RATE_RECHECK = 0.1
"""Seconds to the second look at a body found too slow (see ``_rate_check``)."""
RESERVED_FDS = 160
"""Descriptors kept out of the connection slots: the metrics listener's 64, the cluster
view's watches, the certificate and log files, uvicorn's own."""


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    idle_timeout: float = 120.0
    """Longer than the API server keeps an idle webhook connection (client-go's
    transport: 90 s): closing first races its reuse, and a request sent on a connection
    we just closed fails with EOF — refused under failurePolicy Fail (2 of ~600 creates
    at concurrency 20 in the peers benchmark with 5 s)."""
    max_connections: int = 1000
    max_inflight_body_bytes: int = 32 * 1024 * 1024
    backlog: int = 2048
    max_body_bytes: int = MAX_BODY
    min_body_rate: int = 32 * 1024
    """Bytes a second a body must keep arriving at once ``body_rate_grace`` has passed
    (0: no check). The API server sends at network speed: 32 KiB/s is ~256 kbit/s."""
    body_rate_grace: float = 2.0
    handshake_timeout: float = 5.0
    """Seconds for a TLS handshake (asyncio's default is 60 s, uncounted)."""


SILENT, STARTED, IDLE, BUSY = 0, 1, 2, 3
"""Slot states, in the order they are evicted: nothing received (since the accept, or
since the TLS handshake finished), a handshake or first head arriving, between requests
on a kept-alive connection (the API server's reuse: evicting it risks its EOF race),
and a request in progress (never evicted)."""


@dataclass
class _Slot:
    peer: str
    close: Callable[[], None]
    state: int = SILENT
    fd: int = -1
    """The connection's socket, to see whether bytes wait in the kernel (-1: unknown)."""


EVICTIONS_PER_COLLECT = 256
"""An evicted TLS connection's protocol objects used to sit in reference cycles (the HTTP
protocol and its parser, the protocol and the TLS layer) that survived into Python's
oldest generation; under connection churn that garbage took a replica past the chart's
limit, and a full collection every 256 evictions held it (docs/reliability.md) — at
0.24-0.37 s a collection with the 30k-object view (issue 38). The TLS layer now breaks
those cycles when a connection goes (``_tls_layer`` ``connection_lost``,
``GuardedHttpTools.connection_lost``): reference counting frees every object of a
closed connection at once (none found by a full collection after 1,500 half-open or
idle handshaken connections, bench/halfopen.py). What is left after this many
evictions is a young-generation collection (generation 1: about a millisecond, whatever
the view's size)."""


class Slots:
    """The connections of one listener, each holding a slot until it is closed.

    :meth:`admit` takes a slot for a new connection; when none is free it evicts a
    connection that holds its slot without a request in progress — the first state in
    ``SILENT, STARTED, IDLE`` that has one — from the peer address holding the most
    slots, its oldest first. Only when every slot carries a request in progress is the
    newcomer refused.
    One event loop uses an instance: no lock."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._slots: dict[object, _Slot] = {}  # insertion order: oldest first
        self._per_peer: dict[str, int] = {}
        self.evicted = 0
        self.refused = 0
        self._evicted_at_collect = 0

    def __len__(self) -> int:
        return len(self._slots)

    def admit(self, key: object, peer: str, close: Callable[[], None], fd: int = -1) -> bool:
        if len(self._slots) >= self.cap:
            victim = self._victim()
            while victim is not None and self._slots[victim].state == SILENT \
                    and _bytes_waiting(self._slots[victim].fd):
                # Its first bytes (a ClientHello, a request head) have arrived and wait
                # for the loop to read them: it is not silent, only not read yet. A probe
                # connecting amid a storm of silent connects from its own address was
                # evicted in that instant (a flaky tests/serve/test_httplimits_probes.py).
                self._slots[victim].state = STARTED
                victim = self._victim()
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            slot = self._slots[victim]
            self.release(victim)
            slot.close()
            self._collect()
        self._slots[key] = _Slot(peer, close, fd=fd)
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        return True

    def _collect(self) -> None:
        """A young-generation collection after every EVICTIONS_PER_COLLECT evictions."""
        if self.evicted - self._evicted_at_collect >= EVICTIONS_PER_COLLECT:
            self._evicted_at_collect = self.evicted
            gc.collect(1)

    def mark(self, key: object, state: int) -> None:
        slot = self._slots.get(key)
        if slot is not None:
            slot.state = state

    def started(self, key: object) -> None:
        """Bytes arrived: ``SILENT`` becomes ``STARTED`` (other states stay)."""
        slot = self._slots.get(key)
        if slot is not None and slot.state == SILENT:
            slot.state = STARTED

    def release(self, key: object) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None:
            left = self._per_peer[slot.peer] - 1
            if left:
                self._per_peer[slot.peer] = left
            else:
                del self._per_peer[slot.peer]

    def _victim(self) -> object | None:
        best: object | None = None
        rank = (BUSY, 0)
        for key, slot in self._slots.items():  # oldest first: ties keep the oldest
            if slot.state == BUSY:
                continue
            mine = (slot.state, -self._per_peer[slot.peer])
            if best is None or mine < rank:
                best, rank = key, mine
        return best


def _bytes_waiting(fd: int) -> bool:
    """Whether the socket ``fd`` has bytes received but not yet read (a peek on a
    duplicate of it: the loop's own socket object is not touched)."""
    if fd < 0:
        return False
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing waiting (EAGAIN), or the socket is gone
        return False


def socket_fd(transport: Any) -> int:
    """The file descriptor under ``transport`` (-1 when it has none)."""
    sock = transport.get_extra_info("socket")
    try:
        return int(sock.fileno()) if sock is not None else -1
    except (OSError, ValueError, AttributeError):
        return -1


def peer_address(transport: Any) -> str:
    name = transport.get_extra_info("peername")
    return str(name[0]) if isinstance(name, tuple) and name else "?"


def _libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, unless ``ENVELOPE_MALLOC_TRIM=off`` or the C library has
    none (musl, macOS): then nothing is trimmed."""
    if os.environ.get("ENVELOPE_MALLOC_TRIM", "on").lower() in ("off", "0", "false", "no"):
        return None
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


TRIM_INTERVAL = 1.0
"""Seconds between two ``malloc_trim(0)`` calls at most (and after the last closed
connection before one runs)."""


class Trimmer:
    """Gives the C allocator's free memory back to the system after connections close.

    Each accepted connection gets its TLS objects at once (an ``SSL`` object, its two
    memory BIOs, uvloop's buffers: some 40 KB, mostly in OpenSSL's ``malloc``). When it
    goes without a handshake they are freed, but glibc keeps the freed chunks inside its
    heaps, among the live view's objects, and RSS never comes back: three 40 s storms of
    half-open connections took a replica with the 30k view from 186 to 547 MiB (issue
    38). ``malloc_trim(0)`` returns the free pages of every arena (``madvise``); it runs
    ``TRIM_INTERVAL`` seconds after a connection closes, at most once per interval, so a
    storm costs one trim a second and ordinary traffic (the API server keeps its
    connections) almost none. Numbers: docs/reliability.md "Half-open connections"."""

    def __init__(self, trim: Callable[[int], int] | None = None,
                 interval: float = TRIM_INTERVAL) -> None:
        self.trim = trim
        self.interval = interval
        self.runs = 0
        self._pending = False

    def note(self, loop: asyncio.AbstractEventLoop) -> None:
        """A connection closed: trim within ``interval``."""
        if self.trim is None or self._pending:
            return
        self._pending = True
        loop.call_later(self.interval, self._run)

    def _run(self) -> None:
        self._pending = False
        if self.trim is not None:
            self.trim(0)
            self.runs += 1


@dataclass
class LimitState:
    """Shared by every connection of one server (one event loop: no lock needed)."""

    limits: Limits
    inflight_body_bytes: int = 0
    slots: Slots = field(init=False)
    trimmer: Trimmer = field(default_factory=lambda: Trimmer(_libc_malloc_trim()))
    counts: dict[str, int] = field(default_factory=lambda: {
        "header_too_large": 0, "header_timeout": 0, "idle_timeout": 0, "body_timeout": 0,
        "body_too_slow": 0, "body_too_large": 0, "body_budget": 0, "peer_refused": 0})

    def __post_init__(self) -> None:
        self.slots = Slots(self.limits.max_connections)


def _response(status: bytes, body: bytes = b"") -> bytes:
    kind = b"application/json" if body else b"text/plain; charset=utf-8"
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + kind + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


def _error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def _answer(status: int, body: bytes) -> Callable[..., Any]:
    """A one-answer ASGI app (``Connection: close``), run in the app's place."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
    return app


HEAD, BODY, STREAM = 0, 1, 2
"""What the next bytes of a connection are: a request head, a body of known length
(``_body_left`` bytes), or a chunked body whose end only the parser knows."""


class GuardedHttpTools(_Base):
    """The limits above, mixed into uvicorn's ``HttpToolsProtocol`` by
    :func:`guarded_protocol`, which also sets ``state``."""

    state: LimitState
    peer_check: Callable[[dict[str, Any] | None], bool] | None = None
    """With mTLS: whether the client certificate's names are allowed (TlsState.peer_allowed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slot_key: object = self
        """The TLS layer under us when it holds the slot (:func:`uvicorn_options` tls=)."""
        self._framing = HEAD
        self._head_bytes = 0
        self._tail = b""
        self._body_left = 0
        self._slice_starts_head = True
        self._head_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._rate_timer: asyncio.TimerHandle | None = None
        self._received = 0
        self._window_bytes = 0
        self._window_start = 0.0
        self._rate_strike = False
        self._held = 0
        self._pending: bytes | None = None
        self._silent = True
        self._discard = False
        self._cut_after_answer = False
        self._lost = False

    # -- connection ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._slot_key is self and not self.state.slots.admit(
                self, peer_address(transport), transport.abort, socket_fd(transport)):
            transport.abort()
            return
        check = self.peer_check
        if check is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            peer = ssl_object.getpeercert() if ssl_object is not None else None
            if not check(peer):  # a verified certificate, but not a name we serve
                self.state.counts["peer_refused"] += 1
                transport.abort()
                return
        if self._slot_key is not self:  # the handshake is done: now a request must come
            self.state.slots.mark(self._slot_key, SILENT)
        # Idle until its first byte, like a kept-alive connection (module docstring).
        self._idle_timer = self.loop.call_later(self.state.limits.idle_timeout, self._idle_close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._cancel_timers()
        self._release()
        if self._slot_key is self:
            self.state.slots.release(self)
        super().connection_lost(exc)
        self._slot_key = None  # the TLS layer refers to this protocol: no cycle left

    def data_received(self, data: bytes) -> None:
        """Feed the parser one head, then exactly one body, at a time, so every head —
        the second of a pipelined pair too — is counted from its first byte."""
        limit = self.state.limits.max_header_bytes
        if self._silent:
            self._silent = False
            self.state.slots.started(self._slot_key)
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            self._arm_head_timer()  # the head is due header_timeout after its first byte
        while data and self._pending is None:
            self._slice_starts_head = self._framing == HEAD
            if self._framing == HEAD:
                window = self._tail + data
                end = window.find(b"\r\n\r\n")
                used = end + 4 - len(self._tail) if end >= 0 else len(data)
                if self._head_bytes + used > limit:
                    self._head_too_large()
                    return
                self._head_bytes += used
                self._tail = b"" if end >= 0 else window[-3:]
            elif self._framing == BODY:
                used = min(len(data), self._body_left)
                self._body_left -= used
            else:
                used = len(data)
            piece, data = (data, b"") if used >= len(data) else (data[:used], data[used:])
            super().data_received(piece)
            if self._lost or self.transport.is_closing():
                return

    # -- parser callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._slice_starts_head:
            # A request that starts inside a chunked body's bytes: its head was not
            # counted. Pipelining after a chunked body: refused (400, closed).
            raise ValueError("pipelined request after a chunked body")
        super().on_message_begin()
        self._discard = False
        # uvicorn types each scope extension as a dict (the ASGI spec's shape); this one is
        # Envelope's own, read by its app, and an int
        self.scope["extensions"] = {"envelope.max_body_bytes": self.state.limits.max_body_bytes}  # type: ignore[dict-item]
        if self._head_timer is None:  # the next request on a kept-alive connection
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self.state.slots.mark(self._slot_key, BUSY)
        limits = self.state.limits
        declared, chunked = self._declared()
        self._framing = STREAM if chunked else BODY if declared else HEAD
        self._body_left = declared or 0
        self._received = 0
        if declared is not None and declared > limits.max_body_bytes:
            self.state.counts["body_too_large"] += 1
            self._answer_instead(413, _error_body(
                f"body of {declared} bytes exceeds the {limits.max_body_bytes}-byte limit "
                f"(envelope serve --max-body-bytes)"))
            return
        if (declared or chunked) and self.state.inflight_body_bytes >= limits.max_inflight_body_bytes:
            self.state.counts["body_budget"] += 1
            self._answer_instead(503, _error_body(
                f"{self.state.inflight_body_bytes} bytes of request bodies are being read, "
                f"the --max-inflight-body-bytes budget is {limits.max_inflight_body_bytes}"))
            return
        if declared or chunked:
            self._body_timer = self.loop.call_later(limits.body_timeout, self._body_timeout)
            if limits.min_body_rate > 0:
                self._window_bytes, self._rate_strike = 0, False
                self._window_start = self.loop.time()
                self._rate_timer = self.loop.call_later(limits.body_rate_grace, self._rate_check)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if self._discard or cycle is None or cycle.response_complete or cycle.disconnected:
            return  # answered already (401, 413, 503): the rest is dropped uncounted
        size = len(body)
        self._received += size
        self._window_bytes += size
        limits, state = self.state.limits, self.state
        if self._received > limits.max_body_bytes:
            state.counts["body_too_large"] += 1
            self._fail(b"413 Content Too Large", _error_body(
                f"body exceeds the {limits.max_body_bytes}-byte limit "
                f"(envelope serve --max-body-bytes)"))
            return
        if state.inflight_body_bytes + size > limits.max_inflight_body_bytes:
            state.counts["body_budget"] += 1
            self._fail(b"503 Service Unavailable", _error_body(
                f"the --max-inflight-body-bytes budget ({limits.max_inflight_body_bytes} "
                f"bytes of request bodies being read at once) is spent"))
            return
        self._held += size
        state.inflight_body_bytes += size
        super().on_body(body)

    def on_message_complete(self) -> None:
        for timer in (self._body_timer, self._rate_timer):
            if timer is not None:
                timer.cancel()
        self._body_timer = self._rate_timer = None
        self._framing, self._head_bytes, self._tail = HEAD, 0, b""
        super().on_message_complete()

    def on_response_complete(self) -> None:
        done = self.cycle is None or self.cycle.response_complete
        if done:  # everything parsed so far is answered (pipelined ones too)
            self._release()
            self.state.slots.mark(self._slot_key, IDLE)
            if self._cut_after_answer:
                self.loop.call_later(ABORT_GRACE, self._abort)
        super().on_response_complete()
        if done and self._pending is not None and not self.pipeline:
            self._refuse(self._pending)

    # -- helpers ----------------------------------------------------------------------

    def _declared(self) -> tuple[int | None, bool]:
        length, chunked = None, False
        for name, value in self.headers or ():
            if name == b"content-length" and value.isdigit():
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = True
        return length, chunked

    def _answer_instead(self, status: int, body: bytes) -> None:
        """Answer ``status`` in the app's place (uvicorn's own path, so pipelined answers
        keep their order) and cut the connection once it is out: the body is not read."""
        saved, self.app = self.app, _answer(status, body)
        try:
            super().on_headers_complete()
        finally:
            self.app = saved
        # The body that follows is parsed and dropped uncounted; once the answer is out
        # the connection is cut (a TLS close would keep reading it for close_notify).
        self._discard = True
        self._cut_after_answer = True

    def _fail(self, status: bytes, body: bytes) -> None:
        """Answer the request being read with ``status`` now and close; its handler,
        still waiting for the body, sees a disconnect."""
        cycle = self.cycle
        if (cycle is not None and not cycle.response_started and not self.pipeline
                and not self.transport.is_closing()):
            cycle.response_started = True
            cycle.disconnected = True
            cycle.message_event.set()
            self.transport.write(_response(status, body))
            self.transport.close()
            self.loop.call_later(ABORT_GRACE, self._abort)
        else:
            self.transport.abort()
        self._cancel_timers()

    def _head_too_large(self) -> None:
        self.state.counts["header_too_large"] += 1
        status = b"431 Request Header Fields Too Large"
        if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
            # The requests before it are answered first; nothing more is parsed.
            self._pending = status
            self._cancel_head_timer()
        else:
            self._refuse(status)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.state.limits.header_timeout,
                                                self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._framing == HEAD and not self.transport.is_closing():
            self.state.counts["header_timeout"] += 1
            if self.cycle is None or self.cycle.response_complete:
                self._refuse(b"408 Request Timeout")
            else:
                self.transport.abort()

    def _idle_close(self) -> None:
        """Nothing sent since the handshake for ``idle_timeout``: closed without an
        answer, as uvicorn closes an idle kept-alive connection."""
        self._idle_timer = None
        if self._silent and not self._lost and not self.transport.is_closing():
            self.state.counts["idle_timeout"] += 1
            self.transport.close()
            self.loop.call_later(ABORT_GRACE, self._abort)

    def _body_timeout(self) -> None:
        self._body_timer = None
        if not self._lost:
            self.state.counts["body_timeout"] += 1
            self.transport.abort()  # the handler sees a disconnect; its buffers go

    def _rate_check(self) -> None:
        self._rate_timer = None
        if self._lost or self._framing == HEAD:
            return
        now = self.loop.time()
        if not self.flow.read_paused:  # paused by us (the handler is behind): not its fault
            need = self.state.limits.min_body_rate * min(now - self._window_start, RATE_WINDOW)
            if self._window_bytes < need:
                if not self._rate_strike:
                    # Look again after a poll: libuv (uvloop) runs due timers before it
                    # reads sockets, so after the loop was busy elsewhere the bytes may
                    # be waiting in the kernel, not missing.
                    self._rate_strike = True
                    self._rate_timer = self.loop.call_later(RATE_RECHECK, self._rate_check)
                    return
                self.state.counts["body_too_slow"] += 1
                self._cancel_timers()
                self.transport.abort()
                return
        self._rate_strike = False
        self._window_bytes, self._window_start = 0, now
        self._rate_timer = self.loop.call_later(RATE_WINDOW, self._rate_check)

    def _refuse(self, status: bytes) -> None:
        """Answer ``status`` and close. A TLS close waits for the client's close_notify
        (reading and dropping whatever it still sends) for up to 30 s: the connection is
        aborted after a grace second instead, so an endless sender is cut off."""
        self._cancel_timers()
        if not self.transport.is_closing():
            self.transport.write(_response(status))
            self.transport.close()
            self.loop.call_later(ABORT_GRACE, self._abort)

    def _abort(self) -> None:
        if not self._lost:
            self.transport.abort()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer, self._rate_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._rate_timer = self._idle_timer = None

    def _release(self) -> None:
        if self._held:
            self.state.inflight_body_bytes -= self._held
            self._held = 0


PeerCheck = Callable[[dict[str, Any] | None], bool]


def guarded_protocol(limits: Limits, peer_check: PeerCheck | None = None
                     ) -> type[GuardedHttpTools]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits`` and, when
    given, ``peer_check`` on each connection's verified client certificate. Served
    this way (uvicorn doing TLS), a connection takes its slot once its handshake is
    done; :func:`uvicorn_options` with ``tls=`` counts it from the TCP accept."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return type("EnvelopeHttpProtocol", (GuardedHttpTools, HttpToolsProtocol),
                {"state": LimitState(limits), "peer_check": staticmethod(peer_check)
                 if peer_check is not None else None})


_TLS_LAYERS: dict[type, type] = {}


def _tls_layer(loop: asyncio.AbstractEventLoop) -> type:
    """The running loop's own TLS protocol (uvloop's or asyncio's), with a slot taken
    at the TCP accept and given back when the connection goes, handshake or not."""
    base: type[asyncio.BufferedProtocol]
    # (ignore below: uvloop's stubs do not declare its Cython SSLProtocol, an
    # asyncio.BufferedProtocol)
    try:
        import uvloop
        from uvloop.loop import SSLProtocol as UvSSLProtocol  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        uvloop = None  # type: ignore[assignment]
    if uvloop is not None and isinstance(loop, uvloop.Loop):
        base = UvSSLProtocol
    else:
        from asyncio.sslproto import SSLProtocol

        base = SSLProtocol
    layer = _TLS_LAYERS.get(base)
    if layer is None:
        def connection_made(self: Any, transport: asyncio.Transport) -> None:
            base.connection_made(self, transport)
            if not self._envelope_slots.admit(self, peer_address(transport), transport.abort,
                                              socket_fd(transport)):
                transport.abort()

        def connection_lost(self: Any, exc: Exception | None) -> None:
            self._envelope_slots.release(self)
            base.connection_lost(self, exc)
            app = self._envelope_app
            self._envelope_app = None
            if app is not None and app.transport is None:
                # Never handshaken: its HTTP protocol was never connected and never will
                # be. Break the cycles (protocol <-> parser, protocol -> this layer) so
                # that reference counting frees it now, not the next full collection.
                app.parser = None
                app._slot_key = None
            if self._envelope_trimmer is not None:
                self._envelope_trimmer.note(asyncio.get_event_loop())

        def buffer_updated(self: Any, nbytes: int) -> None:
            if self._envelope_silent:  # the first bytes of a handshake
                self._envelope_silent = False
                self._envelope_slots.started(self)
            base.buffer_updated(self, nbytes)

        layer = _TLS_LAYERS[base] = type("EnvelopeTLS", (base,), {
            "connection_made": connection_made, "connection_lost": connection_lost,
            "buffer_updated": buffer_updated, "_envelope_slots": None,
            "_envelope_trimmer": None, "_envelope_app": None,
            "_envelope_silent": True})
    return layer


def _handshake_done(waiter: asyncio.Future[None]) -> None:
    if not waiter.cancelled():
        waiter.exception()  # a failed or timed-out handshake: nothing to report


def _with_tls(protocol: type[GuardedHttpTools], context: ssl.SSLContext) -> Callable[..., Any]:
    """A protocol factory doing TLS under ``protocol`` (uvicorn must not: its
    ``Config.ssl`` stays unset). Each accepted connection takes a slot at once, before
    any byte of its handshake, and has ``handshake_timeout`` to finish it."""
    limits = protocol.state.limits
    slots = protocol.state.slots
    trimmer = protocol.state.trimmer

    def make(*args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_event_loop()
        app = protocol(*args, **kwargs)
        waiter = loop.create_future()
        waiter.add_done_callback(_handshake_done)
        layer = _tls_layer(loop)(loop, app, context, waiter, server_side=True,
                                 ssl_handshake_timeout=limits.handshake_timeout)
        layer._envelope_slots = slots
        layer._envelope_trimmer = trimmer
        layer._envelope_app = app
        app._slot_key = layer
        return layer

    make.state = protocol.state  # type: ignore[attr-defined]
    return make


def raise_open_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. above fs.nr_open: keep what we have
            log.warning("cannot raise the open-file limit",
                        extra={"fields": {"soft": soft, "hard": hard, "error": str(exc)}})
    return soft


def connection_cap(limits: Limits, open_files: int) -> Limits:
    """``limits`` with ``max_connections`` lowered to what ``open_files`` descriptors
    allow after :data:`RESERVED_FDS`, so accept() never fails for want of one."""
    room = max(16, open_files - RESERVED_FDS)
    if limits.max_connections <= room:
        return limits
    log.warning("--max-connections lowered to fit the open-file limit", extra={"fields": {
        "maxConnections": limits.max_connections, "openFileLimit": open_files, "now": room}})
    from dataclasses import replace

    return replace(limits, max_connections=room)


def uvicorn_options(limits: Limits, peer_check: PeerCheck | None = None,
                    tls: ssl.SSLContext | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config``. With ``tls`` the protocol does the TLS
    handshake itself, so a connection is counted (and evictable) from its accept; leave
    ``Config.ssl`` unset then. Raises the open-file limit (:func:`raise_open_file_limit`)."""
    if tls is not None:
        open_files = raise_open_file_limit()
        limits = connection_cap(limits, open_files)
        log.info("connection limits", extra={"fields": {
            "maxConnections": limits.max_connections, "openFileLimit": open_files,
            "maxBodyBytes": limits.max_body_bytes,
            "maxInflightBodyBytes": limits.max_inflight_body_bytes}})
    protocol = guarded_protocol(limits, peer_check)
    return {"http": protocol if tls is None else _with_tls(protocol, tls),
            "timeout_keep_alive": limits.idle_timeout, "ws": "none",
            # Slots already bound connections to max_connections (evicting idle ones).
            # uvicorn's own count lags an eviction (the TLS layer tells the HTTP protocol
            # of the loss a loop iteration later): a backstop, never the limit.
            "limit_concurrency": 2 * limits.max_connections, "backlog": limits.backlog,
            "h11_max_incomplete_event_size": limits.max_header_bytes}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``envelope serve`` flags for the limits (env: ENVELOPE_<FLAG>)."""
    d = Limits()
    env = os.environ.get

    def flag(name: str, kind: type, default: float, text: str) -> None:
        var = "ENVELOPE_" + name.upper().replace("-", "_")
        parser.add_argument(f"--{name}", type=kind, default=kind(env(var, default)),
                            help=f"{text} (default {default}; env {var})")

    flag("max-header-bytes", int, d.max_header_bytes,
         "largest request head (request line + headers); larger gets 431")
    flag("header-timeout", float, d.header_timeout,
         "seconds for a request head to arrive after its first byte; slower gets 408 and is closed")
    flag("body-timeout", float, d.body_timeout,
         "seconds for a request body to arrive after its head; slower is closed")
    flag("min-body-rate", int, d.min_body_rate,
         "bytes/s a body must keep arriving at after --body-rate-grace; slower is closed (0: off)")
    flag("body-rate-grace", float, d.body_rate_grace,
         "seconds after a head before --min-body-rate applies")
    flag("idle-timeout", float, d.idle_timeout,
         "seconds an idle connection (kept alive, or silent since its TLS handshake) stays open")
    flag("max-connections", int, d.max_connections,
         "TCP connections held at once, TLS handshakes included; beyond it a new one evicts "
         "a connection with no request in progress, or is refused")
    flag("tls-handshake-timeout", float, d.handshake_timeout,
         "seconds for a TLS handshake; slower is closed")
    flag("max-body-bytes", int, d.max_body_bytes,
         "largest review body; larger gets 413 (default: an UPDATE's two objects at etcd's "
         "1.5 MiB, each JSON-escaped at most 6x, plus 1 MiB)")
    flag("max-inflight-body-bytes", int, d.max_inflight_body_bytes,
         "body bytes received and not yet answered, all requests together; beyond it 503")
    flag("backlog", int, d.backlog, "listen backlog")


def limits_from_args(args: argparse.Namespace) -> Limits:
    return Limits(
        max_header_bytes=args.max_header_bytes, header_timeout=args.header_timeout,
        body_timeout=args.body_timeout, idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
        max_inflight_body_bytes=args.max_inflight_body_bytes, backlog=args.backlog,
        max_body_bytes=args.max_body_bytes, min_body_rate=args.min_body_rate,
        body_rate_grace=args.body_rate_grace, handshake_timeout=args.tls_handshake_timeout)
