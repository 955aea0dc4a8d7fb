"""RuntimeClass overhead in the pod's cgroups on the real kubelet: a RuntimeClass with the
``runc`` handler and ``overhead.podFixed``; the RuntimeClass admission plugin copies the
overhead into the Pod, Envelope removes the CPU limit, and the kubelet sizes the pod's
cgroup from the pod's request plus the overhead, as app/k8s/scheduling.py ``pod_requests``
counts it (what ``pod-fits-node`` charges a node): ``cpu.shares`` of (requests + overhead),
no quota, ``memory.limit_in_bytes`` of (limits + overhead)."""

from __future__ import annotations

import nodepods as p
import pytest
from conftest import NodeEnv

from app.k8s.scheduling import pod_requests

pytestmark = pytest.mark.e2e

OVERHEAD = {"cpu": "250m", "memory": "64Mi"}


def test_runtimeclass_overhead_is_in_the_pod_cgroup_as_pod_fits_node_counts_it(node_env: NodeEnv) -> None:
    env, node = node_env, node_env.node
    status, body = env.cluster.api("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "runc-overhead"},
        "handler": "runc", "overhead": {"podFixed": OVERHEAD}})
    assert status in (201, 409), body
    ns = env.namespace("overhead")
    res = {"cpu": "500m", "memory": "64Mi"}
    stored, _ = p.create(env.cluster, p.pod("o", ns, node, p.box("app", "while :; do sleep 5; done",
                                                                 requests=res, limits=res),
                                            runtimeClassName="runc-overhead"))
    assert stored["spec"]["overhead"] == OVERHEAD
    assert "cpu" not in stored["spec"]["containers"][0]["resources"]["limits"]
    running = p.wait_running(node, ns, "o")
    charged = pod_requests(running["spec"])
    assert charged["cpu"] * 1000 == 750
    pod_dir = node.pod_cgroup_dir(running)
    assert pod_dir.startswith("burstable/")
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.shares") == int(charged["cpu"] * 1024)
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.cfs_quota_us") == -1
    assert p.read_int(node.cgroup("memory", pod_dir) / "memory.limit_in_bytes") == 128 * 2**20
    container = node.container_cgroup(running, "app", "cpu")
    assert p.read_int(container / "cpu.shares") == 512  # the container: its own request only
