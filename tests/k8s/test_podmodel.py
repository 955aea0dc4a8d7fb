"""app/k8s/podmodel.py: the Pods a workload's controller and the API server make of its
template (checked against the real ones by e2e/test_oracle_podconstruction.py)."""

from __future__ import annotations

from typing import Any

import pytest

from app.k8s.podmodel import DAEMON_TOLERATIONS, concurrent, daemon_nodes, merge_tolerations, pod_of


def _template(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w", "annotations": {"on-workload": "x"}},
            "spec": {"template": {"metadata": meta, "spec": spec}}}


def _c(**resources: Any) -> dict[str, Any]:
    return {"name": "c", "image": "i", "resources": resources}


def test_only_the_template_metadata_reaches_the_pods() -> None:
    got = pod_of("Deployment", "apps", _template({"containers": [_c()]}, labels={"a": "b"},
                                                 annotations={"t": "1"}))
    assert got.pod is not None
    assert got.pod["metadata"] == {"labels": {"a": "b"}, "annotations": {"t": "1"}}


def test_default_toleration_seconds_adds_both_unless_tolerated() -> None:
    got = pod_of("Deployment", "apps", _template({"containers": [_c()]}))
    assert got.pod is not None
    assert got.pod["spec"]["tolerations"] == [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300}]
    everything = pod_of("Deployment", "apps", _template({"containers": [_c()],
                                                         "tolerations": [{"operator": "Exists"}]}))
    assert everything.pod is not None
    assert everything.pod["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_daemonset_pods_get_the_controllers_tolerations_and_no_default_seconds() -> None:
    got = pod_of("DaemonSet", "apps", _template({"containers": [_c()], "hostNetwork": True}))
    assert got.pod is not None
    keys = [t["key"] for t in got.pod["spec"]["tolerations"]]
    assert keys == [t["key"] for t in DAEMON_TOLERATIONS] + ["node.kubernetes.io/network-unavailable"]
    assert all("tolerationSeconds" not in t for t in got.pod["spec"]["tolerations"])


def test_limit_ranger_defaults_after_the_api_servers_own() -> None:
    lr = {"spec": {"limits": [{"type": "Container", "default": {"memory": "512Mi"},
                               "defaultRequest": {"memory": "256Mi"}}]}}
    only_limit = pod_of("Deployment", "apps", _template({"containers": [_c(limits={"memory": "1Gi"})]}),
                        limit_ranges=[lr])
    assert only_limit.pod is not None
    # request = limit by defaulting first: LimitRanger's defaultRequest never applies
    assert only_limit.pod["spec"]["containers"][0]["resources"] == {
        "limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}
    nothing = pod_of("Deployment", "apps", _template({"containers": [_c()]}), limit_ranges=[lr])
    assert nothing.pod is not None
    assert nothing.pod["spec"]["containers"][0]["resources"] == {
        "limits": {"memory": "512Mi"}, "requests": {"memory": "256Mi"}}


RC = {"metadata": {"name": "kata"}, "handler": "kata",
      "overhead": {"podFixed": {"cpu": "250m", "memory": "128Mi"}},
      "scheduling": {"nodeSelector": {"pool": "vm"},
                     "tolerations": [{"key": "vm", "operator": "Exists"}]}}


def test_runtime_class_adds_overhead_node_selector_and_tolerations() -> None:
    got = pod_of("Job", "batch", _template({"containers": [_c()], "runtimeClassName": "kata",
                                            "nodeSelector": {"zone": "a"}}),
                 runtime_classes={"kata": RC})
    assert got.pod is not None
    spec = got.pod["spec"]
    assert spec["overhead"] == {"cpu": "250m", "memory": "128Mi"}
    assert spec["nodeSelector"] == {"zone": "a", "pool": "vm"}
    assert {"key": "vm", "operator": "Exists"} in spec["tolerations"]


def test_runtime_class_conflicts_and_absence_refuse_the_pods() -> None:
    conflict = pod_of("Job", "batch", _template({"containers": [_c()], "runtimeClassName": "kata",
                                                 "nodeSelector": {"pool": "metal"}}),
                      runtime_classes={"kata": RC})
    assert conflict.pod is None and conflict.refused is not None and "pool" in conflict.refused
    missing = pod_of("Job", "batch", _template({"containers": [_c()], "runtimeClassName": "nope"}),
                     runtime_classes={})
    assert missing.pod is None and missing.refused is not None and "does not exist" in missing.refused


def test_merge_tolerations_drops_what_another_covers() -> None:
    assert merge_tolerations([{"key": "a", "operator": "Equal", "value": "1"}],
                             [{"key": "a", "operator": "Exists"}]) == [{"key": "a", "operator": "Exists"}]
    assert merge_tolerations([{"key": "a", "operator": "Exists"}],
                             [{"key": "a", "operator": "Exists"}]) == [{"key": "a", "operator": "Exists"}]
    timed = {"key": "n", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    forever = {"key": "n", "operator": "Exists", "effect": "NoExecute"}
    assert merge_tolerations([timed], [forever]) == [forever]


@pytest.mark.parametrize(("kind", "spec", "want"), [
    ("Deployment", {}, 1),
    ("Deployment", {"replicas": 3}, 3),
    ("StatefulSet", {"replicas": "3"}, 1),  # a wrong type: the API server refuses it; no crash
    ("Job", {"parallelism": 4, "completions": 2}, 2),
    ("Job", {"parallelism": 4}, 4),
    ("Job", {"parallelism": 4, "suspend": True}, 0),
    ("Job", {"parallelism": 2.5}, 1),
    ("CronJob", {}, None),
])
def test_pods_at_once(kind: str, spec: dict[str, Any], want: int | None) -> None:
    assert concurrent(kind, {"spec": spec}) == want


def _node(name: str, taints: list[dict[str, str]] | None = None, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints or [], "unschedulable": name == "cordoned"},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}


def test_daemonset_nodes_follow_selection_and_taints_but_not_cordons() -> None:
    nodes = [_node("plain", pool="a"), _node("cordoned", pool="a"),
             _node("gpu", [{"key": "gpu", "effect": "NoSchedule"}], pool="a"), _node("other", pool="b")]
    ds = _template({"containers": [_c()], "nodeSelector": {"pool": "a"}})
    assert daemon_nodes(ds, nodes) == ["plain", "cordoned"]
    assert concurrent("DaemonSet", ds, nodes) == 2
    tolerant = _template({"containers": [_c()], "tolerations": [{"key": "gpu", "operator": "Exists"}]})
    assert daemon_nodes(tolerant, nodes) == ["plain", "cordoned", "gpu", "other"]
    assert concurrent("DaemonSet", _template({"containers": [_c()], "nodeSelector": {"pool": "z"}}),
                      nodes) == 0
