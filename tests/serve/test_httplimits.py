"""HTTP abuse limits on the real ``envelope serve`` (HTTPS on 127.0.0.1): stalled heads
and bodies are closed within their timeouts, an endless header is refused with 431
after the limit and RSS stays flat, bodies beyond the in-flight budget get 503 at
once, and ordinary reviews are untouched."""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.serve import REVIEW, Serve, closed_after, start_serve

TIMEOUT = 1.0
IDLE = 3.0
HEAD = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "


def review(serve: Serve) -> bytes:
    with serve.connect() as s:
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(REVIEW)).encode() + b"\r\nConnection: close\r\n\r\n"
                  + REVIEW)
        return closed_after(s, 10)[1]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    srv = start_serve(tmp_path_factory.mktemp("limits"), extra=(
        "--header-timeout", str(TIMEOUT), "--body-timeout", str(TIMEOUT), "--idle-timeout", str(IDLE),
        "--max-inflight-body-bytes", str(4 * 1024 * 1024)))
    yield srv
    srv.proc.terminate()
    srv.proc.wait(10)


def test_a_review_still_works(serve: Serve) -> None:
    assert review(serve).startswith(b"HTTP/1.1 200")


def test_a_silent_connection_is_closed_after_the_idle_timeout(serve: Serve) -> None:
    """Handshaken and silent is what an API server's pooled connection looks like: it
    is closed without an answer after the idle timeout, not the head timeout (a 408
    there raced the client's reuse and failed a review)."""
    with serve.connect() as s:
        waited, got = closed_after(s, 10)
    assert IDLE - 0.5 < waited < IDLE + 1.5 and got == b"", (waited, got)


def test_a_head_is_timed_from_its_first_byte(serve: Serve) -> None:
    with serve.connect() as s:
        time.sleep(TIMEOUT + 0.5)  # idle past the head timeout: still open
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
        waited, got = closed_after(s, 10)
    assert waited < TIMEOUT + 1.5 and got.startswith(b"HTTP/1.1 408"), (waited, got)


def test_a_stalled_head_is_closed_after_the_header_timeout(serve: Serve) -> None:
    with serve.connect() as s:
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Le")
        waited, got = closed_after(s, 10)
    assert waited < TIMEOUT + 1.5 and got.startswith(b"HTTP/1.1 408"), (waited, got)


def test_a_stalled_body_is_closed_after_the_body_timeout(serve: Serve) -> None:
    before = serve.rss_mib()
    socks = []
    for _ in range(8):
        s = serve.connect()
        s.sendall(HEAD + b"400000\r\n\r\n"
                  + b"{" * 300_000)
        socks.append(s)
    waits = [closed_after(s, 10)[0] for s in socks]
    for s in socks:
        s.close()
    print(f"stalled bodies closed after {max(waits):.2f}s; RSS {before:.0f} -> "
          f"{serve.rss_mib():.0f} MiB")
    assert max(waits) < TIMEOUT + 1.5, waits


def test_bodies_beyond_the_inflight_budget_get_503(serve: Serve) -> None:
    """The budget counts bytes received: 3 MB really sent (of 3.5 MB declared) and held
    leave 1.19 MiB of the 4 MiB; a second body crossing that gets 503 with a reason."""
    held = serve.connect()
    held.sendall(HEAD + b"3500000\r\n\r\n" + b"{" * 3_000_000)
    time.sleep(0.2)
    with serve.connect() as s:
        s.sendall(HEAD + b"2000000\r\n\r\n")
        with contextlib.suppress(OSError):  # cut once the answer was out
            s.sendall(b"{" * 2_000_000)
        _, got = closed_after(s, 10)
    held.close()
    assert got.startswith(b"HTTP/1.1 503") and b"max-inflight-body-bytes" in got, got[:300]
    time.sleep(TIMEOUT + 0.5)  # the stalled one is gone and has given its budget back
    assert review(serve).startswith(b"HTTP/1.1 200")


def test_an_endless_header_gets_431_and_rss_stays_flat(serve: Serve) -> None:
    before = serve.rss_mib()
    sent, cut = 0, False
    with serve.connect() as s:
        s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * (1024 * 1024)
        try:
            while sent < 200 * 1024 * 1024:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            cut = True
        _, got = closed_after(s, 10)
    after = serve.rss_mib()
    print(f"endless header: refused after {sent / 2**20:.0f} MiB sent; RSS {before:.0f} -> "
          f"{after:.0f} MiB")
    # Refused: answered 431 (and dropped what followed) or cut while we were sending.
    assert got.startswith(b"HTTP/1.1 431") or (cut and got == b""), (cut, got[:100])
    assert after - before < 20, (before, after)


