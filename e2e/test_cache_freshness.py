"""The live view's freshness on a real kube-apiserver of its own (it is frozen here,
so no other test shares it):

- a re-list swaps the whole set at once: a reader polling during forced re-lists
  sees every Node or none, never part of them;
- the API server's bookmarks arrive (``allowWatchBookmarks``); a watch that goes
  silent without closing (the API server SIGSTOPped: the TCP connection stays up) is
  reported stale within the staleness window, and recovers once it answers again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness
from app.cluster.kube import KubeClient, kube_configuration
from app.cluster.live import RESOURCES, LiveView
from app.cluster.view import NODE_LABEL
from harness import Cluster

NODES = 400
STALENESS = 20.0


@pytest.fixture(scope="module")
def own_cluster(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Cluster]:
    running = harness.start_control_plane(tmp_path_factory.mktemp("freshness"),
                                          controlplane_bin_dir)
    try:
        yield running
    finally:
        running.stop()


def _create_nodes(cluster: Cluster, count: int) -> None:
    client = KubeClient(kube_configuration(str(cluster.kubeconfig)))

    def create(start: int) -> None:
        for i in range(start, count, 8):
            client.request("POST", "/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": f"fresh-{i}", "labels": {"zone": f"z{i % 3}"}},
                "status": {"capacity": {"cpu": "8", "memory": "32Gi"},
                           "allocatable": {"cpu": "8", "memory": "32Gi"}}})

    threads = [threading.Thread(target=create, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _view(cluster: Cluster) -> LiveView:
    kinds = {"Node", "Namespace"}
    view = LiveView(kube_configuration(str(cluster.kubeconfig)),
                    tuple(r for r in RESOURCES if r.kind in kinds), staleness=STALENESS)
    view.start()
    deadline = time.monotonic() + 60
    while view.problems():
        assert time.monotonic() < deadline, view.problems()
        time.sleep(0.2)
    return view


def test_relist_is_atomic_for_readers(own_cluster: Cluster) -> None:
    _create_nodes(own_cluster, NODES)
    view = _view(own_cluster)
    try:
        assert view.count("Node") == NODES
        [nodes] = [i for i in view.informers if i.resource.kind == "Node"]
        seen: set[int] = set()
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                seen.add(len(view.list("Node")))
                seen.add(len(view.by_index(NODE_LABEL, "zone=z0")))

        thread = threading.Thread(target=reader)
        thread.start()
        before = nodes.relists
        for _ in range(5):
            nodes.list()  # a forced re-list, as after a 410 Gone
        stop.set()
        thread.join()
        assert nodes.relists == before + 5
        # Unchanged objects are reused by a re-list, changed ones replaced.
        kept = {n["metadata"]["name"]: n for n in view.list("Node")}
        KubeClient(kube_configuration(str(own_cluster.kubeconfig))).request(
            "PATCH", "/api/v1/nodes/fresh-1", {"metadata": {"labels": {"zone": "z9"}}},
            "application/merge-patch+json")
        nodes.list()
        again = {n["metadata"]["name"]: n for n in view.list("Node")}
        assert again["fresh-2"] is kept["fresh-2"]
        assert again["fresh-1"]["metadata"]["labels"]["zone"] == "z9"
        z0 = len([i for i in range(NODES) if i % 3 == 0])
        assert seen <= {NODES, z0}, f"a reader saw a partial set: {sorted(seen)[:10]}"
    finally:
        view.stop()


def test_a_silently_hung_watch_is_stale_within_the_window(own_cluster: Cluster) -> None:
    view = _view(own_cluster)
    try:
        informers = view.informers
        [nodes] = [i for i in informers if i.resource.kind == "Node"]
        watch_timeout = nodes.watch_timeout
        # A watch that saw a change gets a bookmark 2 s before its timeoutSeconds ends
        # (the API server sends none while nothing newer than the watch's start exists:
        # a quiet watch simply ends at timeoutSeconds, which is a sign of life too).
        client = KubeClient(kube_configuration(str(own_cluster.kubeconfig)))
        for i in range(watch_timeout + 3):
            client.request("PATCH", "/api/v1/nodes/fresh-0",
                           {"metadata": {"labels": {"tick": str(i)}}},
                           "application/merge-patch+json")
            time.sleep(1)
        time.sleep(3)
        assert nodes.bookmarks > 0, (nodes.bookmarks, nodes.events)
        assert view.problems() == []
        [apiserver] = [p for p in own_cluster.processes if p.name == "kube-apiserver"]
        silent_from = time.monotonic()
        os.kill(apiserver.pid, signal.SIGSTOP)
        try:
            while not view.problems():
                assert time.monotonic() - silent_from < STALENESS + watch_timeout + 15, \
                    "a hung watch was never reported"
                time.sleep(0.2)
            detected = time.monotonic() - silent_from
        finally:
            os.kill(apiserver.pid, signal.SIGCONT)
        print(f"hung watch reported stale after {detected:.1f}s "
              f"(staleness {STALENESS}s, watch timeout {watch_timeout}s)")
        # Reported once the silence exceeds the staleness window, not much later.
        assert detected <= STALENESS + 5, detected
        assert any("watch lost" in p for p in view.problems())
        deadline = time.monotonic() + 90
        while view.problems():
            assert time.monotonic() < deadline, view.problems()
            time.sleep(0.5)
    finally:
        view.stop()
