"""Connection slots (app/serve/httplimits.py ``Slots``): who is evicted when a listener is full.
The listeners' own tests (test_httplimits_probes.py, test_metrics_server.py) show it on sockets."""

from __future__ import annotations

import pytest

from app.serve.httplimits import BUSY, IDLE, Slots


def _slots(cap: int) -> tuple[Slots, list[str]]:
    closed: list[str] = []
    return Slots(cap), closed


def _add(slots: Slots, closed: list[str], key: str, peer: str) -> bool:
    return slots.admit(key, peer, lambda: closed.append(key))


def test_the_biggest_peers_oldest_idle_connection_goes_first() -> None:
    slots, closed = _slots(4)
    _add(slots, closed, "kubelet-old", "10.0.0.1")
    for key in ("a1", "a2", "a3"):
        _add(slots, closed, key, "10.9.9.9")
    assert _add(slots, closed, "probe", "10.0.0.1")
    assert closed == ["a1"]  # not the older kubelet one: 10.9.9.9 holds more
    assert len(slots) == 4 and slots.evicted == 1


def test_connections_that_never_sent_a_request_go_before_idle_kept_alive_ones() -> None:
    slots, closed = _slots(3)
    _add(slots, closed, "api-1", "10.0.0.2")
    _add(slots, closed, "api-2", "10.0.0.2")
    slots.mark("api-1", IDLE)
    slots.mark("api-2", IDLE)
    _add(slots, closed, "silent", "10.9.9.9")
    assert _add(slots, closed, "new", "10.0.0.3")
    assert closed == ["silent"]
    assert _add(slots, closed, "newer", "10.0.0.3")
    assert closed == ["silent", "new"]  # fresh before idle, even from a smaller peer


def test_only_when_every_slot_is_busy_is_the_newcomer_refused() -> None:
    slots, closed = _slots(2)
    for key in ("r1", "r2"):
        _add(slots, closed, key, "10.0.0.2")
        slots.mark(key, BUSY)
    assert not _add(slots, closed, "new", "10.9.9.9")
    assert closed == [] and slots.refused == 1
    slots.release("r1")
    assert _add(slots, closed, "new", "10.9.9.9")


def test_release_is_idempotent_and_counts_per_peer() -> None:
    slots, closed = _slots(2)
    _add(slots, closed, "x", "p")
    slots.release("x")
    slots.release("x")
    assert len(slots) == 0
    _add(slots, closed, "y", "p")
    _add(slots, closed, "z", "q")
    assert _add(slots, closed, "w", "q")  # p and q tie at one: the oldest (y) goes
    assert closed == ["y"]


def test_a_connection_sending_its_handshake_goes_after_silent_ones() -> None:
    """A probe mid-handshake (bytes arriving) outlives older connections that sent
    nothing, even from the same address."""
    slots, closed = _slots(3)
    _add(slots, closed, "silent-1", "127.0.0.1")
    _add(slots, closed, "probe", "127.0.0.1")
    slots.started("probe")
    _add(slots, closed, "silent-2", "127.0.0.1")
    for key in ("new-1", "new-2"):
        assert _add(slots, closed, key, "127.0.0.1")
    assert closed == ["silent-1", "silent-2"]
    slots.mark("probe", IDLE)
    slots.started("probe")  # only a silent slot becomes started
    assert _add(slots, closed, "new-3", "127.0.0.1")
    assert closed == ["silent-1", "silent-2", "new-1"]


def test_eviction_storms_collect_what_evicted_connections_leave(monkeypatch: pytest.MonkeyPatch) -> None:
    """A young-generation collection after every EVICTIONS_PER_COLLECT evictions (a full
    one took 0.24-0.37 s with the 30k view, issue 38; the closed connections' cycles are
    broken, so nothing of theirs is left for it: tests/serve/test_httplimits_halfopen_memory.py); none
    without evictions."""
    import app.serve.httplimits as hl

    calls: list[int] = []
    monkeypatch.setattr(hl.gc, "collect", lambda *a: calls.append(a[0] if a else 2) or 0)
    slots = hl.Slots(4)
    for i in range(4):
        assert slots.admit(("held", i), "10.0.0.1", lambda: None)
    assert calls == []
    for i in range(hl.EVICTIONS_PER_COLLECT * 2 + 10):
        assert slots.admit(("churn", i), "10.0.0.9", lambda: None)
    assert slots.evicted == hl.EVICTIONS_PER_COLLECT * 2 + 10
    assert calls == [1, 1]  # generation 1, never a full collection


def test_a_connection_whose_first_bytes_wait_unread_is_not_silent() -> None:
    """A probe's ClientHello already in the kernel, not yet read by the loop: the
    connection is not evicted as silent; the truly silent one goes, though newer."""
    import socket

    slots, closed = _slots(2)
    probe_server, probe_client = socket.socketpair()
    quiet_server, quiet_client = socket.socketpair()
    try:
        probe_client.sendall(b"\x16\x03\x01")  # the start of a ClientHello
        assert slots.admit("probe", "127.0.0.1", lambda: closed.append("probe"),
                           probe_server.fileno())
        assert slots.admit("quiet", "127.0.0.1", lambda: closed.append("quiet"),
                           quiet_server.fileno())
        assert _add(slots, closed, "newcomer", "127.0.0.1")
        assert closed == ["quiet"]
        assert probe_server.recv(8) == b"\x16\x03\x01"  # the peek consumed nothing
    finally:
        for s in (probe_server, probe_client, quiet_server, quiet_client):
            s.close()
