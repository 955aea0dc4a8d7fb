"""Table-driven tests for the workload envelope rules, over every kind."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.k8s.podspec import POD_SPEC_PATHS
from tests.conftest import container, mutate, resources_of, run, workload

KINDS = [kind for _, kind in POD_SPEC_PATHS]


def applied(obj: dict, patch: list[dict]) -> dict:
    return jsonpatch.apply_patch(obj, patch)


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_limit_becomes_request_in_every_kind(kind: str) -> None:
    obj = workload(kind, [container(limits={"cpu": "7", "memory": "29Gi"})])
    result = run(obj)
    assert result.errors == []
    # limits only => Guaranteed with 7 whole cores: stripping loses exclusive cores
    assert [w.rule for w in result.warnings] == ["cpu-limits"]
    after = applied(obj, result.patch)
    assert resources_of(after) == {"limits": {"memory": "29Gi"}, "requests": {"cpu": "7"}}
    spec_path = "/" + "/".join(POD_SPEC_PATHS[(after["apiVersion"].rpartition("/")[0], kind)])
    assert {"op": "remove", "path": f"{spec_path}/containers/0/resources/limits/cpu"} in result.patch


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # limit and request: the limit goes, the request stays as written
        ({"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}},
         {"limits": {"memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}}),
        # only a CPU limit: requests.cpu written from it; empty limits map kept
        ({"limits": {"cpu": "1500m"}}, {"limits": {}, "requests": {"cpu": "1500m"}}),
        # other limits untouched, whatever they are
        ({"limits": {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "26Gi",
                     "hugepages-2Mi": "1Gi", "nvidia.com/gpu": "1"},
          "requests": {"memory": "8Gi"}},
         {"limits": {"memory": "8Gi", "ephemeral-storage": "26Gi", "hugepages-2Mi": "1Gi",
                     "nvidia.com/gpu": "1"},
          "requests": {"memory": "8Gi", "cpu": "4"}}),
        # only a memory request: limit written equal to it
        ({"requests": {"memory": "2Gi", "cpu": "1"}},
         {"requests": {"memory": "2Gi", "cpu": "1"}, "limits": {"memory": "2Gi"}}),
        # only a memory limit: left alone (Pods default the request from it)
        ({"limits": {"memory": "2Gi"}}, {"limits": {"memory": "2Gi"}}),
        # nothing to do
        ({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1024Mi"}},
         {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1024Mi"}}),
        ({}, {}),
    ],
)
def test_container_envelopes(resources: dict, expected: dict) -> None:
    obj = workload("Deployment", [{"name": "app", "image": "x", "resources": resources}])
    result = run(obj)
    assert [f for f in result.findings if f.severity == "error"] == []
    assert resources_of(applied(obj, result.patch)) == expected
    assert bool(result.patch) == (resources != expected)


def test_init_containers_sidecars_and_pod_level_resources() -> None:
    obj = workload(
        "Pod",
        [container("app", limits={"cpu": "2", "memory": "1Gi"})],
        init=[container("setup", limits={"cpu": "1", "memory": "256Mi"}),
              container("proxy", limits={"cpu": "250m", "memory": "128Mi"},
                        restartPolicy="Always")],
        pod_resources={"limits": {"cpu": "4", "memory": "2Gi"}},
    )
    result = run(obj)
    after = applied(obj, result.patch)
    assert resources_of(after, 0, "initContainers") == {"limits": {"memory": "256Mi"},
                                                        "requests": {"cpu": "1"}}
    assert resources_of(after, 1, "initContainers") == {"limits": {"memory": "128Mi"},
                                                        "requests": {"cpu": "250m"}}
    # The pod-level CPU request is what the API server would have defaulted with the
    # limit in place: the containers' aggregate request, max(2 + 250m sidecar, 1 +
    # 0 sidecars before it) = 2.25 -- not the pod-level limit 4
    # (pkg/apis/core/v1/defaults.go defaultPodRequests; the defaulting oracle).
    assert after["spec"]["resources"] == {"limits": {"memory": "2Gi"}, "requests": {"cpu": "2.250"}}
    assert after["spec"]["initContainers"][1]["restartPolicy"] == "Always"


def test_memory_mismatch_is_denied_with_both_values() -> None:
    obj = workload("Deployment", [container("api", requests={"memory": "1Gi"},
                                            limits={"memory": "2Gi"})])
    result = run(obj)
    [error] = result.errors
    assert error.rule == "memory-request-equals-limit"
    assert 'container "api"' in error.message
    assert "1Gi" in error.message and "2Gi" in error.message
    assert error.path == "spec.template.spec.containers[0].resources.requests.memory"


@pytest.mark.parametrize(("request_", "limit"), [("1Gi", "1024Mi"), ("1G", "1000M"),
                                                 ("1e9", "1G"), ("2048Mi", "2Gi")])
def test_equal_quantities_in_other_notations_pass(request_: str, limit: str) -> None:
    obj = workload("Pod", [container(requests={"memory": request_}, limits={"memory": limit})])
    assert run(obj).errors == []


def test_unparsable_quantity_is_an_error_not_a_crash() -> None:
    obj = workload("Deployment", [container(requests={"memory": "lots"},
                                            limits={"memory": "2Gi"})])
    result = run(obj)
    assert result.internal_errors == []
    assert any("'lots' is not a quantity" in f.message for f in result.errors)


def test_opt_out_on_template_and_on_pod() -> None:
    ann = {"envelope.io/keep-cpu-limit": "true"}
    for obj in (
        workload("Deployment", [container(limits={"cpu": "2", "memory": "1Gi"})],
                 template_annotations=ann),
        workload("Pod", [container(limits={"cpu": "2", "memory": "1Gi"})],
                 template_annotations=ann),
        workload("CronJob", [container(limits={"cpu": "2", "memory": "1Gi"})],
                 template_annotations=ann),
    ):
        assert run(obj).patch == []
    other = workload("Deployment", [container(limits={"cpu": "2"})],
                     template_annotations={"envelope.io/keep-cpu-limit": "false"})
    assert run(other).patch != []


def test_guaranteed_with_whole_cores_warns_about_the_opt_out() -> None:
    obj = workload("Deployment", [container(requests={"cpu": "2", "memory": "4Gi"},
                                            limits={"cpu": "2", "memory": "4Gi"})])
    result = run(obj)
    [warning] = result.warnings
    assert "envelope.io/keep-cpu-limit" in warning.message
    assert "Burstable" in warning.message
    # fractional CPU: no exclusive cores to lose, no warning
    frac = workload("Deployment", [container(requests={"cpu": "1500m", "memory": "4Gi"},
                                             limits={"cpu": "1500m", "memory": "4Gi"})])
    assert run(frac).warnings == []


def test_pod_update_is_not_mutated_and_unchanged_resources_not_rejudged() -> None:
    old = workload("Pod", [container(requests={"memory": "1Gi"},
                                     limits={"cpu": "2", "memory": "2Gi"})])
    new = workload("Pod", [container(requests={"memory": "1Gi"},
                                     limits={"cpu": "2", "memory": "2Gi"})],
                   annotations={"touched": "yes"})
    result = run(new, operation="UPDATE", old=old)
    assert result.patch == []
    assert result.errors == []


def test_deployment_update_is_mutated() -> None:
    old = workload("Deployment", [container(limits={"memory": "1Gi"})])
    new = workload("Deployment", [container(limits={"cpu": "3", "memory": "1Gi"})])
    assert run(new, operation="UPDATE", old=old).patch != []


def test_modes_warn_and_off() -> None:
    obj = workload("Deployment", [container(requests={"memory": "1Gi"},
                                            limits={"cpu": "2", "memory": "2Gi"})])
    warn = Policy(rules={"cpu-limits": Mode.WARN, "memory-request-equals-limit": Mode.WARN})
    result = run(obj, warn)
    assert result.patch == []
    assert result.errors == []
    messages = [w.message for w in result.warnings]
    assert any("not applied (cpu-limits in warn mode)" in m for m in messages)
    assert any("differs from limit" in m for m in messages)
    off = Policy(rules={"cpu-limits": Mode.OFF, "memory-request-equals-limit": Mode.OFF})
    result = run(obj, off)
    assert result.patch == [] and result.findings == []


def test_second_pass_is_a_noop() -> None:
    obj = workload("StatefulSet", [container(limits={"cpu": "7", "memory": "29Gi"},
                                             env=[{"name": "RESOURCE_LIMITS",
                                                   "value": "cpu=7,memory=29Gi"}])])
    first = run(obj)
    again = run(applied(obj, first.patch))
    assert first.patch and again.patch == []


def test_keys_with_slash_are_escaped() -> None:
    obj = workload("Pod", [container(requests={"nvidia.com/gpu": "1", "memory": "1Gi"})])
    result = mutate(obj)
    assert result.patch == [{"op": "add", "path": "/spec/containers/0/resources/limits",
                             "value": {"memory": "1Gi"}}]
    obj2 = workload("Pod", [container(requests={"memory": "1Gi"}, limits={"nvidia.com/gpu": "1"})])
    assert mutate(obj2).patch == [{"op": "add",
                                   "path": "/spec/containers/0/resources/limits/memory",
                                   "value": "1Gi"}]


def test_unsupported_kinds_untouched() -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
           "data": {"limits": "cpu=1"}}
    result = run(obj)
    assert result.patch == [] and result.findings == []


def test_unparsable_cpu_limit_is_reported_where_it_was_written() -> None:
    obj = workload("Deployment", [container(limits={"cpu": "lots", "memory": "1Gi"})])
    result = run(obj)
    assert result.patch == []
    [error] = result.errors
    assert error.path.endswith("limits.cpu") and "'lots' is not a quantity" in error.message


def test_a_crashing_mutation_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from app.cluster.view import StaticView
    from app.core.engine import InternalError, evaluate
    from app.core.ruleset import RuleSet
    from app.rules.workloads import fill_memory_limit
    from tests.conftest import RULES, subject

    def half_then_crash(subject, obj, view, policy):  # type: ignore[no-untyped-def]
        fill_memory_limit(subject, obj, view, policy)
        raise RuntimeError("boom")

    crashing = RuleSet([replace(r, fn=half_then_crash) if r.id == "memory-limit" else r
                        for r in RULES.values()], RULES.copiers, updates=RULES.updates)
    obj = workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"cpu": "2"})])
    result = evaluate(crashing, subject(obj), StaticView(), Policy(), "mutate")
    assert result.patch == [] and result.obj is obj
    assert result.internal_errors == [InternalError("memory-limit", "RuntimeError: boom")]


# --- what stripping changes for the program inside (issue 28, class 7)


def test_pod_level_guaranteed_loses_exclusive_cores_like_a_container_level_one() -> None:
    # ComputePodQOS: with pod-level resources set, they alone decide the QoS class.
    pod_level = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    obj = workload("Deployment", [container(requests={"memory": "4Gi"}, limits={"memory": "4Gi"})],
                   pod_resources=pod_level)
    (found,) = [w for w in run(obj).warnings if w.rule == "cpu-limits"]
    assert "losing exclusive cores" in found.message
    # pod-level limits alone: the requests default to them (Guaranteed) when no container asks
    only_limits = workload("Pod", [container()], pod_resources={"limits": {"cpu": "4", "memory": "4Gi"}})
    assert [w.rule for w in run(only_limits).warnings] == ["cpu-limits"]
    # pod level Burstable decides even when every container is Guaranteed
    burstable = workload("Deployment", [container(requests={"cpu": "2", "memory": "4Gi"},
                                                  limits={"cpu": "2", "memory": "4Gi"})],
                         pod_resources={"requests": {"cpu": "2", "memory": "4Gi"},
                                        "limits": {"cpu": "3", "memory": "4Gi"}})
    assert [w for w in run(burstable).warnings if w.rule == "cpu-limits"] == []
    fractional = workload("Deployment", [container()],
                          pod_resources={"limits": {"cpu": "1500m", "memory": "4Gi"}})
    assert [w for w in run(fractional).warnings if w.rule == "cpu-limits"] == []


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


# --- memory-backed volumes under the memory limit Envelope writes (issue 37 class 11) ---

def _shm(obj: dict[str, Any], size: str | None = "20Gi", medium: str = "Memory") -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] != "Pod" else obj["spec"]
    empty_dir: dict[str, Any] = {"medium": medium}
    if size is not None:
        empty_dir["sizeLimit"] = size
    spec["volumes"] = [{"name": "cache", "emptyDir": {}}, {"name": "dshm", "emptyDir": empty_dir}]
    return obj


def _volume_warnings(result: Any) -> list[tuple[str, str, str]]:
    return [(f.rule, f.path, f.message) for f in result.findings
            if f.severity == "warning" and "sizeLimit" in f.message]


def test_a_memory_volume_larger_than_the_limit_written_from_the_request_is_warned() -> None:
    """vLLM's shape: a 20Gi /dev/shm with a 16Gi memory request and no limit; the limit
    Envelope writes makes the tmpfs 16Gi (the kubelet's calculateEmptyDirMemorySize)."""
    obj = _shm(workload("Deployment", [container("vllm", requests={"memory": "16Gi"})]))
    assert _volume_warnings(run(obj)) == [(
        "memory-limit", "spec.template.spec.volumes[1].emptyDir.sizeLimit",
        'volume "dshm" (emptyDir, medium Memory): sizeLimit 20Gi > pod memory limit 16Gi set '
        "from the requests; the tmpfs holds at most 16Gi: raise the memory request by what "
        "the volume holds, or lower sizeLimit")]
    # the pod's limit is the sum of its containers' and sidecars' (PodLimits): 18Gi
    two = workload("Pod", [container("a", requests={"memory": "8Gi"}),
                           container("b", requests={"memory": "8Gi"})],
                   init=[container("proxy", requests={"memory": "2Gi"}, restartPolicy="Always")])
    assert _volume_warnings(run(_shm(two, "18Gi"))) == []
    [(_, path, message)] = _volume_warnings(run(_shm(two, "19Gi")))
    assert path == "spec.volumes[1].emptyDir.sizeLimit"
    assert "sizeLimit 19Gi > pod memory limit 18Gi" in message


@pytest.mark.parametrize(("containers_", "pod_limit", "size", "medium"), [
    ([container("vllm", requests={"memory": "16Gi"})], None, "16Gi", "Memory"),  # fits exactly
    ([container("vllm", requests={"memory": "16Gi"})], None, None, "Memory"),  # no size asked
    ([container("vllm", requests={"memory": "16Gi"})], None, "20Gi", ""),  # disk-backed
    # a container without a request stays unlimited: no pod limit, no cap
    ([container("vllm", requests={"memory": "16Gi"}), container("side")], None, "20Gi", "Memory"),
    # the pod-level limit decides, and Envelope did not write it
    ([container("vllm", requests={"memory": "16Gi"})], "32Gi", "20Gi", "Memory"),
    # a pod-level limit the user wrote already caps the volume: not Envelope's doing
    ([container("vllm", requests={"memory": "16Gi"})], "16Gi", "20Gi", "Memory"),
])
def test_no_volume_warning(containers_: list[dict[str, Any]], pod_limit: str | None,
                           size: str | None, medium: str) -> None:
    obj = workload("Deployment", containers_,
                   pod_resources={"limits": {"memory": pod_limit}} if pod_limit else None)
    assert _volume_warnings(run(_shm(obj, size, medium))) == []
