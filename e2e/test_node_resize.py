"""In-place resize on the real kubelet: what Envelope lets through on ``pods/resize`` is
what the kubelet actuates, in the Pod's status and in its cgroups. The resize adds a CPU
limit and raises the CPU request and the memory: Envelope removes the added limit
(``cpu-limits`` on a resize removes only a limit the resize adds) and keeps the rest; the
kubelet then writes the new request as ``cpu.shares`` (no quota) and the new memory limit
as ``memory.limit_in_bytes``, in the container's and the pod's cgroups."""

from __future__ import annotations

import json
from typing import Any

import nodepods as p
import pytest
from conftest import NodeEnv

pytestmark = pytest.mark.e2e


def _resources(got: dict[str, Any]) -> dict[str, Any]:
    return dict(p.container_state(got, "app").get("resources") or {})


def test_a_resize_envelope_admits_is_actuated_in_the_cgroups(node_env: NodeEnv) -> None:
    env, node = node_env, node_env.node
    ns = env.namespace("resize")
    res = {"cpu": "250m", "memory": "32Mi"}
    p.create(env.cluster, p.pod("r", ns, node, p.box("app", "while :; do sleep 5; done", requests=res,
                                                     limits=res)))
    before = p.wait_running(node, ns, "r")
    assert before["spec"]["containers"][0]["resources"]["limits"] == {"memory": "32Mi"}
    cpu, mem = node.container_cgroup(before, "app", "cpu"), node.container_cgroup(before, "app", "memory")
    assert (p.read_int(cpu / "cpu.shares"), p.read_int(cpu / "cpu.cfs_quota_us")) == (256, -1)
    assert p.read_int(mem / "memory.limit_in_bytes") == 32 * 2**20

    patch = {"spec": {"containers": [{"name": "app", "resources": {
        "requests": {"cpu": "500m", "memory": "48Mi"}, "limits": {"cpu": "500m", "memory": "48Mi"}}}]}}
    status, body = env.cluster.api("PATCH", f"/api/v1/namespaces/{ns}/pods/r/resize", patch,
                                   content_type="application/strategic-merge-patch+json")
    assert status == 200, body
    assert body["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "48Mi"}, "limits": {"memory": "48Mi"}}, \
        "Envelope removes the CPU limit the resize adds and keeps the rest"

    def actuated(got: dict[str, Any]) -> bool:
        return _resources(got).get("requests", {}).get("cpu") == "500m" and \
            _resources(got).get("limits", {}).get("memory") == "48Mi"

    after = p.wait_for(node, "the kubelet to actuate the resize", ns, "r", actuated, timeout=120)
    print(f"resize: status resources {json.dumps(_resources(after))}")
    assert "cpu" not in _resources(after).get("limits", {})
    assert (p.read_int(cpu / "cpu.shares"), p.read_int(cpu / "cpu.cfs_quota_us")) == (512, -1)
    assert p.read_int(mem / "memory.limit_in_bytes") == 48 * 2**20
    pod_dir = node.pod_cgroup_dir(after)
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.shares") == 512
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.cfs_quota_us") == -1
    assert p.read_int(node.cgroup("memory", pod_dir) / "memory.limit_in_bytes") == 48 * 2**20
    p.delete(env.cluster, ns, "r")
