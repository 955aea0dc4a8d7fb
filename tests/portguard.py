"""Hold Envelope's default ports for the whole test session.

`make test` must pass while `make run` (or a local Prometheus, or anything else) holds
8443 and 9090. Loaded for every pytest run (``-p tests.portguard`` in pyproject.toml), this
plugin binds both on all addresses before any test starts, so a test that starts `serve`
on a default port fails here every time instead of only on a developer's busy machine.
A port something else already holds is the condition we want, and is left as it is.
``ENVELOPE_TEST_FREE_DEFAULT_PORTS=1`` turns the plugin off (never needed by the suite).
"""

from __future__ import annotations

import os
import socket

import pytest

DEFAULT_PORTS = (8443, 9090)

_held: list[socket.socket] = []


def _hold(port: int) -> bool:
    """Listen on 0.0.0.0:port; False when something already holds it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen(1)
    except OSError:
        sock.close()
        return False
    _held.append(sock)
    return True


def held_ports() -> tuple[int, ...]:
    """The default ports this session holds itself."""
    return tuple(s.getsockname()[1] for s in _held)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("ENVELOPE_TEST_FREE_DEFAULT_PORTS") == "1":
        return
    for port in DEFAULT_PORTS:
        _hold(port)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _held:
        _held.pop().close()


def pytest_report_header(config: pytest.Config) -> str:
    mine = held_ports()
    others = [p for p in DEFAULT_PORTS if p not in mine]
    text = f"default ports held for the session: {', '.join(map(str, mine)) or 'none'}"
    if others:
        text += f" (already held by another process: {', '.join(map(str, others))})"
    return text
