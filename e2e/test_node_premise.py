"""The premise Envelope exists for, on a real node (containerd, runc, the kubelet at the e2e
version, cgroup v1): what a CPU limit, its absence and a memory limit become in the pod's
cgroups, and what they do to a running process. No timed assertion: the kernel's own
counters (cpu.stat, cpuacct.usage, memory.limit_in_bytes) and the kubelet's statuses.
The side-by-side timing is bench/node_premise.py (docs/benchmarks.md, "The node").

Each manifest is written twice: in a namespace the webhook does not judge (what the user
wrote) and in one it judges (what Envelope lets through)."""

from __future__ import annotations

import os
from typing import Any

import nodepods as p
import pytest
from conftest import NodeEnv

from app.k8s.podspec import qos_class

pytestmark = pytest.mark.e2e

PERIOD_US = 100_000
"""The CFS period the kubelet sets (cpu.cfs_period_us; its default, 100 ms)."""


def _cores() -> int:
    return os.cpu_count() or 1


def test_a_cpu_limit_is_a_quota_that_throttles_and_envelope_removes_it(node_env: NodeEnv) -> None:
    """limits.cpu below the node's cores: cfs_quota_us = limit x period and throttled
    periods on a busy loop, however idle the node; through Envelope: no quota (-1), the
    request as the shares, and no period throttled."""
    env, node = node_env, node_env.node
    plain, judged = env.namespace("premise-plain", webhook=False), env.namespace("premise-envelope")
    # 20m: 2 ms of CPU per 100 ms period, which a busy loop overruns even on a machine so
    # loaded that it gets a few percent of a core (the shared 2-core VMs: load 12 gave each
    # pod ~7 % of a core, under a 200m quota). bench/node_premise.py times 500m and more.
    resources = {"cpu": "20m", "memory": "32Mi"}
    assert _cores() * 1000 > 20
    for ns in (plain, judged):
        p.create(env.cluster, p.pod("busy", ns, node, p.box("busy", p.BUSY, requests=resources,
                                                            limits=resources)))
    limited = p.wait_running(node, plain, "busy")
    stripped = p.wait_running(node, judged, "busy")
    assert "cpu" not in stripped["spec"]["containers"][0]["resources"].get("limits", {}), \
        "the webhook left the CPU limit: is it registered?"

    lim_cpu = node.container_cgroup(limited, "busy", "cpu")
    str_cpu = node.container_cgroup(stripped, "busy", "cpu")
    assert p.read_int(lim_cpu / "cpu.cfs_period_us") == PERIOD_US
    assert p.read_int(lim_cpu / "cpu.cfs_quota_us") == 2_000  # 20m x 100 ms
    assert p.read_int(lim_cpu / "cpu.shares") == 20  # MilliCPUToShares(20)
    assert p.read_int(str_cpu / "cpu.cfs_quota_us") == -1
    assert p.read_int(str_cpu / "cpu.shares") == 20  # the request is kept: same shares
    # The pod-level cgroup too: Guaranteed pods sit in kubepods/pod<uid> with the quota.
    assert limited["status"]["qosClass"] == "Guaranteed"
    assert p.read_int(node.cgroup("cpu", node.pod_cgroup_dir(limited)) / "cpu.cfs_quota_us") == 2_000
    assert stripped["status"]["qosClass"] == "Burstable"
    assert p.read_int(node.cgroup("cpu", node.pod_cgroup_dir(stripped)) / "cpu.cfs_quota_us") == -1

    pod_cpu = tuple(node.cgroup("cpu", node.pod_cgroup_dir(x)) for x in (limited, stripped))
    before = [p.cpu_stat(x) for x in (lim_cpu, str_cpu, *pod_cpu)]
    # The container's and the pod's cgroup carry the same quota: either may run out first.
    def throttled() -> int:
        return p.cpu_stat(pod_cpu[0])["nr_throttled"] + p.cpu_stat(lim_cpu)["nr_throttled"]

    start = before[0]["nr_throttled"] + before[2]["nr_throttled"]
    node.wait("the limited pod to be throttled", lambda: throttled() > start + 5, 60)
    after = [p.cpu_stat(x) for x in (lim_cpu, str_cpu, *pod_cpu)]
    print(f"throttling: limited container {after[0]}, pod {after[2]}; stripped container {after[1]}, "
          f"pod {after[3]}")
    assert after[0]["nr_periods"] > before[0]["nr_periods"]
    for stat in (after[1], after[3]):  # no quota: no period, nothing throttled
        assert stat["nr_throttled"] == 0 and stat["throttled_time"] == 0, stat
    for ns in (plain, judged):
        p.delete(env.cluster, ns, "busy")


