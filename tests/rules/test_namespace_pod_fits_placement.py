"""pod-fits-node for pods no kube-scheduler places and pods a controller or admission
plugin changes first (issue 28 classes 3 and 4, issue 27 item 4): ``spec.nodeName``
(the kubelet admits the pod), other schedulers, DaemonSets, RuntimeClasses, gated pods."""

from __future__ import annotations

import copy
from typing import Any

from app.cluster.view import StaticView
from tests.conftest import container, run, workload
from tests.helpers.namespace import node


def errors(obj: dict[str, Any], view: StaticView, **kw: Any) -> list[str]:
    return [f.message for f in run(obj, view=view, **kw).errors if f.rule == "pod-fits-node"]


def findings(obj: dict[str, Any], view: StaticView) -> list[str]:
    return [f.message for f in run(obj, view=view).findings if f.rule == "pod-fits-node"]


def pod(memory: str = "8Gi", **spec: Any) -> dict[str, Any]:
    obj = workload("Pod", [container(requests={"cpu": "1", "memory": memory}, limits={"memory": memory})])
    obj["spec"].update(spec)
    return obj


def tainted(name: str, cpu: str, memory: str, effect: str, **kw: Any) -> dict[str, Any]:
    n = node(name, cpu, memory, **kw)
    n.setdefault("spec", {})["taints"] = [{"key": "dedicated", "value": "x", "effect": effect}]
    return n


SMALL_AND_BIG = StaticView([node("small", "4", "16Gi"), node("big", "64", "256Gi")])


def test_a_pod_with_node_name_is_judged_on_that_node_only() -> None:
    assert errors(pod("8Gi", nodeName="small"), SMALL_AND_BIG) == []
    [message] = errors(pod("32Gi", nodeName="small"), SMALL_AND_BIG)  # big has room: no matter
    assert "its node (spec.nodeName" in message and "offers 16Gi memory" in message
    assert errors(pod("32Gi", nodeName="not-in-the-view"), SMALL_AND_BIG) == []


def test_the_kubelet_checks_noexecute_taints_and_affinity_but_not_noschedule_or_the_cordon() -> None:
    view = StaticView([tainted("ns", "4", "16Gi", "NoSchedule", unschedulable=True),
                       tainted("ne", "4", "16Gi", "NoExecute"), node("zoned", "4", "16Gi", {"zone": "a"})])
    assert errors(pod(nodeName="ns"), view) == []
    [message] = errors(pod(nodeName="ne"), view)
    assert "untolerated taint dedicated=x:NoExecute" in message
    assert errors(pod(nodeName="zoned", nodeSelector={"zone": "a"}), view) == []
    assert errors(pod(nodeName="zoned", nodeSelector={"zone": "b"}), view)


def test_the_kubelet_ignores_an_extended_resource_the_node_does_not_have() -> None:
    """predicate.go removeMissingExtendedResources: a GPU request on a node with no
    nvidia.com/gpu allocatable passes the kubelet's admission."""
    obj = workload("Pod", [container(requests={"cpu": "1", "memory": "1Gi"},
                                     limits={"memory": "1Gi", "nvidia.com/gpu": "2"})])
    obj["spec"]["nodeName"] = "small"
    assert errors(obj, SMALL_AND_BIG) == []
    with_gpus = node("small", "4", "16Gi")
    with_gpus["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    assert errors(obj, StaticView([with_gpus]))


def test_a_resize_of_a_bound_pod_is_judged_on_its_own_node() -> None:
    old = pod("8Gi", nodeName="small")
    new = copy.deepcopy(old)
    for key in ("requests", "limits"):
        new["spec"]["containers"][0]["resources"][key]["memory"] = "32Gi"
    [message] = errors(new, SMALL_AND_BIG, operation="UPDATE", old=old)
    assert "offers 16Gi memory" in message


def test_a_pod_for_another_scheduler_is_judged_by_what_the_kubelet_admits() -> None:
    """KAI (schedulerName kai-scheduler) may bind to a NoSchedule-tainted or cordoned
    node; whatever binds it, the kubelet fails a pod no node has room for."""
    view = StaticView([tainted("gpu", "8", "32Gi", "NoSchedule", unschedulable=True)])
    assert errors(pod("16Gi", schedulerName="kai-scheduler"), view) == []
    assert errors(pod("16Gi"), view)  # kube-scheduler: the cordon and the taint block it
    [message] = errors(pod("64Gi", schedulerName="kai-scheduler"), view)
    assert "schedulerName kai-scheduler" in message and "offers 32Gi memory" in message
    default = StaticView([tainted("gpu", "8", "32Gi", "NoSchedule")])
    assert errors(pod("16Gi"), default)  # kube-scheduler filters the untolerated NoSchedule taint
    assert errors(pod("16Gi", schedulerName="kai-scheduler"), default) == []


def test_a_daemonset_is_judged_with_the_tolerations_its_controller_adds() -> None:
    view = StaticView([node("cordoned", "4", "16Gi", unschedulable=True)])
    ds = workload("DaemonSet", [container(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "1Gi"})])
    assert findings(ds, view) == []  # the unschedulable:NoSchedule toleration is added
    big = workload("DaemonSet", [container(requests={"cpu": "1", "memory": "64Gi"},
                                           limits={"memory": "64Gi"})])
    [message] = errors(big, view)
    assert "offers 16Gi memory" in message


