"""pod-fits-node (app/rules/namespace/pod_fits.py) over a static view: numbers in the
message, cordoned and recovering nodes, selectors, reserves, GPUs and taints."""

from __future__ import annotations

from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from tests.conftest import container, run, workload
from tests.helpers.namespace import node

NAMED = Policy.model_validate({"nodes": {"nameInMessages": True}})


def test_pod_that_fits_no_node_is_refused_with_numbers() -> None:
    view = StaticView([node("n1", "16", "32Gi"), node("n2", "8", "48Gi", unschedulable=True)])
    obj = workload("Deployment", [container(requests={"memory": "64Gi"}, limits={"memory": "64Gi"})])
    [error] = run(obj, view=view).errors
    assert error.rule == "pod-fits-node"
    assert ("each pod needs 64Gi memory; no node it may land on has room: the closest (a node "
            "with 16 cpu, 32Gi memory) offers 32Gi memory") in error.message
    assert "reserve 0 cpu, 0 memory" in error.message
    fits = workload("Deployment", [container(requests={"memory": "32Gi"}, limits={"memory": "32Gi"})])
    assert run(fits, view=view).errors == []


def test_a_pod_only_a_cordoned_node_takes_is_not_refused_beside_a_smaller_uncordoned_one() -> None:
    """docs/fidelity.md's deliberate difference (#28 class 4): the cordoned n2 would take
    the pod, so the smaller uncordoned n1 being "closest" must not turn it into a refusal;
    a cordoned node that is too small itself does not count."""
    obj = workload("Deployment", [container(requests={"memory": "64Gi"}, limits={"memory": "64Gi"})])
    view = StaticView([node("n1", "16", "32Gi"), node("n2", "8", "64Gi", unschedulable=True)])
    assert not [f for f in run(obj, view=view).findings if f.rule == "pod-fits-node"]
    small = StaticView([node("n1", "16", "32Gi"), node("n2", "8", "48Gi", unschedulable=True)])
    [error] = run(obj, view=small).errors
    assert "offers 32Gi memory" in error.message


def _tainted(n: dict[str, Any], *keys: str, effect: str = "NoSchedule") -> dict[str, Any]:
    n.setdefault("spec", {})["taints"] = [{"key": k, "effect": effect} for k in keys]
    return n


@pytest.mark.parametrize("key", ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                                 "node.kubernetes.io/network-unavailable",
                                 "node.kubernetes.io/memory-pressure", "node.kubernetes.io/disk-pressure",
                                 "node.kubernetes.io/pid-pressure", "node.kubernetes.io/unschedulable"])
def test_nodes_in_a_state_the_scheduler_waits_out_are_not_a_refusal(key: str) -> None:
    """Every Node NotReady, unreachable, under pressure or cordoned (the node lifecycle
    controller's taints, lifted when the node recovers): kube-scheduler leaves the pods
    Pending, so the write is admitted with a warning naming how many nodes and why
    (e2e/test_node_recovery.py: the kubelet stopped, the Deployment admitted, its pods run
    once the kubelet is back). A pod that fits no node even recovered is still refused."""
    obj = workload("Deployment", [container(requests={"cpu": "2", "memory": "8Gi"},
                                            limits={"memory": "8Gi"})])
    view = StaticView([_tainted(node("n1", "4", "16Gi"), key), _tainted(node("n2", "4", "16Gi"), key)])
    result = run(obj, view=view)
    assert result.errors == []
    [warning] = [f for f in result.findings if f.rule == "pod-fits-node"]
    state = key.removeprefix("node.kubernetes.io/")
    assert warning.message.startswith(f"the pods wait, Pending, for 2 node(s) to recover from {state};"), \
        warning.message
    assert f"untolerated taint {key}:NoSchedule" in warning.message
    named = run(obj, NAMED, view=view)
    assert "(n1 first)" in next(f for f in named.findings if f.rule == "pod-fits-node").message
    too_big = workload("Deployment", [container(requests={"cpu": "2", "memory": "32Gi"},
                                                limits={"memory": "32Gi"})])
    [error] = run(too_big, view=view).errors
    assert error.rule == "pod-fits-node"


