"""Abuse limits at the HTTP layer: what uvicorn's httptools protocol does not bound.

uvicorn (httptools) has no limit on the size of a request head (one 200 MiB header
took RSS from 74 to 467 MiB and was accepted), no timeout for a head or a body that
stops arriving (a stalled connection was still open after 590 s) and no bound on the
bodies held by requests in flight (80 stalled 3 MiB bodies: +293 MiB). This module is
a subclass of uvicorn's ``HttpToolsProtocol`` that adds, per connection:

- **head size**: bytes before the blank line that ends the head are counted as they
  arrive; past ``max_header_bytes`` the client gets ``431`` and the connection is
  closed, before httptools has buffered more than that;
- **head timeout**: the head must be complete within ``header_timeout`` seconds of the
  connection (or of the first byte of the next request on a kept-alive one), else
  ``408`` and close — this also closes connections that never send anything;
- **body timeout**: the body must be complete within ``body_timeout`` seconds of the
  head; else the connection is closed (the review it carried is dropped with it);
- **in-flight body budget**: each request reserves its ``Content-Length`` (a chunked
  body reserves the 3 MiB maximum) from ``max_inflight_body_bytes`` shared by all
  connections; a request that does not fit gets ``503`` at once, before its body is
  read, so the API server applies the webhook's failure policy.

uvicorn's own settings cover the rest (see :func:`uvicorn_options`): idle keep-alive
(``timeout_keep_alive``), a cap on connections and tasks answered ``503``
(``limit_concurrency``) and the listen ``backlog``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
else:
    _Base = object  # uvicorn is imported when a server is made, not by ``envelope check``

__all__ = [
    "LimitState",
    "Limits",
    "add_arguments",
    "guarded_protocol",
    "limits_from_args",
    "uvicorn_options",
]

MAX_BODY = 3 * 1024 * 1024
"""The largest body a review may have (server.py refuses more with 413)."""

ABORT_GRACE = 0.25
"""Seconds a refused connection has to take its answer before it is cut."""


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
    max_inflight_body_bytes: int = 64 * 1024 * 1024
    backlog: int = 2048


@dataclass
class LimitState:
    """Shared by every connection of one server (one event loop: no lock needed)."""

    limits: Limits
    inflight_body_bytes: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {
        "header_too_large": 0, "header_timeout": 0, "body_timeout": 0, "body_budget": 0,
        "peer_refused": 0})


def _response(status: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: 0\r\nconnection: close\r\n\r\n")


class GuardedHttpTools(_Base):
    """The limits above, mixed into uvicorn's ``HttpToolsProtocol`` by
    :func:`guarded_protocol`, which also sets ``state``."""

    state: LimitState
    peer_check: Callable[[dict[str, Any] | None], bool] | None = None
    """With mTLS: whether the client certificate's names are allowed (TlsState.peer_allowed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._reserved = 0
        self._lost = False

    # -- connection ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        check = self.peer_check
        if check is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            peer = ssl_object.getpeercert() if ssl_object is not None else None
            if not check(peer):  # a verified certificate, but not a name we serve
                self.state.counts["peer_refused"] += 1
                transport.abort()
                return
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._cancel_timers()
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            window = self._tail + data
            end = window.find(b"\r\n\r\n")
            used = end + 4 - len(self._tail) if end >= 0 else len(data)
            if self._head_bytes + used > self.state.limits.max_header_bytes:
                self.state.counts["header_too_large"] += 1
                self._refuse(b"431 Request Header Fields Too Large")
                return
            self._head_bytes += used
            self._tail = window[-3:]
        super().data_received(data)

    # -- parser callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # the next request on a kept-alive connection
            self._start_head()

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        need = self._body_size()
        limits = self.state.limits
        if need and self.state.inflight_body_bytes + need > limits.max_inflight_body_bytes:
            # uvicorn's own 503 path (``service_unavailable``, Connection: close).
            self.state.counts["body_budget"] += 1
            saved, self.limit_concurrency = self.limit_concurrency, 0
            try:
                super().on_headers_complete()
            finally:
                self.limit_concurrency = saved
            # The 503 goes out at once; a TLS close would then keep reading the body
            # the client is still sending until its close_notify: cut it instead.
            self.loop.call_later(ABORT_GRACE, self._abort)
            return
        if need:
            self._reserved = need
            self.state.inflight_body_bytes += need
            self._body_timer = self.loop.call_later(limits.body_timeout, self._body_timeout)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._release()
        super().on_response_complete()

    # -- helpers ----------------------------------------------------------------------

    def _body_size(self) -> int:
        for name, value in self.headers or ():
            if name == b"content-length":
                return min(int(value), MAX_BODY) if value.isdigit() else MAX_BODY
            if name == b"transfer-encoding":
                return MAX_BODY
        return 0

    def _start_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.state.limits.header_timeout,
                                                self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self.state.counts["header_timeout"] += 1
            if self.cycle is None or self.cycle.response_complete:
                self._refuse(b"408 Request Timeout")
            else:
                self.transport.abort()

    def _body_timeout(self) -> None:
        self._body_timer = None
        if not self._lost:
            self.state.counts["body_timeout"] += 1
            self.transport.abort()  # the handler sees a disconnect; its buffers go

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
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _release(self) -> None:
        if self._reserved:
            self.state.inflight_body_bytes -= self._reserved
            self._reserved = 0


PeerCheck = Callable[[dict[str, Any] | None], bool]


def guarded_protocol(limits: Limits, peer_check: PeerCheck | None = None
                     ) -> type[GuardedHttpTools]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits`` and, when
    given, ``peer_check`` on each connection's verified client certificate."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return type("EnvelopeHttpProtocol", (GuardedHttpTools, HttpToolsProtocol),
                {"state": LimitState(limits), "peer_check": staticmethod(peer_check)
                 if peer_check is not None else None})


def uvicorn_options(limits: Limits, peer_check: PeerCheck | None = None) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config``."""
    return {"http": guarded_protocol(limits, peer_check),
            "timeout_keep_alive": limits.idle_timeout,
            "limit_concurrency": limits.max_connections, "backlog": limits.backlog,
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
         "seconds for a request head to arrive; slower gets 408 and is closed")
    flag("body-timeout", float, d.body_timeout,
         "seconds for a request body to arrive after its head; slower is closed")
    flag("idle-timeout", float, d.idle_timeout, "seconds an idle kept-alive connection stays open")
    flag("max-connections", int, d.max_connections,
         "open connections or in-flight requests beyond which requests get 503")
    flag("max-inflight-body-bytes", int, d.max_inflight_body_bytes,
         "sum of the bodies being read at once; a request that does not fit gets 503")
    flag("backlog", int, d.backlog, "listen backlog")


def limits_from_args(args: argparse.Namespace) -> Limits:
    return Limits(args.max_header_bytes, args.header_timeout, args.body_timeout,
                  args.idle_timeout, args.max_connections, args.max_inflight_body_bytes,
                  args.backlog)
