"""app/k8s/namespace_policy.py: which quotas and LimitRanges need CPU limits (classes 3
and 4). The admission oracle (e2e/test_oracle_admission.py) checks the same
function against the API server."""

from __future__ import annotations

from typing import Any

import pytest

from app.k8s.defaulting import apply_limit_range_defaults
from app.k8s.namespace_policy import (
    cpu_limit_needs,
    is_best_effort,
    limit_range_orders,
    pods_at_once,
    quota_matches_pod,
    quota_scope_text,
)


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"containers": list(containers), **spec}


def c(name: str = "c", **res: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "image": "x", "resources": res}


def quota(name: str, hard: dict[str, str], scopes: list[str] | None = None,
          selector: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard}
    if scopes:
        spec["scopes"] = scopes
    if selector:
        spec["scopeSelector"] = {"matchExpressions": selector}
    return {"metadata": {"name": name}, "spec": spec, "status": {"hard": hard}}


def lr(name: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"limits": list(items)}}


NO_CPU_LIMIT = pod(c(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "1Gi"}))


# ------------------------------------------------------------------- quota scopes


@pytest.mark.parametrize(("scopes", "selector", "spec", "matches"), [
    ([], None, NO_CPU_LIMIT, True),
    (["NotBestEffort"], None, NO_CPU_LIMIT, True),
    (["BestEffort"], None, NO_CPU_LIMIT, False),
    (["BestEffort"], None, pod(c()), True),
    (["Terminating"], None, NO_CPU_LIMIT, False),
    (["Terminating"], None, {**NO_CPU_LIMIT, "activeDeadlineSeconds": 60}, True),
    (["NotTerminating"], None, {**NO_CPU_LIMIT, "activeDeadlineSeconds": 60}, False),
    (["NotTerminating", "NotBestEffort"], None, NO_CPU_LIMIT, True),
    ([], [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}],
     {**NO_CPU_LIMIT, "priorityClassName": "high"}, True),
    ([], [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}], NO_CPU_LIMIT, False),
    ([], [{"scopeName": "PriorityClass", "operator": "NotIn", "values": ["high"]}], NO_CPU_LIMIT, True),
    ([], [{"scopeName": "PriorityClass", "operator": "NotIn", "values": ["high"]}],
     {**NO_CPU_LIMIT, "priorityClassName": "high"}, False),
    ([], [{"scopeName": "PriorityClass", "operator": "Exists"}], NO_CPU_LIMIT, False),
    # Found by the admission oracle: a pod without a class has no "PriorityClass" key.
    ([], [{"scopeName": "PriorityClass", "operator": "DoesNotExist"}], NO_CPU_LIMIT, True),
    ([], [{"scopeName": "PriorityClass", "operator": "DoesNotExist"}],
     {**NO_CPU_LIMIT, "priorityClassName": "low"}, False),
    ([], [{"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"}], NO_CPU_LIMIT, False),
    ([], [{"scopeName": "CrossNamespacePodAffinity", "operator": "Exists"}],
     {**NO_CPU_LIMIT, "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
         {"weight": 1, "podAffinityTerm": {"topologyKey": "k", "namespaceSelector": {}}}]}}}, True),
])
def test_quota_scopes(scopes: list[str], selector: list[dict[str, Any]] | None, spec: dict[str, Any],
                      matches: bool) -> None:
    assert quota_matches_pod(quota("q", {"limits.cpu": "4"}, scopes, selector), spec) is matches


def test_best_effort_uses_pod_level_resources_when_set() -> None:
    assert is_best_effort(pod(c()))
    assert not is_best_effort(pod(c(), resources={"limits": {"memory": "1Gi"}}))
    assert is_best_effort(pod(c(requests={"cpu": "0"})))


def test_scope_text() -> None:
    q = quota("q", {"limits.cpu": "4"}, ["NotBestEffort"],
              [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}])
    assert quota_scope_text(q) == "scopes NotBestEffort, PriorityClass In (high)"


# ---------------------------------------------------------------- the verdict


def test_matching_quota_on_limits_cpu_needs_them_and_says_which() -> None:
    needs = cpu_limit_needs(NO_CPU_LIMIT, [], [quota("compute", {"limits.cpu": "4"}, ["NotBestEffort"])])
    assert [str(n) for n in needs] == [
        'ResourceQuota "compute" (scopes NotBestEffort) sets limits.cpu=4: every container needs a CPU '
        'limit (c has none)']


def test_quota_that_does_not_match_is_ignored() -> None:
    assert cpu_limit_needs(NO_CPU_LIMIT, [], [quota("be", {"pods": "5"}, ["BestEffort"]),
                                              quota("term", {"limits.cpu": "4"}, ["Terminating"])]) == []


def test_pod_level_resources_lift_the_per_container_quota_constraint() -> None:
    spec = {**NO_CPU_LIMIT, "resources": {"requests": {"cpu": "500m"}}}
    assert cpu_limit_needs(spec, [], [quota("compute", {"limits.cpu": "4"})]) == []


def test_limit_range_default_fills_the_limit_unless_it_overshoots() -> None:
    default = lr("defaults", {"type": "Container", "default": {"cpu": "2"}})
    assert cpu_limit_needs(NO_CPU_LIMIT, [default], [quota("compute", {"limits.cpu": "4"})]) == []
    needs = cpu_limit_needs(NO_CPU_LIMIT, [default], [quota("compute", {"limits.cpu": "1"})])
    assert [n.name for n in needs] == ["compute"]
    small = lr("small", {"type": "Container", "default": {"cpu": "100m"}})
    assert "is below container c's CPU request 500m" in str(cpu_limit_needs(NO_CPU_LIMIT, [small], [])[0])