def test_a_daemonset_whose_selection_takes_no_node_creates_no_pod_and_is_not_refused() -> None:
    ds = workload("DaemonSet", [container(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "1Gi"})])
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"role": "gpu"}
    assert findings(ds, SMALL_AND_BIG) == []
    deployment = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                                   limits={"memory": "1Gi"})])
    deployment["spec"]["template"]["spec"]["nodeSelector"] = {"role": "gpu"}
    assert errors(deployment, SMALL_AND_BIG)  # a Deployment's pods would stay Pending


def runtime_class(**extra: Any) -> dict[str, Any]:
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"},
            "handler": "kata", **extra}


def test_a_template_naming_a_runtime_class_gets_its_overhead_node_selector_and_tolerations() -> None:
    gpu_node = tainted("gpu", "8", "32Gi", "NoSchedule", labels={"sandbox": "yes"})
    cluster = [node("plain", "64", "256Gi"), gpu_node]
    deployment = workload("Deployment", [container(requests={"cpu": "1", "memory": "30Gi"},
                                                   limits={"memory": "30Gi"})])
    deployment["spec"]["template"]["spec"]["runtimeClassName"] = "kata"
    overhead = StaticView([*cluster, runtime_class(overhead={"podFixed": {"memory": "4Gi"}}, scheduling={
        "nodeSelector": {"sandbox": "yes"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}]})])
    [message] = errors(deployment, overhead)  # 30Gi + 4Gi overhead on the only selected node
    assert "needs 34Gi memory" in message and "offers 32Gi memory" in message
    no_overhead = StaticView([*cluster, runtime_class(scheduling={
        "nodeSelector": {"sandbox": "yes"}, "tolerations": [{"key": "dedicated", "operator": "Exists"}]})])
    assert errors(deployment, no_overhead) == []
    untolerated = StaticView([*cluster, runtime_class(scheduling={"nodeSelector": {"sandbox": "yes"}})])
    assert "untolerated taint" in errors(deployment, untolerated)[0]


def test_an_update_of_a_gated_pods_scheduling_fields_is_warned_never_refused() -> None:
    """docs/fidelity.md (issue 37, class 7): queue controllers (Kueue) write node
    selectors into a Pod while it is gated; one that leaves it on no node is a warning
    with the numbers, never a refusal (whoever removes the gates may still change it)."""
    old = pod("8Gi", schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
    assert errors(old, SMALL_AND_BIG) == []
    new = copy.deepcopy(old)
    new["spec"]["nodeSelector"] = {"pool": "none"}
    assert errors(new, SMALL_AND_BIG, operation="UPDATE", old=old) == []
    [warned] = [f.message for f in run(new, view=SMALL_AND_BIG, operation="UPDATE", old=old).warnings
                if f.rule == "pod-fits-node"]
    assert "nodeSelector" in warned and "schedulingGates" in warned
