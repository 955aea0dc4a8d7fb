"""Issue 37, classes 1, 2, 3, 7 and 8: what the admission plugins ahead of the webhook
write into a Pod (app/k8s/podmodel.py ``admit``) and what the rules make of it — the
default PriorityClass and quota scopes, RuntimeClass overhead in the namespace's memory
sum, Jobs another controller runs, suspended Jobs and gated Pods, and
ExtendedResourceToleration when the policy says kube-apiserver runs it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.k8s.namespace_policy import managed_elsewhere, pods_at_once
from app.k8s.podmodel import Admission, admit, default_priority_class, extended_resources, pod_of
from tests.conftest import container, run, workload
from tests.helpers.namespace import node, quota


def priority_class(name: str, value: int, default: bool = False) -> dict[str, Any]:
    pc: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                          "metadata": {"name": name}, "value": value}
    if default:
        pc["globalDefault"] = True
    return pc


def scoped(hard: dict[str, str], operator: str, values: list[str] | None = None,
           name: str = "compute") -> dict[str, Any]:
    q = quota(hard, name=name)
    expr: dict[str, Any] = {"scopeName": "PriorityClass", "operator": operator}
    if values is not None:
        expr["values"] = values
    q["spec"]["scopeSelector"] = {"matchExpressions": [expr]}
    return q


def messages(obj: dict[str, Any], view: StaticView, rule: str, policy: Policy | None = None,
             **kw: Any) -> tuple[list[str], list[str]]:
    result = run(obj, policy=policy, view=view, **kw)
    assert result.internal_errors == []
    return ([f.message for f in result.errors if f.rule == rule],
            [f.message for f in result.warnings if f.rule == rule])


# --- class 1: Priority ------------------------------------------------------------------


def test_default_priority_class_is_the_global_default_of_lowest_value() -> None:
    assert default_priority_class([priority_class("a", 10)]) is None
    assert default_priority_class([priority_class("hi", 1000, True), priority_class("lo", 5, True),
                                   priority_class("x", 1)]) == {"name": "lo", "value": 5}


def test_admit_gives_a_pod_without_a_class_the_default_and_leaves_a_named_one() -> None:
    classes = [priority_class("standard", 100, True), priority_class("high", 1000)]
    spec, refused = admit({"containers": []}, Admission(priority_classes=classes))
    assert refused is None and spec["priorityClassName"] == "standard" and spec["priority"] == 100
    spec, _ = admit({"containers": [], "priorityClassName": "high"}, Admission(priority_classes=classes))
    assert spec["priorityClassName"] == "high" and "priority" not in spec
    unknown, _ = admit({"containers": []}, Admission())  # PriorityClasses not known: as written
    assert "priorityClassName" not in unknown
    original: dict[str, Any] = {"containers": []}
    admit(original, Admission(priority_classes=classes))
    assert original == {"containers": []}  # a copy: the subject is never written


def _limited_deployment() -> dict[str, Any]:
    return workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                             limits={"cpu": "2", "memory": "1Gi"})])


def test_cpu_limits_are_kept_under_a_limits_cpu_quota_scoped_to_the_default_class() -> None:
    """The stored template names no class; its Pods get ``standard``; a quota on
    limits.cpu scoped ``PriorityClass In (standard)`` then needs their CPU limits."""
    q = scoped({"limits.cpu": "100"}, "In", ["standard"])
    with_default = StaticView([q, priority_class("standard", 100, True)])
    result = run(_limited_deployment(), view=with_default)
    assert [f.message for f in result.warnings if f.rule == "quota-needs-cpu-limits"]
    no_default = StaticView([q, priority_class("standard", 100)])
    result = run(_limited_deployment(), view=no_default)
    assert not [f for f in result.warnings if f.rule == "quota-needs-cpu-limits"]


def test_enforce_does_not_refuse_for_a_does_not_exist_quota_no_pod_matches() -> None:
    policy = Policy(rules={"quota-needs-cpu-limits": "enforce"})
    q = scoped({"limits.cpu": "100"}, "DoesNotExist")
    errors, _ = messages(_limited_deployment(), StaticView([q, priority_class("standard", 100, True)]),
                         "quota-needs-cpu-limits", policy)
    assert errors == []  # every Pod gets "standard": the quota matches none of them
    errors, _ = messages(_limited_deployment(), StaticView([q]), "quota-needs-cpu-limits", policy)
    assert errors and "PriorityClass DoesNotExist" in errors[0]


def _memory(kind: str, memory: str, **spec: Any) -> dict[str, Any]:
    obj = workload(kind, [container(requests={"memory": memory}, limits={"memory": memory})])
    obj["spec"].update(spec)
    return obj


def test_composition_counts_a_quota_scoped_to_the_default_class() -> None:
    q = scoped({"requests.memory": "3Gi"}, "In", ["standard"], name="std")
    web = _memory("Deployment", "1Gi", replicas=4)
    _, warned = messages(web, StaticView([q, priority_class("standard", 100, True)]),
                         "namespace-memory-composition")
    assert warned and "total 4Gi > quota std requests.memory 3Gi" in warned[0]
    _, warned = messages(web, StaticView([q]), "namespace-memory-composition")
    assert warned == []  # no default class: the Pods name none, the quota counts none


# --- class 2: RuntimeClass overhead in the namespace's memory ----------------------------


def test_composition_charges_the_runtime_class_overhead() -> None:
    rc = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"},
          "handler": "kata", "overhead": {"podFixed": {"memory": "512Mi"}}}
    web = _memory("Deployment", "1Gi", replicas=2)
    web["spec"]["template"]["spec"]["runtimeClassName"] = "kata"
    q = quota({"requests.memory": "2Gi", "limits.memory": "3Gi"}, name="mem")
    _, warned = messages(web, StaticView([q, rc]), "namespace-memory-composition")
    assert warned == ["web 2 x 1536Mi = 3Gi, total 3Gi > quota mem requests.memory 2Gi"]
    _, warned = messages(web, StaticView([q]), "namespace-memory-composition")
    assert warned == []  # the class unknown: as written, 2 x 1Gi fits


def test_overhead_is_added_to_a_limit_only_when_there_is_one() -> None:
    from app.rules.envelope import pod_amount
    spec = {"containers": [{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}],
            "overhead": {"memory": "512Mi"}}
    assert str(pod_amount(spec, "memory", "requests")) == "1610612736"
    assert pod_amount(spec, "memory", "limits") == 0


# --- class 3: Jobs another controller runs ------------------------------------------------


@pytest.mark.parametrize(("managed_by", "want"), [
    (None, 2), ("kubernetes.io/job-controller", 2), ("kueue.x-k8s.io/multikueue", 0)])
def test_a_job_managed_elsewhere_runs_no_pods_here(managed_by: str | None, want: int) -> None:
    job: dict[str, Any] = {"spec": {"parallelism": 2}}
    cron: dict[str, Any] = {"spec": {"jobTemplate": {"spec": {"parallelism": 2}}}}
    if managed_by is not None:
        job["spec"]["managedBy"] = managed_by
        cron["spec"]["jobTemplate"]["spec"]["managedBy"] = managed_by
    assert pods_at_once("Job", job) == want
    assert pods_at_once("CronJob", cron) == want
    assert (managed_elsewhere(job["spec"]) is None) == bool(want)


GPU_NODES = StaticView([node("small", "8", "32Gi")])


def _big_job(**spec: Any) -> dict[str, Any]:
    job = workload("Job", [container(requests={"cpu": "1", "memory": "500Gi"},
                                     limits={"memory": "500Gi"})])
    job["spec"].update(spec)
    return job


def test_pod_fits_node_does_not_place_a_job_another_controller_runs() -> None:
    errors, _ = messages(_big_job(), GPU_NODES, "pod-fits-node")
    assert errors and "needs 500Gi memory" in errors[0]
    errors, warned = messages(_big_job(managedBy="kueue.x-k8s.io/multikueue"), GPU_NODES, "pod-fits-node")
    assert errors == [] and warned == []
    cron = workload("CronJob", [container(requests={"cpu": "1", "memory": "500Gi"},
                                          limits={"memory": "500Gi"})])
    assert messages(cron, GPU_NODES, "pod-fits-node")[0]
    cron["spec"]["jobTemplate"]["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    assert messages(cron, GPU_NODES, "pod-fits-node") == ([], [])


def test_composition_does_not_count_a_job_another_controller_runs() -> None:
    q = quota({"requests.memory": "1Gi"}, name="mem")
    job = _memory("Job", "2Gi")
    assert messages(job, StaticView([q]), "namespace-memory-composition")[1]
    job["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    assert messages(job, StaticView([q]), "namespace-memory-composition") == ([], [])
    other = _memory("Deployment", "512Mi")  # the foreign Job in the namespace is not counted
    assert messages(other, StaticView([q, job]), "namespace-memory-composition") == ([], [])


# --- class 7: queue controllers place what they admit --------------------------------------


def test_a_suspended_job_that_fits_no_node_gets_a_warning_with_the_numbers() -> None:
    errors, warned = messages(_big_job(suspend=True), GPU_NODES, "pod-fits-node")
    assert errors == []
    [message] = warned
    assert "needs 500Gi memory" in message and "offers 32Gi memory" in message
    assert message.startswith("suspended Job, not refused: each pod needs 500Gi") and "Kueue" in message
    resumed = _big_job(suspend=False)
    assert messages(resumed, GPU_NODES, "pod-fits-node")[0]  # resumed: its Pods run now


def test_a_gated_pod_is_warned_not_refused_and_so_is_an_update_that_moves_it() -> None:
    gated = workload("Pod", [container(requests={"cpu": "1", "memory": "8Gi"}, limits={"memory": "8Gi"})])
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert messages(gated, GPU_NODES, "pod-fits-node") == ([], [])
    moved = copy.deepcopy(gated)
    moved["spec"]["nodeSelector"] = {"pool": "none-such"}
    errors, warned = messages(moved, GPU_NODES, "pod-fits-node", operation="UPDATE", old=gated)
    assert errors == []
    assert len(warned) == 1 and warned[0].startswith("gated Pod (kueue.x-k8s.io/admission), not refused: ")
    big = copy.deepcopy(gated)
    big["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "64Gi"},
                                                 "limits": {"memory": "64Gi"}}
    errors, warned = messages(big, GPU_NODES, "pod-fits-node")
    assert errors == [] and "needs 64Gi memory" in warned[0]
    labelled = copy.deepcopy(moved)
    labelled["metadata"]["labels"] = {"a": "b"}  # placement unchanged: not judged again
    assert messages(labelled, GPU_NODES, "pod-fits-node", operation="UPDATE", old=moved) == ([], [])


# --- class 8: ExtendedResourceToleration -------------------------------------------------------


def test_extended_resources_requested_or_limited() -> None:
    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"example.com/fpga": "1",
                                                           "hugepages-2Mi": "2Mi"}}}]}
    assert extended_resources(spec) == ["example.com/fpga", "nvidia.com/gpu"]


def test_the_plugin_adds_a_toleration_per_extended_resource_only_when_enabled() -> None:
    job = {"spec": {"template": {"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}}
    off = pod_of("Job", "batch", job)
    on = pod_of("Job", "batch", job, plugins=["ExtendedResourceToleration"])
    want = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert off.pod is not None and want not in off.pod["spec"]["tolerations"]
    assert on.pod is not None and want in on.pod["spec"]["tolerations"]


def test_pod_fits_node_tolerates_the_gpu_taint_when_the_policy_enables_the_plugin() -> None:
    gpu = node("gpu", "32", "128Gi")
    gpu["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    gpu["spec"] = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    view = StaticView([gpu])
    train = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                              limits={"memory": "1Gi", "nvidia.com/gpu": "1"})])
    errors, _ = messages(train, view, "pod-fits-node")
    assert errors and "untolerated taint" in errors[0]
    gke = Policy.model_validate({"admissionPlugins": ["ExtendedResourceToleration"]})
    assert messages(train, view, "pod-fits-node", gke) == ([], [])