def test_a_lasting_taint_or_selection_beside_a_lifecycle_taint_is_still_refused() -> None:
    """Only the states a node leaves on its own wait: a node that is NotReady and also
    carries a taint the pod does not tolerate, or that the pod's selector excludes, does not
    take it once recovered either; a node NotReady and cordoned waits for both."""
    obj = workload("Deployment", [container(requests={"cpu": "2", "memory": "8Gi"},
                                            limits={"memory": "8Gi"})])
    lasting = StaticView([_tainted(node("n1", "4", "16Gi"), "node.kubernetes.io/not-ready", "gpu")])
    assert [f.rule for f in run(obj, view=lasting).errors] == ["pod-fits-node"]
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "b"}
    elsewhere = StaticView([_tainted(node("n1", "4", "16Gi", {"pool": "a"}), "node.kubernetes.io/not-ready")])
    assert [f.rule for f in run(obj, view=elsewhere).errors] == ["pod-fits-node"]
    both = StaticView([_tainted(node("n1", "4", "16Gi", {"pool": "b"}, unschedulable=True),
                                "node.kubernetes.io/not-ready")])
    result = run(obj, view=both)
    assert result.errors == [] and [f.rule for f in result.warnings] == ["pod-fits-node"]


def test_node_selector_narrows_the_nodes_and_reserve_counts() -> None:
    gpu = {"nvidia.com/gpu.product": "H100"}
    view = StaticView([node("big", "64", "512Gi"), node("gpu1", "32", "128Gi", gpu)])
    obj = workload("Pod", [container(requests={"cpu": "40", "memory": "64Gi"},
                                     limits={"memory": "64Gi"})])
    obj["spec"]["nodeSelector"] = gpu
    [error] = run(obj, view=view).errors
    assert "needs 40 cpu" in error.message and "(a node with 32 cpu, 128Gi memory) offers 32" in error.message
    obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "30"
    assert run(obj, view=view).errors == []
    reserved = Policy.model_validate({"nodes": {"reserveCpu": "4"}})
    [error] = run(obj, reserved, view=view).errors
    assert "offers 28 cpu" in error.message and "reserve 4 cpu" in error.message
    sandbox = Policy.model_validate({"nodes": {"sandboxParentReserveMemory": "80Gi"}})
    [error] = run(obj, sandbox, view=view).errors
    assert "offers 48Gi" in error.message
    obj["spec"]["nodeSelector"] = {"pool": "none"}
    [error] = run(obj, view=view).errors
    assert "no node matching nodeSelector {'pool': 'none'} is known" in error.message
    assert "node does not match the pod's nodeSelector" in error.message


def test_no_nodes_known_means_no_finding() -> None:
    obj = workload("Pod", [container(requests={"memory": "1Ti"}, limits={"memory": "1Ti"})])
    obj["spec"]["nodeSelector"] = {"pool": "gpu"}
    assert run(obj).errors == []
    view = StaticView()
    view.replace("Node", [])  # a synced, empty Node cache
    assert run(obj, view=view).errors == []


def test_pod_fits_node_one_node_at_a_time_with_gpus_and_taints() -> None:
    """Class 2: cpu on one node and memory on another is no fit; extended resources
    and taints count; the closest node is named with what it lacks."""
    view = StaticView([node("cpu-rich", "64", "16Gi"), node("mem-rich", "8", "256Gi")])
    obj = workload("Deployment", [container(requests={"cpu": "32", "memory": "64Gi"},
                                            limits={"memory": "64Gi"})])
    [error] = run(obj, view=view).errors
    assert error.rule == "pod-fits-node" and "closest" in error.message
    gpu = node("gpu", "64", "512Gi")
    gpu["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    gpu["spec"] = {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}
    view = StaticView([gpu, node("plain", "64", "512Gi")])
    wants_gpu = workload("Deployment", [container(requests={"memory": "1Gi"},
                                                  limits={"memory": "1Gi", "nvidia.com/gpu": "4"})])
    [error] = run(wants_gpu, view=view).errors
    assert "the closest (a node with 64 cpu, 512Gi memory, 0 nvidia.com/gpu)" in error.message
    wants_gpu["spec"]["template"]["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    assert run(wants_gpu, view=view).errors == []


def test_pod_level_request_is_judged_as_defaulted() -> None:
    """Class 1: pod-level limit 32 cpu, containers ask 1: fits a 16-cpu node."""
    view = StaticView([node("n1", "16", "64Gi")])
    obj = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                            limits={"memory": "1Gi"})])
    obj["spec"]["template"]["spec"]["resources"] = {"limits": {"cpu": "32"}}
    assert [e for e in run(obj, view=view).errors if e.rule == "pod-fits-node"] == []
