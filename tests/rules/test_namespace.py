"""Rules that read the namespace and the nodes, over a static view."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.k8s.quantity import parse_quantity
from app.rules.envelope import pod_amount
from tests.conftest import container, resources_of, run, workload
from tests.helpers.namespace import node, quota


def limitrange(item: dict[str, Any], name: str = "defaults", ns: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name, "namespace": ns},
            "spec": {"limits": [{"type": "Container", **item}]}}


NAMED = Policy.model_validate({"nodes": {"nameInMessages": True}})
CPU7 = [container(limits={"cpu": "7", "memory": "29Gi"}, requests={"cpu": "7", "memory": "29Gi"})]


@pytest.mark.parametrize(("guard", "rule", "named"), [
    (quota({"limits.cpu": "20", "limits.memory": "64Gi"}), "quota-needs-cpu-limits",
     'ResourceQuota "compute" (no scope) sets limits.cpu=20'),
    (limitrange({"type": "Pod", "max": {"cpu": "8"}}), "limitrange-needs-cpu-limits",
     'LimitRange "defaults" type Pod max cpu 8: the pod has no CPU limit'),
    (limitrange({"maxLimitRequestRatio": {"cpu": "2"}}), "limitrange-needs-cpu-limits",
     "type Container maxLimitRequestRatio cpu 2"),
    # A default CPU limit below the request: LimitRanger's default makes the Pod invalid.
    (limitrange({"default": {"cpu": "2"}}), "limitrange-needs-cpu-limits",
     'LimitRange "defaults" default CPU limit 2 is below container app\'s CPU request 7'),
])
def test_namespace_that_needs_cpu_limits_keeps_them_and_warns(guard: dict, rule: str,
                                                              named: str) -> None:
    obj = workload("Deployment", CPU7)
    result = run(obj, view=StaticView([guard]))
    assert result.patch == []
    assert result.errors == []
    assert any(w.rule == rule and named in w.message and "CPU limits kept" in w.message
               for w in result.warnings)
    # enforce: refuse instead
    enforce = Policy(rules={rule: Mode.ENFORCE})
    denied = run(obj, enforce, view=StaticView([guard]))
    assert [e.rule for e in denied.errors] == [rule]
    # off: strip as usual
    stripped = run(obj, Policy(rules={rule: Mode.OFF}), view=StaticView([guard]))
    assert stripped.patch


def test_guards_look_only_at_the_objects_namespace_and_relevant_keys() -> None:
    obj = workload("Deployment", CPU7)
    view = StaticView([quota({"limits.cpu": "20"}, ns="other"), quota({"requests.cpu": "20"}),
                       limitrange({"default": {"cpu": "8"}}),
                       # max alone: LimitRange defaulting makes it the default limit (8 >= 7)
                       limitrange({"max": {"cpu": "8"}}, name="max-only"),
                       quota({"limits.cpu": "20"}, name="terminating") | {"spec": {
                           "hard": {"limits.cpu": "20"}, "scopes": ["Terminating"]}}])
    assert run(obj, view=view).patch


def test_opted_out_workload_is_not_refused_by_an_enforcing_guard() -> None:
    """Class 5: the guard's own message says to opt out; opting out must then pass."""
    obj = workload("Deployment", CPU7)
    obj["spec"]["template"]["metadata"] = {"annotations": {"envelope.io/keep-cpu-limit": "true"}}
    enforce = Policy(rules={"quota-needs-cpu-limits": Mode.ENFORCE})
    result = run(obj, enforce, view=StaticView([quota({"limits.cpu": "20"})]))
    assert result.errors == [] and result.patch == []


def test_limitrange_default_below_request_warns_on_the_workload() -> None:
    obj = workload("Deployment", [container(requests={"cpu": "7"}, limits={"memory": "29Gi"})])
    view = StaticView([limitrange({"default": {"cpu": "2"}})])
    result = run(obj, view=view)
    [warning] = [w for w in result.warnings if w.rule == "limitrange-default-below-request"]
    assert 'LimitRange "defaults" default cpu limit 2 < request 7' in warning.message
    assert len(warning.message) < 120
    pod = workload("Pod", [container(limits={"cpu": "7", "memory": "29Gi"})])
    assert not [w for w in run(pod, view=view).warnings
                if w.rule == "limitrange-default-below-request"]


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


def test_pod_amount_follows_kubernetes_rules() -> None:
    spec = {"containers": [{"resources": {"requests": {"memory": "1Gi"}}},
                           {"resources": {"limits": {"memory": "2Gi"}}}],
            "initContainers": [{"resources": {"requests": {"memory": "4Gi"}}},
                               {"restartPolicy": "Always", "resources": {"requests": {"memory": "512Mi"}}},
                               {"resources": {"requests": {"memory": "3Gi"}}}],
            "overhead": {"memory": "100Mi"}}
    assert pod_amount(spec, "memory") == parse_quantity("4196Mi")
    spec["resources"] = {"requests": {"memory": "10Gi"}}
    assert pod_amount(spec, "memory") == parse_quantity("10Gi") + parse_quantity("100Mi")
    assert pod_amount({"containers": [{"resources": {"limits": {"memory": "1Gi"}}}]}, "memory",
                      "limits") == parse_quantity("1Gi")