def test_a_pipelined_second_request_with_an_oversized_head_is_never_parsed(serve: Serve) -> None:
    """Two requests in one write: the first is answered, the second's 100 KiB head
    (the limit is 64 KiB) gets 431 and the connection is closed. Before, only the first
    head of a write was counted and the second reached the handler."""
    second = (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"X-Big: " + b"a" * (100 * 1024) + b"\r\nContent-Length: "
              + str(len(REVIEW)).encode() + b"\r\n\r\n" + REVIEW)
    with serve.connect() as s:
        s.sendall(HEAD + str(len(REVIEW)).encode() + b"\r\n\r\n" + REVIEW + second)
        _, got = closed_after(s, 10)
    answers = got.count(b"HTTP/1.1 ")
    assert got.startswith(b"HTTP/1.1 200") and b'"uid":"u1"' in got, got[:300]
    assert answers == 2 and b"HTTP/1.1 431" in got, got[-300:]


def test_small_pipelined_requests_are_all_answered_in_order(serve: Serve) -> None:
    """The per-request framing keeps ordinary pipelining working."""
    one = HEAD + str(len(REVIEW)).encode() + b"\r\n\r\n" + REVIEW
    with serve.connect() as s:
        s.sendall(one * 3 + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _, got = closed_after(s, 10)
    assert got.count(b"HTTP/1.1 200") == 4 and got.rstrip().endswith(b"ok"), got[-300:]


def test_a_pipelined_head_split_across_writes_is_counted_from_its_first_byte(serve: Serve) -> None:
    """The second head starts in the first write (60 KiB of it) and goes on in the
    next: 60 + 60 KiB is over the limit, though each write alone is under it."""
    first = HEAD + str(len(REVIEW)).encode() + b"\r\n\r\n" + REVIEW
    with serve.connect() as s:
        s.sendall(first + b"POST /validate HTTP/1.1\r\nX-A: " + b"a" * (60 * 1024))
        time.sleep(0.3)
        with contextlib.suppress(OSError):
            s.sendall(b"a" * (60 * 1024) + b"\r\nContent-Length: 2\r\n\r\n{}")
        _, got = closed_after(s, 10)
    assert got.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 431" in got, got[-200:]


def test_slow_declared_large_bodies_do_not_starve_real_reviews(tmp_path: Path) -> None:
    """Six connections declare 2 MB bodies (12 MB, over the 8 MiB budget) and send one
    byte a second. Before, each reserved its declared 2 MB: four took the whole budget
    and every real review got 503 for 10 s. Now the budget counts bytes received, so
    real reviews (a small one and a 1 MB one) are answered while the trickles go on,
    and each trickle is cut once --body-rate-grace (2 s) has passed and a second went
    by below --min-body-rate (well before --body-timeout, 10 s)."""
    srv = start_serve(tmp_path, extra=("--max-inflight-body-bytes", str(8 * 1024 * 1024)))
    big = REVIEW[:-2] + b',"pad":"' + b"x" * 1_000_000 + b'"}}'
    try:
        slow = [srv.connect() for _ in range(6)]
        started = time.monotonic()
        for s in slow:
            s.sendall(HEAD + b"2000000\r\n\r\n{")
            s.settimeout(0.05)
        answers: list[bytes] = []
        cut_at: dict[int, float] = {}
        while time.monotonic() - started < 6 and len(cut_at) < len(slow):
            for body in (REVIEW, big):
                with srv.connect() as c:
                    c.sendall(HEAD + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                              + body)
                    answers.append(closed_after(c, 10)[1][:12])
            for i, s in enumerate(slow):
                if i in cut_at:
                    continue
                try:
                    s.sendall(b" ")
                    if s.recv(1) == b"":
                        cut_at[i] = time.monotonic() - started
                except TimeoutError:
                    pass
                except (OSError, ssl.SSLError):
                    cut_at[i] = time.monotonic() - started
            time.sleep(0.5)
        for s in slow:
            s.close()
    finally:
        srv.proc.terminate()
        srv.proc.wait(10)
    print(f"{len(answers)} reviews during the trickles; trickles cut at "
          f"{sorted(round(t, 1) for t in cut_at.values())} s")
    assert answers and all(a.startswith(b"HTTP/1.1 200") for a in answers), answers
    assert len(cut_at) == len(slow) and max(cut_at.values()) < 6, cut_at
