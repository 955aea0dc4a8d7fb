"""downward-cpu-limit (app/rules/workloads/cpu.py): a program that read its CPU limit through
the downward API is warned, with both numbers and the fix, once the limit is stripped."""

from __future__ import annotations

from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from tests.conftest import container, run, workload


def _reader(env_name: str = "GOMAXPROCS", **ref: str) -> dict[str, Any]:
    return {"name": env_name, "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", **ref}}}


def _downward(result: Any) -> list[Any]:
    return [w for w in result.warnings if w.rule == "downward-cpu-limit"]


def test_a_container_reading_its_cpu_limit_is_warned_with_both_numbers_and_the_fix() -> None:
    obj = workload("Deployment", [container(limits={"cpu": "2", "memory": "1Gi"}, env=[_reader()])])
    (found,) = _downward(run(obj))
    assert found.path == "spec.template.spec.containers[0].env[0].valueFrom.resourceFieldRef"
    assert found.message == ('container "app" env GOMAXPROCS reads limits.cpu of "app" = 2; '
                             "stripped, it reads the node's allocatable CPU: use requests.cpu (2)")


@pytest.mark.parametrize(("limit", "request_", "divisor", "before", "after"), [
    ("1500m", None, None, "2", "2"),  # the ceiling, as convertResourceCPUToString
    ("750m", "500m", "1m", "750 (divisor '1m')", "500"),
    ("3", "1", "0", "3", "1"),  # a zero divisor is 1
])
def test_another_container_s_limit_through_container_name_and_divisor(
        limit: str, request_: str | None, divisor: str | None, before: str, after: str) -> None:
    ref = {"containerName": "side", **({"divisor": divisor} if divisor else {})}
    side = container("side", requests={"cpu": request_} if request_ else None,
                     limits={"cpu": limit, "memory": "1Gi"})
    obj = workload("Deployment", [container(env=[_reader("WORKERS", **ref)]), side])
    (found,) = _downward(run(obj))
    assert f'env WORKERS reads limits.cpu of "side" = {before};' in found.message
    assert found.message.endswith(f"use requests.cpu ({after})")


def test_downward_api_volumes_and_projected_volumes_are_read_too() -> None:
    obj = workload("Deployment", [container(limits={"cpu": "4", "memory": "1Gi"})])
    item = {"path": "cpu_limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}}
    obj["spec"]["template"]["spec"]["volumes"] = [
        {"name": "podinfo", "downwardAPI": {"items": [item]}},
        {"name": "all", "projected": {"sources": [{"configMap": {"name": "x"}},
                                                  {"downwardAPI": {"items": [item]}}]}}]
    assert [w.path for w in _downward(run(obj))] == [
        "spec.template.spec.volumes[0].downwardAPI.items[0].resourceFieldRef",
        "spec.template.spec.volumes[1].projected.sources[1].downwardAPI.items[0].resourceFieldRef"]


def test_a_pod_level_cpu_limit_a_container_read_is_warned_about_when_stripped() -> None:
    # No container limit: the kubelet gives the pod-level CPU limit (defaultPodLimitsForDownwardAPI).
    obj = workload("Pod", [container(env=[_reader()])],
                   pod_resources={"limits": {"cpu": "4", "memory": "1Gi"}})
    (found,) = _downward(run(obj))
    assert 'reads limits.cpu of "app" = 4; stripped' in found.message


def test_a_limit_range_default_limit_is_what_the_stripped_container_reads() -> None:
    # LimitRanger gives the Pods max.cpu as their default limit (SetDefaults_LimitRangeItem)
    lr = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr", "namespace": "team-a"},
          "spec": {"limits": [{"type": "Container", "max": {"cpu": "8"}}]}}
    reading = [container(limits={"cpu": "2", "memory": "1Gi"}, env=[_reader()])]
    (found,) = _downward(run(workload("Deployment", reading), view=StaticView([lr])))
    assert "= 2; stripped, it reads the LimitRange default 8: use requests.cpu (2)" in found.message
    same = [container(limits={"cpu": "8", "memory": "1Gi"}, env=[_reader()])]
    assert _downward(run(workload("Deployment", same), view=StaticView([lr]))) == []


def test_no_downward_warning_when_the_limit_stays() -> None:
    reading = [container(limits={"cpu": "2", "memory": "1Gi"}, env=[_reader()])]
    opted = workload("Deployment", reading, template_annotations={"envelope.io/keep-cpu-limit": "true"})
    assert _downward(run(opted)) == []
    assert _downward(run(workload("Deployment", reading), Policy(rules={"cpu-limits": Mode.WARN}))) == []
    assert _downward(run(workload("Deployment", reading), Policy(rules={"cpu-limits": Mode.OFF}))) == []
    # a namespace guard keeps the limit (a quota on limits.cpu): nothing is stripped
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team-a"},
             "spec": {"hard": {"limits.cpu": "10"}}}
    assert _downward(run(workload("Deployment", reading), view=StaticView([quota]))) == []
    # requests.cpu is kept, so reading it is the fix
    fixed = [container(limits={"cpu": "2", "memory": "1Gi"},
                       env=[{"name": "GOMAXPROCS",
                             "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}}])]
    assert _downward(run(workload("Deployment", fixed))) == []