def test_b_requests_keep_fairness_without_limits(node_env: NodeEnv) -> None:
    """Two pods without CPU limits (Envelope removed them), CPU requests 1:3, each able to
    use every core of the node: contending, they get CPU time in proportion to their
    requests (cpu.shares 1:3 in kubepods/burstable), so removing limits does not let one
    starve the other. The proportion is the kernel's cpuacct.usage over 10 s."""
    env, node = node_env, node_env.node
    ns = env.namespace("premise-fair")
    loops = _cores()
    for name, cpu in (("small", "250m"), ("large", "750m")):
        res = {"cpu": cpu, "memory": "16Mi"}
        p.create(env.cluster, p.pod(name, ns, node, p.box("work", p.busy_loops(loops), requests=res,
                                                          limits=res)))
    small = p.wait_running(node, ns, "small")
    large = p.wait_running(node, ns, "large")
    for got in (small, large):
        assert "cpu" not in got["spec"]["containers"][0]["resources"].get("limits", {})
    cgroups = [node.cgroup("cpuacct", node.pod_cgroup_dir(x)) for x in (small, large)]
    assert [p.read_int(node.cgroup("cpu", node.pod_cgroup_dir(x)) / "cpu.shares") for x in (small, large)] \
        == [256, 768]
    p.usage_over(cgroups, 2)  # settle: both running their loops
    used = p.usage_over(cgroups, 10)
    ratio = used[1] / max(used[0], 1)
    share = used[1] / max(sum(used), 1)
    print(f"fairness: small {used[0] / 1e9:.2f}s, large {used[1] / 1e9:.2f}s CPU over 10 s; "
          f"ratio {ratio:.2f} (requests 1:3), large's share {share:.3f} (0.75 expected)")
    # Observed on the 2-core VMs under other load: ratios 2.6-3.3 (docs/benchmarks.md).
    assert 0.65 <= share <= 0.85, (used, ratio)
    for name in ("small", "large"):
        p.delete(env.cluster, ns, name)


def test_c_memory_limit_is_the_cgroup_limit_and_an_oom_kill_stays_in_its_container(
        node_env: NodeEnv) -> None:
    """Memory request == limit (Envelope keeps it): the container's memory.limit_in_bytes;
    a container that grows past it is OOMKilled in its own cgroup while its neighbour keeps
    running; the QoS class the kubelet reports (and places the pod's cgroup by) is the one
    Envelope computes: with the CPU limit removed, Burstable, as cpu-limits' warning says
    for a whole-core pod."""
    env, node = node_env, node_env.node
    ns = env.namespace("premise-memory")
    trigger = node.workdir / "triggers" / ns
    grow = "while [ ! -e /trigger/go ]; do sleep 0.2; done; exec tail /dev/zero"
    manifest = p.pod(
        "mem", ns, node,
        p.box("grower", grow, requests={"cpu": "1", "memory": "48Mi"},
              limits={"cpu": "1", "memory": "48Mi"},
              volumeMounts=[{"name": "trigger", "mountPath": "/trigger"}]),
        p.box("neighbour", "while :; do sleep 1; done", requests={"cpu": "100m", "memory": "16Mi"},
              limits={"cpu": "100m", "memory": "16Mi"}),
        volumes=[{"name": "trigger", "hostPath": {"path": str(trigger), "type": "DirectoryOrCreate"}}])
    created, warnings = p.create(env.cluster, manifest)
    assert any("become Burstable" in w for w in warnings), warnings
    assert [c["resources"]["limits"] for c in created["spec"]["containers"]] == \
        [{"memory": "48Mi"}, {"memory": "16Mi"}], "cpu-limits removes the CPU limits, memory stays"
    running = p.wait_running(node, ns, "mem")
    assert running["status"]["qosClass"] == qos_class(running["spec"]) == "Burstable"
    pod_dir = node.pod_cgroup_dir(running)
    assert pod_dir.startswith("burstable/") and node.cgroup("memory", pod_dir).is_dir()
    grower = node.container_cgroup(running, "grower", "memory")
    neighbour = node.container_cgroup(running, "neighbour", "memory")
    assert p.read_int(grower / "memory.limit_in_bytes") == 48 * 2**20
    assert p.read_int(neighbour / "memory.limit_in_bytes") == 16 * 2**20
    assert p.read_int(node.cgroup("memory", pod_dir) / "memory.limit_in_bytes") == 64 * 2**20

    (trigger / "go").touch()

    def oom_killed(got: dict[str, Any]) -> bool:
        return (p.container_state(got, "grower").get("state") or {}).get("terminated", {}).get("reason") \
            == "OOMKilled"

    done = p.wait_for(node, "the grower OOMKilled", ns, "mem", oom_killed, timeout=120)
    neighbour_state = p.container_state(done, "neighbour")
    assert "running" in neighbour_state["state"], neighbour_state
    assert neighbour_state.get("restartCount", 0) == 0
    assert p.read_int(neighbour / "memory.limit_in_bytes") == 16 * 2**20  # its cgroup untouched
    assert done["status"]["phase"] == "Running"
    p.delete(env.cluster, ns, "mem")
