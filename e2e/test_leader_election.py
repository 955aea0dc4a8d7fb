"""Leader election with clocks 10 minutes apart, on a real API server's Leases.

Two electors share one Lease; one's wall clock is 10 minutes off. While the leader
keeps renewing, the other never takes over (no second leader), whichever of the two
has the skewed clock; once the leader stops, the other takes over after about one
lease duration on its own clock, not after the skew.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from app.cluster.kube import KubeClient, kube_configuration
from app.serve.certs import LeaseElector
from harness import Cluster

DURATION = 2
SKEW = dt.timedelta(minutes=10)
TICK = 0.2


def _electors(cluster: Cluster, namespace: str, lease: str, skewed: str
              ) -> tuple[LeaseElector, LeaseElector]:
    client = KubeClient(kube_configuration(str(cluster.kubeconfig)))

    def clock(off: bool) -> dt.datetime:
        now = dt.datetime.now(dt.UTC)
        return now + SKEW if off else now

    first = LeaseElector(client, namespace, lease, "first", DURATION,
                         clock=lambda: clock(skewed == "first"))
    second = LeaseElector(client, namespace, lease, "second", DURATION,
                          clock=lambda: clock(skewed == "second"))
    return first, second


@pytest.mark.parametrize("skewed", ["first", "second"],
                         ids=["leader-clock-ahead", "follower-clock-ahead"])
def test_skewed_clocks_never_make_two_leaders(cluster: Cluster, namespace: str,
                                              skewed: str) -> None:
    first, second = _electors(cluster, namespace, f"skew-{skewed}", skewed)
    assert first.try_acquire()
    ticks = 0
    deadline = time.monotonic() + 4 * DURATION
    while time.monotonic() < deadline:
        # Both try every tick; only the first may lead while it renews.
        a, b = first.try_acquire(), second.try_acquire()
        assert a and not b, f"tick {ticks}: first={a} second={b}"
        ticks += 1
        time.sleep(TICK)
    # The leader stops renewing: the follower takes over after one lease duration as
    # measured by its own monotonic clock (not after the 10 minutes of skew).
    stopped = time.monotonic()
    while not second.try_acquire():
        assert time.monotonic() - stopped < DURATION + 3, "the follower never took over"
        time.sleep(TICK)
    waited = time.monotonic() - stopped
    print(f"skewed={skewed}: {ticks} ticks with one leader; takeover after {waited:.1f}s")
    assert waited >= DURATION - TICK
    # And the old leader, back, does not grab it while the new one renews.
    for _ in range(int(2 * DURATION / TICK)):
        assert second.try_acquire()
        assert not first.try_acquire()
        time.sleep(TICK)
