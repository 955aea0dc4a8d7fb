"""Canary for the uvicorn and uvloop internals ``app/serve/httplimits.py`` builds on.

``limits.GuardedHttpTools`` is mixed into uvicorn's private ``HttpToolsProtocol`` and
overrides its parser callbacks; ``limits._tls_layer`` subclasses the event loop's private
``SSLProtocol``. Nothing in uvicorn's public API promises these names, so a release that
moves them would break the server in ways the behaviour tests (tests/serve/test_httplimits.py,
test_httplimits_slots.py) report only as a failing request. This file names each internal used, so
an upgrade that moves one fails here first and says which. requirements.lock pins the
versions the image ships, and ``make test`` installs exactly that lock, so this runs
against the shipped uvicorn (tests/test_image_lock.py fails in a venv that is not the lock).
"""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import pytest

LIMITS = Path(__file__).resolve().parents[2] / "app" / "serve" / "httplimits.py"

#: The base methods GuardedHttpTools overrides and calls with super().
OVERRIDDEN = ("__init__", "connection_made", "connection_lost", "data_received", "on_message_begin",
              "on_headers_complete", "on_body", "on_message_complete", "on_response_complete")
#: Instance attributes of HttpToolsProtocol that app/serve/httplimits.py reads.
ATTRIBUTES = ("cycle", "flow", "headers", "loop", "pipeline", "scope", "transport")


def _uvicorn() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


def test_the_list_above_is_what_limits_uses() -> None:
    """The canary's lists follow the code: every super() call and every base attribute
    app/serve/httplimits.py reads on ``self`` is named above (so a new use cannot slip past)."""
    source = LIMITS.read_text()
    assert set(re.findall(r"super\(\)\.(\w+)", source)) == set(OVERRIDDEN)
    own = set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=", source)) | set(re.findall(r"def (\w+)", source))
    envelope_state = {"state", "limits", "peer_check", "_envelope_slots",  # set by limits itself
                      "_envelope_trimmer", "_envelope_app"}
    assert set(re.findall(r"self\.(\w+)", source)) - own - envelope_state == set(ATTRIBUTES)


def test_http_tools_protocol_has_what_we_override() -> None:
    base = _uvicorn()
    for name in OVERRIDDEN:
        assert callable(getattr(base, name, None)), f"uvicorn's HttpToolsProtocol lost {name}"
    params = list(inspect.signature(base.__init__).parameters)
    assert params[:3] == ["self", "config", "server_state"], params
    assert "app_state" in params and "_loop" in params, params
    assert list(inspect.signature(base.on_body).parameters) == ["self", "body"]
    assert list(inspect.signature(base.data_received).parameters) == ["self", "data"]


def test_a_connection_has_the_attributes_we_read() -> None:
    """A real HttpToolsProtocol, made as uvicorn makes one, after connection_made."""
    import uvicorn
    from uvicorn.server import ServerState

    async def app(scope: object, receive: object, send: object) -> None:  # pragma: no cover
        return None

    config = uvicorn.Config(app, http="httptools", lifespan="off", log_config=None)
    config.load()

    class Transport(asyncio.Transport):
        def get_extra_info(self, name: str, default: object = None) -> object:
            return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 8443)}.get(name, default)

        def is_closing(self) -> bool:
            return False

    async def make() -> object:
        protocol = _uvicorn()(config=config, server_state=ServerState(), app_state={})
        protocol.connection_made(Transport())
        return protocol

    # Before connection_made (a connection that never finished its handshake): the TLS
    # layer breaks the protocol's cycle through its parser when it goes (issue 38).
    fresh = _uvicorn()(config=config, server_state=ServerState(), app_state={},
                       _loop=asyncio.new_event_loop())
    assert fresh.transport is None and fresh.parser is not None
    fresh.loop.close()
    protocol = asyncio.run(make())
    for name in ATTRIBUTES:
        assert hasattr(protocol, name), f"uvicorn's HttpToolsProtocol no longer sets self.{name}"
    assert hasattr(protocol.flow, "read_paused")


def test_the_request_cycle_has_the_flags_we_read() -> None:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    fields = set(inspect.signature(RequestResponseCycle.__init__).parameters)
    assert {"scope", "transport", "flow", "default_headers", "message_event"} <= fields, fields
    source = inspect.getsource(RequestResponseCycle)
    for flag in ("response_started", "response_complete", "disconnected"):
        assert f"self.{flag} = " in source, f"uvicorn's RequestResponseCycle lost {flag}"


@pytest.mark.parametrize("which", ["asyncio", "uvloop"])
def test_the_tls_protocols_we_subclass(which: str) -> None:
    if which == "uvloop":
        from uvloop.loop import SSLProtocol
    else:
        from asyncio.sslproto import SSLProtocol
    for name in ("connection_made", "connection_lost", "buffer_updated"):
        assert callable(getattr(SSLProtocol, name, None)), f"{which} SSLProtocol lost {name}"
    if which == "asyncio":  # uvloop's is a Cython class: no signature to read
        params = list(inspect.signature(SSLProtocol.__init__).parameters)
        assert params[1:5] == ["loop", "app_protocol", "sslcontext", "waiter"], params
        assert {"server_side", "ssl_handshake_timeout"} <= set(params), params