def test_container_max_defaults_the_limit_to_max() -> None:
    """SetDefaults_LimitRangeItem: default from max, so a max alone never refuses."""
    assert cpu_limit_needs(NO_CPU_LIMIT, [lr("m", {"type": "Container", "max": {"cpu": "2"}})], []) == []
    assert apply_limit_range_defaults(NO_CPU_LIMIT, [lr("m", {"type": "Container", "max": {"cpu": "2"}})]
                                      )["containers"][0]["resources"]["limits"]["cpu"] == "2"


def test_ratio_and_pod_type() -> None:
    ratio = lr("ratio", {"type": "Container", "maxLimitRequestRatio": {"cpu": "2"}})
    assert "has no CPU limit" in str(cpu_limit_needs(NO_CPU_LIMIT, [ratio], [])[0])
    pod_max = lr("podmax", {"type": "Pod", "max": {"cpu": "4"}})
    needs = cpu_limit_needs(NO_CPU_LIMIT, [pod_max], [])
    assert [str(n) for n in needs] == ['LimitRange "podmax" type Pod max cpu 4: the pod has no CPU limit']
    # A pod-level CPU limit satisfies a type Pod max.
    assert cpu_limit_needs({**NO_CPU_LIMIT, "resources": {"limits": {"cpu": "2"}}}, [pod_max], []) == []
    pod_min = lr("podmin", {"type": "Pod", "min": {"cpu": "1"}})
    assert "min cpu 1" in str(cpu_limit_needs(NO_CPU_LIMIT, [pod_min], [])[0])


def test_two_limit_ranges_with_defaults_may_apply_in_either_order() -> None:
    """Found by the admission oracle: LimitRanger reads LimitRanges from its informer
    in map order, so either default may win; the verdict merges both."""
    a = lr("a", {"type": "Container", "default": {"cpu": "1"}})
    b = lr("b", {"type": "Container", "max": {"cpu": "4"}, "maxLimitRequestRatio": {"cpu": "2"}})
    orders, complete = limit_range_orders([a, b])
    assert len(orders) == 2 and complete
    needs = cpu_limit_needs(NO_CPU_LIMIT, [a, b], [])
    assert [n.name for n in needs] == ["b"]  # b's own default 4 over request 500m: ratio 8


def test_a_pod_past_limitranger_gets_no_defaults_back() -> None:
    """Pods reach the webhook after LimitRanger's defaults: stripped, a Container max
    is then violated (no limit), and a default below the request no longer matters."""
    m = lr("m", {"type": "Container", "max": {"cpu": "2"}})
    assert cpu_limit_needs(NO_CPU_LIMIT, [m], []) == []
    needs = cpu_limit_needs(NO_CPU_LIMIT, [m], [], limit_range_defaults=False)
    assert [str(n) for n in needs] == [
        'LimitRange "m" type Container max cpu 2: container c has no CPU limit']
    small = lr("small", {"type": "Container", "default": {"cpu": "100m"}})
    assert cpu_limit_needs(NO_CPU_LIMIT, [small], [], limit_range_defaults=False) == []


FAILED = {"type": "Failed", "status": "True"}


@pytest.mark.parametrize(("kind", "obj", "count"), [
    ("Pod", {}, 1),
    ("Pod", {"status": {"phase": "Succeeded"}}, 0),  # pods.go QuotaV1Pod: terminal pods are free
    ("Pod", {"status": {"phase": "Running"}}, 1),
    ("Deployment", {"spec": {}}, 1),
    ("Deployment", {"spec": {"replicas": 7}}, 7),
    ("Deployment", {"spec": {"replicas": "7"}}, 1),  # refused by the API server: the default
    ("StatefulSet", {"spec": {"replicas": -3}}, 0),
    ("ReplicationController", {"spec": {"replicas": 2}}, 2),
    ("ReplicaSet", {"spec": {"replicas": True}}, 1),
    ("ReplicaSet", {"spec": [1]}, 1),
    ("Job", {"spec": {"parallelism": 8, "completions": 3}}, 3),
    ("Job", {"spec": {"parallelism": 8, "completions": 3}, "status": {"succeeded": 2}}, 1),
    ("Job", {"spec": {"parallelism": 2, "completions": 30}, "status": {"succeeded": "x"}}, 2),
    ("Job", {"spec": {"parallelism": "x", "completions": 30}}, 1),
    ("Job", {"spec": {"parallelism": 3, "completions": 1.5}}, 3),
    ("Job", {"spec": {"parallelism": 3, "suspend": True}}, 0),
    ("Job", {"spec": {"parallelism": 3}, "status": {"conditions": [FAILED]}}, 0),
    ("Job", {"spec": {"parallelism": 3}, "status": {"conditions": [{**FAILED, "status": "False"}]}}, 3),
    ("CronJob", {"spec": {"jobTemplate": {"spec": {"parallelism": 4, "completions": 9}}}}, 4),
    ("CronJob", {"spec": {"concurrencyPolicy": "Allow", "jobTemplate": {"spec": {}}}}, 1),
    ("CronJob", {"spec": {"suspend": True, "jobTemplate": {"spec": {"parallelism": 4}}}}, 0),
    ("CronJob", {"spec": {"jobTemplate": "x"}}, 1),
    ("DaemonSet", {"spec": {"replicas": 3}}, 0),
])
def test_pods_at_once_as_the_controllers_run_them(kind: str, obj: dict[str, Any], count: int) -> None:
    assert pods_at_once(kind, obj) == count