def deployment(name: str, replicas: int, memory: str, ns: str = "team-a") -> dict[str, Any]:
    obj = workload("Deployment", [container(requests={"memory": memory}, limits={"memory": memory})],
                   name=name, namespace=ns)
    obj["spec"]["replicas"] = replicas
    return obj


def test_namespace_memory_composition_breaks_the_sum_down() -> None:
    view = StaticView([quota({"requests.memory": "16Gi"}), deployment("web", 3, "2Gi"),
                       deployment("api", 1, "1Gi"), deployment("elsewhere", 9, "9Gi", "other")])
    incoming = deployment("api", 2, "6Gi")  # replaces the cached api (1 x 1Gi)
    result = run(incoming, view=view)
    [warning] = [w for w in result.warnings if w.rule == "namespace-memory-composition"]
    assert warning.message == ("api 2 x 6Gi = 12Gi, web 3 x 2Gi = 6Gi, "
                               "total 18Gi > quota compute requests.memory 16Gi")
    assert run(deployment("api", 1, "6Gi"), view=view).warnings == []


def test_composition_of_many_workloads_stays_short() -> None:
    objs: list[dict[str, Any]] = [quota({"limits.memory": "1Gi"})]
    objs += [deployment(f"service-{i}", 2, "1Gi") for i in range(30)]
    result = run(deployment("new", 1, "1Gi"), view=StaticView(objs))
    [warning] = [w for w in result.warnings if w.rule == "namespace-memory-composition"]
    assert len(warning.message) < 120 and "more" in warning.message and "total 61Gi" in warning.message


def test_stale_view_is_answered_per_failure_mode() -> None:
    class Stale(StaticView):
        def problems(self, kinds: Any = None) -> list[str]:
            return ["Node watch lost 90s ago"]

    obj = workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})])
    result = run(obj, view=Stale())
    assert any("pod-fits-node: cluster view not current (Node watch lost 90s ago)" in str(e)
               for e in result.internal_errors)


def test_patch_still_applies_cleanly_with_guards_present() -> None:
    obj = workload("Deployment", CPU7)
    result = run(obj, view=StaticView([limitrange({"default": {"cpu": "8"}})]))
    after = jsonpatch.apply_patch(obj, result.patch)
    assert "cpu" not in resources_of(after)["limits"]


def test_updates_are_not_blocked_for_what_they_did_not_change() -> None:
    """A cluster that shrank, or an object older than the policy: `kubectl rollout
    restart` (an annotation) warns but passes; changing the envelope is judged."""
    view = StaticView([node("n1", "16", "32Gi")])
    old = deployment("web", 2, "64Gi")
    old["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "48Gi"
    restarted = deployment("web", 2, "64Gi")
    restarted["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "48Gi"
    restarted["spec"]["template"]["metadata"] = {"annotations": {"kubectl.kubernetes.io/restartedAt": "now"}}
    result = run(restarted, operation="UPDATE", old=old, view=view)
    assert result.errors == []
    warned = {w.rule for w in result.warnings if w.message.startswith("already so before this update")}
    assert warned == {"pod-fits-node", "memory-request-equals-limit"}
    # growing the envelope further is a change this write makes: refused
    grown = deployment("web", 2, "128Gi")
    assert {e.rule for e in run(grown, operation="UPDATE", old=old, view=view).errors} == {"pod-fits-node"}
    # the same object as a CREATE is refused as before
    assert {e.rule for e in run(restarted, view=view).errors} == {"pod-fits-node",
                                                                  "memory-request-equals-limit"}


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


def test_pods_are_judged_past_limitranger_templates_before_it() -> None:
    """A Pod arrives with LimitRanger's default (= max) CPU limit; stripping it leaves
    no limit and LimitRanger's validation refuses: kept. A template's Pods get the
    default back after the strip: stripped."""
    view = StaticView([limitrange({"max": {"cpu": "8"}})])
    pod = workload("Pod", [container(requests={"cpu": "1", "memory": "1Gi"},
                                     limits={"cpu": "8", "memory": "1Gi"})])
    result = run(pod, view=view)
    assert result.patch == [] and any(w.rule == "limitrange-needs-cpu-limits" for w in result.warnings)
    deploy = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                               limits={"cpu": "8", "memory": "1Gi"})])
    assert run(deploy, view=view).patch


def test_huge_quantities_are_judged_quickly_not_crashed() -> None:
    """Class 7: the API server takes 1e999999999; the node rule and the guards must
    judge it (it fits nowhere), never hang on integer conversion or overflow."""
    import time

    view = StaticView([node("n1", "16", "32Gi"), quota({"limits.cpu": "1e999999999"}),
                       limitrange({"type": "Pod", "max": {"cpu": "1e999999999"}})])
    obj = workload("Deployment", [container(requests={"memory": "1e999999999", "cpu": "1e999999999"},
                                            limits={"memory": "1e999999999", "cpu": "1e999999999"})])
    start = time.monotonic()
    result = run(obj, view=view)
    assert time.monotonic() - start < 5
    assert result.internal_errors == []
    assert any(e.rule == "pod-fits-node" for e in result.errors)
