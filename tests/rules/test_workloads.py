"""Table-driven tests for the workload envelope rules, over every kind."""

from __future__ import annotations

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
