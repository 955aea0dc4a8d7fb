"""The Pod as the API server stores it: decoding's defaults, then LimitRanger's (issue 28,
class 3), in the order of Kubernetes v1.37.2 (plugin/pkg/admission/limitranger/admission.go,
pkg/apis/core/v1/defaults.go, pkg/registry/core/pod/strategy.go PrepareForCreate); and the
template verdict of memory-request-equals-limit agreeing with the verdict on its Pods."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.core.engine import Evaluation
from app.k8s.defaulting import default_pod, limit_range_default
from tests.conftest import container, run, workload

RULE = "memory-request-equals-limit"


def limit_range(name: str, *items: dict[str, Any], namespace: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name, "namespace": namespace},
            "spec": {"limits": [{"type": "Container", **item} for item in items]}}


MISMATCH = limit_range("mem-defaults", {"default": {"memory": "1Gi"}, "defaultRequest": {"memory": "512Mi"}})


def _pod(*containers: dict[str, Any], resources: dict[str, Any] | None = None) -> dict[str, Any]:
    return workload("Pod", list(containers), pod_resources=resources)


def _resources(pod: dict[str, Any], index: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = pod["spec"]["containers"][index]["resources"]
    return out


def _errors(result: Evaluation) -> list[str]:
    return [f.message for f in result.errors if f.rule == RULE]


# ----------------------------------------------------------------- the defaulting order


def test_a_request_from_the_limit_comes_before_limit_rangers_default_request() -> None:
    # Decoding gives request = limit (SetDefaults_Pod) before admission: LimitRanger's
    # defaultRequest never replaces it.
    pod = _pod(container(limits={"memory": "2Gi"}))
    stored = default_pod(pod, [MISMATCH])
    assert _resources(stored)["requests"]["memory"] == "2Gi"
    assert _resources(stored)["limits"]["memory"] == "2Gi"


def test_limit_ranger_fills_only_what_is_not_set() -> None:
    stored = default_pod(_pod(container(requests={"memory": "256Mi"})), [MISMATCH])
    assert _resources(stored) == {"requests": {"memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    stored = default_pod(_pod(container()), [MISMATCH])
    assert _resources(stored) == {"requests": {"memory": "512Mi"}, "limits": {"memory": "1Gi"}}


def test_pod_level_requests_are_aggregated_after_limit_ranger() -> None:
    # v1.37.2 runs pod-level defaulting in PrepareForCreate, after admission: the
    # containers' requests LimitRanger wrote are summed into the pod-level request.
    lr = limit_range("mem", {"default": {"memory": "1Gi"}, "defaultRequest": {"memory": "1Gi"}})
    pod = _pod(container("a"), container("b"), resources={"limits": {"memory": "4Gi"}})
    stored = default_pod(pod, [lr])
    assert stored["spec"]["resources"]["requests"]["memory"] == str(2 * 2**30)
    # without the LimitRange, no container asks for memory: the request is the limit
    assert default_pod(pod)["spec"]["resources"]["requests"]["memory"] == "4Gi"


@pytest.mark.parametrize("zero", ["cpu", "memory"])
def test_a_zero_container_limit_leaves_the_pod_level_limit_unset_from_1_38(zero: str) -> None:
    # kubernetes #141014 (v1.38.0-beta.0 component-helpers omitPartiallySetCPUMemLimits):
    # a container limit of 0 is unset in pod-level limit defaulting; 1.37 summed it. The
    # oracle row on the real servers: e2e/test_oracle_apiserver.py
    # test_a_zero_container_limit_is_unset_in_pod_level_limit_defaulting_since_1_38.
    other = "memory" if zero == "cpu" else "cpu"
    one = {"cpu": "1", "memory": "1Gi"}
    pod = _pod(container("a", requests={"cpu": "250m", "memory": "256Mi"}, limits=dict(one)),
               container("b", limits={zero: "0", other: one[other]}),
               resources={"requests": {"cpu": "500m", "memory": "512Mi"}})
    before = default_pod(pod, minor=37)["spec"]["resources"]["limits"]
    # 1.37: max(pod-level request, the sum with the zero), for both resources
    assert before == ({"cpu": "1", "memory": str(2 * 2**30)} if zero == "cpu"
                      else {"cpu": "2", "memory": str(2**30)})
    after = default_pod(pod, minor=38)["spec"]["resources"]
    assert after["limits"] == {other: before[other]}
    assert after["requests"] == {"cpu": "500m", "memory": "512Mi"}
    # without the zero both minors agree, and the input is left as written
    whole = _pod(container("a", requests={"cpu": "250m"}, limits={"cpu": "1"}),
                 resources={"requests": {"cpu": "500m"}})
    written = copy.deepcopy(whole)
    assert default_pod(whole, minor=38) == default_pod(whole, minor=37)
    assert whole == written


def test_the_first_limit_range_wins_and_a_later_item_of_one_wins_within_it() -> None:
    first = limit_range("a-first", {"default": {"memory": "1Gi"}}, {"default": {"memory": "3Gi"}})
    second = limit_range("b-second", {"default": {"memory": "2Gi"}})
    stored = default_pod(_pod(container()), [first, second])
    assert _resources(stored)["limits"]["memory"] == "3Gi"
    assert limit_range_default([first, second], "limits", "memory") == ("a-first", "3Gi")
    assert limit_range_default([second, first], "limits", "memory") == ("b-second", "2Gi")


@pytest.mark.parametrize(("item", "expected"), [
    ({"default": {"memory": "1Gi"}}, {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}),
    ({"max": {"memory": "2Gi"}}, {"requests": {"memory": "2Gi"}, "limits": {"memory": "2Gi"}}),
    ({"min": {"memory": "128Mi"}}, {"requests": {"memory": "128Mi"}, "limits": {}}),
    ({"type": "Pod", "max": {"memory": "2Gi"}}, None),
])
def test_limit_range_items_are_defaulted_as_the_api_server_stores_them(
        item: dict[str, Any], expected: dict[str, Any] | None) -> None:
    # SetDefaults_LimitRangeItem: default from max, defaultRequest from default, then min;
    # only type Container items default containers.
    lr = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
          "spec": {"limits": [{"type": "Container", **item}]}}
    stored = default_pod(_pod(container()), [lr])
    assert stored["spec"]["containers"][0].get("resources") == expected


# --------------------------------------------------------------------- the rule's verdict


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "Job", "CronJob", "Pod"])
def test_limit_ranger_memory_defaults_that_differ_are_refused_naming_the_limit_range(kind: str) -> None:
    result = run(workload(kind, [container(requests={"cpu": "1"})]), view=StaticView([MISMATCH]))
    (message,) = _errors(result)
    assert 'LimitRange "mem-defaults" defaultRequest.memory' in message
    assert "request 512Mi" in message and "limit 1Gi" in message
    assert "to one value, e.g. 1Gi" in message
    assert ("the Pod is refused" if kind == "Pod" else "FailedCreate") in message


def test_written_memory_passes_and_other_namespaces_limit_ranges_do_not_apply() -> None:
    written = container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})
    assert _errors(run(workload("Deployment", [written]), view=StaticView([MISMATCH]))) == []
    elsewhere = copy.deepcopy(MISMATCH)
    elsewhere["metadata"]["namespace"] = "team-b"
    assert _errors(run(workload("Deployment", [container()]), view=StaticView([elsewhere]))) == []


def test_a_request_without_a_limit_gets_an_equal_limit_before_limit_ranger_sees_it() -> None:
    obj = workload("Deployment", [container(requests={"memory": "256Mi"})])
    assert _errors(run(obj, view=StaticView([MISMATCH]))) == []
    # with memory-limit off, the template keeps a request alone: its Pods get the default limit
    off = Policy(rules={"memory-limit": Mode.OFF})
    (message,) = _errors(run(obj, off, view=StaticView([MISMATCH])))
    assert "memory request 256Mi without a limit" in message
    assert 'limit 1Gi (LimitRange "mem-defaults" default.memory)' in message


def test_a_pod_limit_ranger_already_defaulted_is_attributed_by_its_annotation() -> None:
    # What the Pod webhook receives: LimitRanger's values in place, and its annotation.
    pod = _pod(container(requests={"memory": "512Mi"}, limits={"memory": "1Gi"}))
    pod["metadata"]["annotations"] = {
        "kubernetes.io/limit-ranger":
            "LimitRanger plugin set: memory request for container app; memory limit for container app"}
    (message,) = _errors(run(pod, view=StaticView([MISMATCH])))
    assert "no memory request or limit" in message and 'LimitRange "mem-defaults"' in message
    del pod["metadata"]["annotations"]
    (message,) = _errors(run(pod, view=StaticView([MISMATCH])))
    assert "memory request 512Mi differs from limit 1Gi" in message


# ------------------------------------------- a template verdict and its Pods' verdicts


def _pod_from(template_owner: dict[str, Any]) -> dict[str, Any]:
    """GetPodFromTemplate: the Pod a controller makes (template metadata and spec), then
    what the API server does before Envelope's Pod webhook: decoding's defaults and
    LimitRanger's (the same namespace's LimitRanges)."""
    template = template_owner["spec"]["template"]
    meta = copy.deepcopy(template.get("metadata") or {})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "team-a", **meta},
            "spec": copy.deepcopy(template["spec"])}


_MEMORY = st.sampled_from([None, "256Mi", "512Mi", "1Gi"])


@settings(max_examples=150, deadline=None)
@given(request=_MEMORY, limit=_MEMORY, default=_MEMORY, default_request=_MEMORY,
       memory_limit_on=st.booleans())
def test_the_template_verdict_is_the_verdict_on_its_pods(request: str | None, limit: str | None,
                                                         default: str | None,
                                                         default_request: str | None,
                                                         memory_limit_on: bool) -> None:
    item: dict[str, Any] = {}
    if default:
        item["default"] = {"memory": default}
    if default_request:
        item["defaultRequest"] = {"memory": default_request}
    view = StaticView([limit_range("lr", item)])
    policy = Policy(rules={} if memory_limit_on else {"memory-limit": Mode.OFF})
    requests = {"memory": request} if request else None
    limits = {"memory": limit} if limit else None
    template = workload("Deployment", [container(requests=requests, limits=limits)])
    judged = run(template, policy, view=view)
    stored_template = judged.obj or template
    pod = default_pod(_pod_from(stored_template), [limit_range("lr", item)])
    on_pod = run(pod, policy, view=view)
    assert bool(_errors(judged)) == bool(_errors(on_pod)), (_errors(judged), _errors(on_pod))


def test_limit_ranger_pod_writes_defaults_and_its_annotation() -> None:
    """mergePodResourceRequirements (plugin/pkg/admission/limitranger/admission.go at
    v1.37.2): requests before limits, names sorted, containers before init containers,
    a later LimitRange's annotation replacing an earlier one's; the input untouched."""
    from app.k8s.defaulting import LIMIT_RANGER_ANNOTATION, limit_ranger_pod

    lr = {"metadata": {"name": "a"}, "spec": {"limits": [{"type": "Container", "default": {
        "memory": "512Mi", "cpu": "1"}, "defaultRequest": {"memory": "256Mi"}}]}}
    pod = {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "app", "resources": {"requests": {"memory": "1Gi"}}}],
        "initContainers": [{"name": "init"}]}}
    out = limit_ranger_pod(pod, [lr])
    # defaultRequest.cpu comes from default.cpu (the LimitRange's own defaulting)
    assert out["spec"]["containers"][0]["resources"] == {
        "requests": {"memory": "1Gi", "cpu": "1"}, "limits": {"memory": "512Mi", "cpu": "1"}}
    assert out["spec"]["initContainers"][0]["resources"] == {
        "limits": {"memory": "512Mi", "cpu": "1"}, "requests": {"memory": "256Mi", "cpu": "1"}}
    assert out["metadata"]["annotations"][LIMIT_RANGER_ANNOTATION] == (
        "LimitRanger plugin set: cpu request for container app; cpu, memory limit for "
        "container app; cpu, memory request for init container init; cpu, memory limit for "
        "init container init")
    assert pod == {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "app", "resources": {"requests": {"memory": "1Gi"}}}],
        "initContainers": [{"name": "init"}]}}
    assert limit_ranger_pod(pod, [{"spec": {"limits": [{"type": "Pod", "max": {"cpu": "2"}}]}}]) == pod


@given(st.from_regex(r"\A[0-9]{1,30}(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?\Z")
       | st.from_regex(r"\A[+-]?[0-9]{0,6}(\.[0-9]{0,6})?([eE][+-]?[0-9]{1,2}|m|k|Mi|Gi|u|n)?\Z"))
def test_whole_millis_are_left_as_written_by_both_paths(text: str) -> None:
    """``_round_up_milli``'s shortcut (no Decimal for digits with a suffix of 1m or
    more) answers what the Decimal path answers for every string."""
    from app.k8s import defaulting

    shortcut = defaulting._round_up_milli(text)
    real = defaulting._WHOLE_MILLIS
    try:
        defaulting._WHOLE_MILLIS = re.compile(r"(?!)")  # matches nothing: the Decimal path
        assert defaulting._round_up_milli(text) == shortcut
    finally:
        defaulting._WHOLE_MILLIS = real
