"""app/k8s/scheduling.py: kube-scheduler's filters, one node at a time (cases from
upstream's own tests where they exist; the e2e scheduling oracle checks the rest
against the real kube-scheduler)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from app.crds.autoscaling import scale_up
from app.k8s.defaulting import default_pod, effective_pod_requests
from app.k8s.scheduling import (
    Node,
    NodeGroup,
    fit_node,
    is_scalar_resource,
    node_from_object,
    node_shape,
    place_pod,
    pod_requests,
    tolerates,
)


def c(name: str, req: dict[str, str] | None = None, lim: dict[str, str] | None = None,
      restart: str | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if req is not None:
        res["requests"] = req
    if lim is not None:
        res["limits"] = lim
    out: dict[str, Any] = {"name": name, "image": "x", "resources": res}
    if restart:
        out["restartPolicy"] = restart
    return out


def node(name: str = "n1", **alloc: str) -> Node:
    raw = {k.replace("_", "-"): v for k, v in alloc.items()}
    raw.setdefault("pods", "110")
    return node_from_object({"metadata": {"name": name}, "status": {"allocatable": raw}})


# ------------------------------------------------------------------ pod requests


def test_sidecars_add_and_init_containers_take_the_max() -> None:
    # KEP-753 example: InitContainerUse(i) = sum(sidecars before i) + init i.
    spec = {
        "initContainers": [
            c("init1", {"cpu": "1"}),
            c("side1", {"cpu": "200m"}, restart="Always"),
            c("init2", {"cpu": "1500m"}),
            c("side2", {"cpu": "300m"}, restart="Always"),
        ],
        "containers": [c("main", {"cpu": "500m"})],
    }
    # regular 500m + sidecars 500m = 1; init2 + side1 = 1.7 -> 1.7
    assert pod_requests(spec)["cpu"] == Decimal("1.7")


def test_overhead_is_added_and_pod_level_replaces_aggregate() -> None:
    spec = {
        "containers": [c("a", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"})],
        "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4"}},
        "overhead": {"cpu": "100m", "memory": "10Mi"},
    }
    req = pod_requests(spec)
    assert req["cpu"] == Decimal("2.1")
    assert req["memory"] == Decimal(2**30 + 10 * 2**20)
    assert req["nvidia.com/gpu"] == 1


# -------------------------------------------------------------------- defaulting


def test_pod_level_requests_default_from_containers_not_limits() -> None:
    """Class 1: containers request 500m in total, pod limit 8 -> pod request 500m."""
    pod = {"spec": {"containers": [c("a", {"cpu": "250m"}), c("b", {"cpu": "250m"})],
                    "resources": {"limits": {"cpu": "8", "memory": "1Gi"}}}}
    out = default_pod(pod)
    assert out["spec"]["resources"]["requests"] == {"cpu": "0.500", "memory": "1Gi"}
    assert effective_pod_requests(pod)["cpu"] == Decimal("0.5")
    assert pod["spec"]["resources"] == {"limits": {"cpu": "8", "memory": "1Gi"}}  # not mutated


def test_container_limits_default_container_requests_then_pod_level() -> None:
    pod = {"spec": {"containers": [c("a", lim={"memory": "256Mi"})],
                    "resources": {"limits": {"memory": "1Gi", "cpu": "2"}}}}
    out = default_pod(pod)
    assert out["spec"]["containers"][0]["resources"]["requests"] == {"memory": "256Mi"}
    assert out["spec"]["resources"]["requests"] == {"memory": "268435456", "cpu": "2"}


def test_pod_level_requests_default_without_pod_level_limits_since_1_37() -> None:
    # v1.37.2 DefaultPodLevelResources (PodLevelResourcesFixDefaulting, on): requests or
    # limits set is enough (1.34-1.36 defaulted requests only with pod-level limits).
    pod = {"spec": {"containers": [c("a", {"cpu": "1"})], "resources": {"requests": {"memory": "1Gi"}}}}
    assert default_pod(pod)["spec"]["resources"] == {"requests": {"memory": "1Gi", "cpu": "1"}}


def test_pod_level_limits_default_to_the_larger_of_request_and_container_limits() -> None:
    # defaultPodLevelLimits: only where every container (init included) has the limit.
    both = {"spec": {"containers": [c("a", lim={"cpu": "250m", "memory": "1Gi"}),
                                    c("b", lim={"memory": "512Mi"})],
                     "resources": {"requests": {"cpu": "4"}}}}
    out = default_pod(both)["spec"]["resources"]
    assert out["limits"] == {"memory": "1610612736"}  # cpu: container b has no cpu limit
    assert out["requests"] == {"cpu": "4", "memory": "1610612736"}
    one = {"spec": {"containers": [c("a", lim={"cpu": "250m"})], "resources": {"requests": {"cpu": "4"}}}}
    assert default_pod(one)["spec"]["resources"]["limits"] == {"cpu": "4"}  # max(request, 250m)


def test_hugepages_pod_limit_defaults_from_containers() -> None:
    pod = {"spec": {"containers": [c("a", lim={"hugepages-2Mi": "4Mi", "memory": "1Gi"})],
                    "resources": {"limits": {"memory": "2Gi"}}}}
    out = default_pod(pod)["spec"]["resources"]
    assert out["limits"] == {"memory": "2Gi", "hugepages-2Mi": "4194304"}
    # hugepages are not overcommittable: the request comes from the pod limit.
    assert out["requests"] == {"memory": "1073741824", "hugepages-2Mi": "4194304"}


# ---------------------------------------------------------------------- resources


def test_one_node_at_a_time_not_the_max_per_dimension() -> None:
    """Class 2: cpu on one node, memory on another: fits neither."""
    spec = {"containers": [c("a", {"cpu": "4", "memory": "8Gi"})]}
    nodes = [node("cpu-rich", cpu="8", memory="4Gi"), node("mem-rich", cpu="2", memory="16Gi")]
    verdict = place_pod(spec, [NodeGroup(n) for n in nodes], pod_requests(spec), 10)
    assert not verdict.fits
    assert verdict.closest is not None
    # Each node lacks half of one resource (a tie): the first name is the closest, with
    # the numbers pod-fits-node shows (requested, free, allocatable).
    assert verdict.closest.node.name == "cpu-rich"
    assert [(s.resource, s.requested, s.free, s.allocatable) for s in verdict.closest.shortfalls] == \
        [("memory", 8 * 2**30, 4 * 2**30, 4 * 2**30)]


def test_extended_resources_and_pod_count() -> None:
    spec = {"containers": [c("a", {"nvidia.com/gpu": "2", "cpu": "1"})]}
    assert not fit_node(spec, node(cpu="8", memory="8Gi")).fits  # no GPUs at all
    assert fit_node(spec, node(cpu="8", memory="8Gi", **{"nvidia.com/gpu": "2"})).fits
    full = node_from_object(
        {"metadata": {"name": "full"}, "status": {"allocatable": {"cpu": "8", "pods": "1"}}},
        [{"spec": {"containers": [c("x")]}}])
    v = fit_node({"containers": [c("a")]}, full)
    assert [s.resource for s in v.shortfalls] == ["pods"]


def test_cpu_counts_in_rounded_up_millicores() -> None:
    spec = {"containers": [c("a", {"cpu": "1500u"})]}  # 1.5m -> 2m
    assert not fit_node(spec, node(cpu="1m")).fits
    assert fit_node(spec, node(cpu="2m")).fits


def test_zero_request_fits_even_without_the_resource() -> None:
    assert fit_node({"containers": [c("a", {"example.com/foo": "0"})]}, node(cpu="1")).fits


@pytest.mark.parametrize(("name", "scalar"), [
    ("nvidia.com/gpu", True), ("hugepages-2Mi", True), ("example.com/foo", True),
    ("kubernetes.io/something", True), ("cpu", False), ("pods", False), ("foo", False),
    ("requests.example.com/x", False), ("attachable-volumes-csi-x", True),
])
def test_scalar_resource_names(name: str, scalar: bool) -> None:
    assert is_scalar_resource(name) is scalar


# -------------------------------------------------------------- taints, affinity


@pytest.mark.parametrize(("toleration", "taint", "ok"), [
    # from k8s.io/api core/v1 toleration_test.go TestTolerationToleratesTaint
    ({"key": "foo", "operator": "Exists", "effect": "NoSchedule"},
     {"key": "foo", "value": "bar", "effect": "NoSchedule"}, True),
    ({"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"},
     {"key": "foo", "value": "bar", "effect": "NoSchedule"}, True),
    ({"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"},
     {"key": "foo", "value": "baz", "effect": "NoSchedule"}, False),
    ({"key": "foo", "operator": "Exists", "effect": ""},
     {"key": "foo", "value": "bar", "effect": "NoExecute"}, True),
    ({"key": "foo", "operator": "Exists", "effect": "NoSchedule"},
     {"key": "foo", "value": "bar", "effect": "NoExecute"}, False),
    ({"key": "", "operator": "Exists"}, {"key": "any", "value": "v", "effect": "NoSchedule"}, True),
    ({"key": "foo", "value": "bar"}, {"key": "foo", "value": "bar", "effect": "NoExecute"}, True),
    ({"key": "foo", "operator": "Bogus"}, {"key": "foo", "effect": "NoSchedule"}, False),
])
def test_tolerates(toleration: dict[str, str], taint: dict[str, str], ok: bool) -> None:
    assert tolerates(toleration, taint) is ok


def test_taints_prefer_no_schedule_does_not_filter() -> None:
    n = Node(name="t", allocatable={"pods": 10}, taints=({"key": "a", "effect": "PreferNoSchedule"},))
    assert fit_node({"containers": [c("x")]}, n).fits
    n2 = Node(name="t", allocatable={"pods": 10}, taints=({"key": "a", "effect": "NoExecute"},))
    assert not fit_node({"containers": [c("x")]}, n2).fits


def test_unschedulable_unless_tolerated() -> None:
    n = Node(name="u", allocatable={"pods": 10}, unschedulable=True)
    assert not fit_node({"containers": [c("x")]}, n).fits
    tol = {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]}
    assert fit_node({"containers": [c("x")], **tol}, n).fits


def _aff(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"containers": [c("x")], "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}}


@pytest.mark.parametrize(("expr", "labels", "ok"), [
    ({"key": "z", "operator": "In", "values": ["a", "b"]}, {"z": "b"}, True),
    ({"key": "z", "operator": "In", "values": ["a"]}, {}, False),
    ({"key": "z", "operator": "NotIn", "values": ["a"]}, {}, True),
    ({"key": "z", "operator": "NotIn", "values": ["a"]}, {"z": "a"}, False),
    ({"key": "z", "operator": "Exists"}, {"z": ""}, True),
    ({"key": "z", "operator": "DoesNotExist"}, {"z": ""}, False),
    ({"key": "gen", "operator": "Gt", "values": ["3"]}, {"gen": "4"}, True),
    ({"key": "gen", "operator": "Gt", "values": ["3"]}, {"gen": "3"}, False),
    ({"key": "gen", "operator": "Lt", "values": ["3"]}, {"gen": "-1"}, True),
    ({"key": "gen", "operator": "Lt", "values": ["3"]}, {"gen": "a"}, False),
    ({"key": "gen", "operator": "Gt", "values": ["3"]}, {}, False),
])
def test_affinity_operators(expr: dict[str, Any], labels: dict[str, str], ok: bool) -> None:
    n = Node(name="n", allocatable={"pods": 10}, labels=labels)
    assert fit_node(_aff({"matchExpressions": [expr]}), n).fits is ok


def test_affinity_terms_or_fields_and_empty_terms() -> None:
    n = Node(name="node-a", allocatable={"pods": 10}, labels={"z": "1"})
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
    not_name = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]}]}
    miss = {"matchExpressions": [{"key": "z", "operator": "In", "values": ["2"]}]}
    assert fit_node(_aff(by_name), n).fits
    assert not fit_node(_aff(not_name), n).fits
    assert fit_node(_aff(miss, by_name), n).fits  # terms are ORed
    assert not fit_node(_aff({}), n).fits  # only empty terms: matches nothing
    assert not fit_node(_aff(), n).fits


def test_node_selector_and_affinity_both_apply() -> None:
    n = Node(name="n", allocatable={"pods": 10}, labels={"a": "1"})
    spec = _aff({"matchExpressions": [{"key": "a", "operator": "Exists"}]})
    assert fit_node(spec, n).fits
    assert not fit_node({**spec, "nodeSelector": {"a": "2"}}, n).fits


# --------------------------------------------------------------- autoscaling shapes


def test_potential_nodes_never_make_it_fit_but_are_reported() -> None:
    spec = {"containers": [c("a", {"nvidia.com/gpu": "8"})]}
    shape = node_shape("p4d.24xlarge", {"nvidia.com/gpu": "8", "pods": "110", "cpu": "96"})
    assert not place_pod(spec, [NodeGroup(node(cpu="8"))], pod_requests(spec), 10).fits
    new_node, why_not = scale_up(spec, pod_requests(spec), shapes=[shape])
    assert new_node is not None and new_node.verdict.fits
    assert "p4d.24xlarge" in new_node.source
    assert why_not == []
    too_big = {"containers": [c("a", {"nvidia.com/gpu": "16"})]}
    assert not place_pod(too_big, [NodeGroup(node(cpu="8"))], pod_requests(too_big), 10).fits
    none, why_not = scale_up(too_big, pod_requests(too_big), shapes=[shape])
    assert none is None
    assert why_not == ["shape p4d.24xlarge: nvidia.com/gpu 16 requested, 8 allocatable"]


def test_pod_level_defaulting_sums_the_rounded_container_values_since_1_37() -> None:
    """v1.37 defaults pod-level requests in PrepareForCreate, after decoding rounded every
    list (SetDefaults_ResourceList): 0.501 + 0.501 = 1.002, which validation accepts (1.34
    summed the unrounded values, 1.0006 -> 1.001, and refused its own defaulted Pod)."""
    pod = {"spec": {"containers": [c("a", {"cpu": "500500u"}), c("b", {"cpu": "500100u"})],
                    "resources": {"limits": {"cpu": "2"}}}}
    out = default_pod(pod)["spec"]
    assert [x["resources"]["requests"]["cpu"] for x in out["containers"]] == ["0.501", "0.501"]
    assert out["resources"]["requests"]["cpu"] == "1.002"
    assert effective_pod_requests(pod)["cpu"] == Decimal("1.002")
    # A template is stored rounded, so its pods sum the rounded values too.
    assert effective_pod_requests(pod["spec"], is_pod=False)["cpu"] == Decimal("1.002")
