"""In-place resize (``pods/resize``, GA 1.35; issue 27 item 2): what the workload rules
do with a resize, against upstream's ValidatePodResize (v1.37.2): a limit the Pod has is
never removed, an added CPU limit is stripped, memory request == limit holds, the QoS
class never changes because of Envelope."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import orjson
import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.k8s.podspec import qos_class
from app.rules.base import Subject
from app.serve.admission import parse_review
from tests.conftest import RULES, container, workload


def pod(*containers: dict[str, Any], pod_resources: dict[str, Any] | None = None,
        qos: str | None = None) -> dict[str, Any]:
    obj = workload("Pod", list(containers), pod_resources=pod_resources)
    obj["spec"]["nodeName"] = "node-1"
    obj["status"] = {"qosClass": qos or qos_class(obj["spec"])}
    return obj


def resize(old: dict[str, Any], new: dict[str, Any]) -> Any:
    subject = Subject("", "v1", "Pod", "UPDATE", "team-a", "web", new, old, subresource="resize")
    return check_object(RULES, subject, StaticView(), Policy())


def after(old: dict[str, Any], change: dict[str, Any], index: int = 0) -> dict[str, Any]:
    new = copy.deepcopy(old)
    new["spec"]["containers"][index]["resources"] = change
    return new


BURSTABLE = container(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "1Gi"})


def test_a_resize_that_adds_a_cpu_limit_is_stripped_and_keeps_the_request() -> None:
    old = pod(BURSTABLE)
    new = after(old, {"requests": {"cpu": "1", "memory": "1Gi"},
                      "limits": {"cpu": "2", "memory": "1Gi"}})
    result = resize(old, new)
    assert result.errors == []
    resized = jsonpatch.apply_patch(new, result.patch)
    assert resized["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    assert qos_class(resized["spec"]) == old["status"]["qosClass"] == "Burstable"


@pytest.mark.parametrize("limit", ["2", "4", "500m"])
def test_a_cpu_limit_the_pod_has_is_never_removed(limit: str) -> None:
    """A Pod created before Envelope (or opted out) keeps its CPU limit through any
    resize: the API server refuses "resource limits cannot be removed"."""
    old = pod(container(requests={"cpu": "500m", "memory": "1Gi"},
                        limits={"cpu": "2", "memory": "1Gi"}))
    new = after(old, {"requests": {"cpu": "500m", "memory": "1Gi"},
                      "limits": {"cpu": limit, "memory": "1Gi"}})
    result = resize(old, new)
    assert result.errors == []
    assert not any("cpu" in op["path"] for op in result.patch)


def test_only_the_added_limit_goes_when_another_container_has_one() -> None:
    old = pod(container("a", requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "2", "memory": "1Gi"}),
              container("b", requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "1Gi"}))
    new = after(old, {"requests": {"cpu": "1", "memory": "1Gi"},
                      "limits": {"cpu": "3", "memory": "1Gi"}}, index=1)
    result = resize(old, new)
    assert result.patch[0] == {"op": "remove", "path": "/spec/containers/1/resources/limits/cpu"}
    assert len([op for op in result.patch if "/cpu" in op["path"]]) == 1


def test_a_resize_that_splits_memory_request_from_limit_is_refused() -> None:
    old = pod(BURSTABLE)
    new = after(old, {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}})
    result = resize(old, new)
    assert [f.rule for f in result.errors] == ["memory-request-equals-limit"]
    assert "1Gi differs from limit 2Gi" in result.errors[0].message


def test_a_resize_that_keeps_memory_equal_passes_unchanged() -> None:
    old = pod(BURSTABLE)
    new = after(old, {"requests": {"cpu": "750m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}})
    result = resize(old, new)
    assert result.errors == [] and result.patch == [] and result.warnings == []


def test_a_memory_limit_is_filled_when_the_qos_class_stays() -> None:
    old = pod(container(requests={"cpu": "500m", "memory": "1Gi"}))
    new = after(old, {"requests": {"cpu": "500m", "memory": "2Gi"}})
    result = resize(old, new)
    resized = jsonpatch.apply_patch(new, result.patch)
    assert resized["spec"]["containers"][0]["resources"]["limits"] == {"memory": "2Gi"}


def test_a_memory_limit_that_would_change_the_qos_class_is_not_filled() -> None:
    """cpu request == limit and a memory request alone: Burstable. A memory limit equal
    to the request would make it Guaranteed, which a resize may not."""
    old = pod(container(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1"}))
    assert old["status"]["qosClass"] == "Burstable"
    new = after(old, {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1"}})
    result = resize(old, new)
    assert result.patch == [] and result.errors == []
    assert [w.rule for w in result.warnings] == ["memory-limit"]
    assert "would become Guaranteed (it is Burstable)" in result.warnings[0].message


def test_a_string_envelope_is_not_rewritten_by_a_resize() -> None:
    """A resize keeps env as stored (dropNonResizeUpdates): nothing to patch or say."""
    env = [{"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=1Gi"}]
    old = pod(container(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "1Gi"}, env=env))
    new = after(old, {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}})
    result = resize(old, new)
    assert result.patch == [] and result.errors == []
    assert not [w for w in result.warnings if w.rule == "env-envelope-cpu"]


def test_an_added_pod_level_cpu_limit_is_stripped() -> None:
    old = pod(container(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "1Gi"}),
              pod_resources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}})
    new = copy.deepcopy(old)
    new["spec"]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {"cpu": "2", "memory": "1Gi"}}
    result = resize(old, new)
    resized = jsonpatch.apply_patch(new, result.patch)
    assert "cpu" not in resized["spec"]["resources"]["limits"]
    assert resized["spec"]["resources"]["requests"]["cpu"] == "1"


def test_a_create_still_strips_what_a_resize_keeps() -> None:
    obj = pod(container(requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "2", "memory": "1Gi"}))
    subject = Subject("", "v1", "Pod", "CREATE", "team-a", "web", obj)
    assert {c.rule for c in check_object(RULES, subject, StaticView(), Policy()).changes} == {"cpu-limits"}


@pytest.mark.parametrize(("spec", "expected"), [
    ({"containers": [{"name": "a"}]}, "BestEffort"),
    ({"containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                 "limits": {"cpu": "1", "memory": "1Gi"}}}]},
     "Guaranteed"),
    ({"containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]}, "Burstable"),
    # one Guaranteed and one BestEffort container: Burstable
    ({"containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                 "limits": {"cpu": "1000m", "memory": "1024Mi"}}},
                     {"name": "b"}]}, "Burstable"),
    # other resources than cpu and memory do not count
    ({"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
     "BestEffort"),
    # pod-level resources decide when set
    ({"containers": [{"name": "a"}], "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "limits": {"cpu": "1", "memory": "1Gi"}}},
     "Guaranteed"),
])
def test_qos_class_is_compute_pod_qos(spec: dict[str, Any], expected: str) -> None:
    assert qos_class(spec) == expected


def test_the_admission_layer_carries_the_subresource() -> None:
    obj = pod(BURSTABLE)
    body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                     "resource": {"group": "", "version": "v1", "resource": "pods"},
                                     "subResource": "resize", "operation": "UPDATE",
                                     "namespace": "team-a", "object": obj, "oldObject": obj}})
    _, subject = parse_review(body)
    assert subject.subresource == "resize"
    _, plain = parse_review(body.replace(b'"subResource":"resize",', b""))
    assert plain.subresource == ""


def test_a_resize_fills_memory_limits_only_where_it_changes_resources() -> None:
    """The oracle's case: a plain init container with a memory request alone, untouched
    by the resize. A limit written there makes the API server refuse the resize on a
    node without InPlacePodVerticalScalingInitContainers."""
    old = pod(container(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "1Gi"}))
    old["spec"]["initContainers"] = [container("setup", requests={"memory": "256Mi"})]
    new = after(old, {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}})
    result = resize(old, new)
    assert result.patch == [] and result.errors == []
    resized = copy.deepcopy(old)
    resized["spec"]["initContainers"][0]["resources"] = {"requests": {"memory": "512Mi"}}
    filled = jsonpatch.apply_patch(resized, resize(old, resized).patch)
    assert filled["spec"]["initContainers"][0]["resources"]["limits"] == {"memory": "512Mi"}
