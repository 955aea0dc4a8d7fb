"""Messages never reveal more than the object's own namespace needs: a denial for a
workload in namespace A carries A's numbers but no node or Karpenter NodePool names,
and not the room left under a NodePool's limits (both cluster-scoped), unless the policy
says ``nodes.nameInMessages: true``."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.cluster.view import StaticView
from app.core.config import Policy
from app.k8s.disclosure import node_shape
from app.k8s.scheduling import Node
from tests.conftest import container, run, workload
from tests.helpers.namespace import node, quota

NAMED = Policy.model_validate({"nodes": {"nameInMessages": True}})


def too_big() -> dict[str, Any]:
    return workload("Deployment", [container(requests={"memory": "64Gi"}, limits={"memory": "64Gi"})])


def test_the_default_describes_the_closest_node_by_shape() -> None:
    view = StaticView([node("secret-gpu-host-7", "16", "32Gi"), node("n2", "8", "16Gi")])
    [error] = run(too_big(), view=view).errors
    assert error.rule == "pod-fits-node"
    assert "the closest (a node with 16 cpu, 32Gi memory) offers 32Gi memory" in error.message
    assert "secret-gpu-host-7" not in error.message and "n2" not in error.message


def test_names_only_when_the_policy_allows() -> None:
    view = StaticView([node("secret-gpu-host-7", "16", "32Gi")])
    [error] = run(too_big(), view=view, policy=NAMED).errors
    assert "the closest (secret-gpu-host-7) offers 32Gi memory" in error.message
    assert Policy().nodes.name_in_messages is False


def test_the_shape_is_after_the_reserve_and_names_the_short_resources() -> None:
    shape = node_shape(Node("n", {"cpu": 15500, "memory": 3 * 2**30, "nvidia.com/gpu": 2}),
                       ["nvidia.com/gpu", "memory"])
    assert shape == "a node with 15500m cpu, 3Gi memory, 2 nvidia.com/gpu"
    reserved = Policy.model_validate({"nodes": {"reserveMemory": "2Gi"}})
    [error] = run(too_big(), view=StaticView([node("n1", "16", "32Gi")]), policy=reserved).errors
    assert "(a node with 16 cpu, 30Gi memory) offers 30Gi memory" in error.message


def test_the_namespace_still_sees_its_own_quota_numbers() -> None:
    view = StaticView([node("host-a", "64", "256Gi"),
                       quota({"requests.memory": "8Gi", "limits.memory": "8Gi"}, ns="team-a")])
    obj = workload("Deployment", [container(requests={"memory": "4Gi"}, limits={"memory": "4Gi"})])
    obj["spec"]["replicas"] = 3
    result = run(obj, view=view)
    messages = " ".join(f.message for f in [*result.errors, *result.warnings])
    assert "quota compute requests.memory 8Gi" in messages and "host-a" not in messages, messages


names = st.from_regex(r"zz-[a-z0-9]{6,12}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(node_names=st.lists(names, min_size=1, max_size=4, unique=True),
       cpus=st.lists(st.integers(1, 64), min_size=4, max_size=4),
       gib=st.lists(st.integers(1, 512), min_size=4, max_size=4),
       want_cpu=st.integers(1, 128), want_gib=st.integers(1, 1024),
       gpus=st.integers(0, 8), selector=st.booleans())
def test_no_message_for_a_namespaced_workload_names_a_node(
        node_names: list[str], cpus: list[int], gib: list[int], want_cpu: int, want_gib: int,
        gpus: int, selector: bool) -> None:
    nodes = []
    for i, name in enumerate(node_names):
        n = node(name, str(cpus[i]), f"{gib[i]}Gi", labels={"pool": "a" if i % 2 else "b"})
        if i == 0:
            n["status"]["allocatable"]["nvidia.com/gpu"] = "4"
            n["spec"] = {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}
        nodes.append(n)
    limits = {"memory": f"{want_gib}Gi", "cpu": str(want_cpu)}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    obj = workload("Deployment", [container(requests={"cpu": str(want_cpu), "memory": f"{want_gib}Gi"},
                                            limits=limits)])
    if selector:
        obj["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "a"}
    result = run(obj, view=StaticView(nodes))
    for finding in [*result.errors, *result.warnings]:
        for name in node_names:
            assert name not in finding.message, (finding.rule, finding.message)


pool_names = st.from_regex(r"pool-[a-z0-9]{6,10}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(pools=st.lists(st.tuples(pool_names, st.integers(1, 200), st.integers(0, 200),
                                st.booleans()), min_size=1, max_size=3, unique_by=lambda p: p[0]),
       want_cpu=st.integers(5, 300), selector=st.booleans())
def test_no_message_for_a_namespaced_workload_names_a_nodepool_or_its_room(
        pools: list[tuple[str, int, int, bool]], want_cpu: int, selector: bool) -> None:
    """Karpenter NodePools are cluster-scoped: no finding names one, or says how much is
    left under its limits (a number only the cluster's spend gives)."""
    objects: list[dict[str, Any]] = [node("zz-node-1", "4", "16Gi")]
    for name, limit, used, tainted in pools:
        objects.append({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                        "spec": {"template": {"metadata": {"labels": {"pool": "a"}}, "spec": {
                            "requirements": [], "taints": [{"key": "gpu", "effect": "NoSchedule"}]
                            if tainted else []}}, "limits": {"cpu": str(limit)}},
                        "status": {"resources": {"cpu": str(used)}}})
    obj = workload("Deployment", [container(requests={"cpu": str(want_cpu), "memory": "1Gi"},
                                            limits={"memory": "1Gi"})])
    if selector:
        obj["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "b"}
    result = run(obj, view=StaticView(objects))
    messages = [f.message for f in [*result.errors, *result.warnings] if f.rule == "pod-fits-node"]
    assert messages  # 4 cpu nodes: every request here needs a new node or is refused
    for message in messages:
        assert "left under" not in message, message
        for name, _, _, _ in pools:
            assert name not in message, message


def test_a_nodepool_is_named_only_when_the_policy_allows() -> None:
    pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "secret-pool"},
            "spec": {"template": {"spec": {}}, "limits": {"cpu": "100"}},
            "status": {"resources": {"cpu": "90"}}}
    obj = workload("Deployment", [container(requests={"cpu": "12", "memory": "1Gi"},
                                            limits={"memory": "1Gi"})])
    view = StaticView([node("n1", "4", "16Gi"), pool])
    [hidden] = run(obj, view=view).errors
    assert "a Karpenter NodePool: cpu 12 requested, more than its limits leave" in hidden.message
    assert "secret-pool" not in hidden.message and "10 left" not in hidden.message
    [named] = run(obj, view=view, policy=NAMED).errors
    assert "NodePool secret-pool: cpu 12 requested, 10 left under its limits" in named.message
