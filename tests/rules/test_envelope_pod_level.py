"""Class 1 (issue 12): pod-level resources as the API server defaults them."""

from __future__ import annotations

from decimal import Decimal

from app.k8s.defaulting import default_pod
from app.rules.envelope import move_pod_level_cpu_limit, pod_amount, pod_level_cpu_request_default
from tests.conftest import container, run, workload


def spec(pod_limits: dict[str, str], *requests: dict[str, str]) -> dict:
    return {"containers": [{"name": f"c{i}", "image": "x", "resources": {"requests": r}}
                           for i, r in enumerate(requests)],
            "resources": {"limits": pod_limits}}


def test_pod_request_is_the_container_aggregate_not_the_pod_limit() -> None:
    s = spec({"cpu": "8", "memory": "4Gi"}, {"cpu": "250m", "memory": "1Gi"}, {"cpu": "250m"})
    assert pod_amount(s, "cpu") == Decimal("0.5")
    assert pod_amount(s, "memory") == Decimal(2**30)
    assert pod_amount(s, "cpu", "limits") == Decimal(8)


def test_pod_request_defaults_to_the_pod_limit_when_no_container_asks() -> None:
    s = spec({"cpu": "8"}, {"memory": "1Gi"})
    assert pod_amount(s, "cpu") == Decimal(8)
    assert pod_level_cpu_request_default(s) == "8"


def test_stripping_the_pod_level_cpu_limit_writes_the_defaulted_request() -> None:
    s = spec({"cpu": "8", "memory": "4Gi"}, {"cpu": "250m"}, {"cpu": "250m"})
    assert move_pod_level_cpu_limit(s) == ("8", "0.500")
    assert s["resources"] == {"limits": {"memory": "4Gi"}, "requests": {"cpu": "0.500"}}
    assert move_pod_level_cpu_limit(s) is None
    kept = {"containers": [], "resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}}}
    assert move_pod_level_cpu_limit(kept) == ("2", None)
    assert kept["resources"] == {"limits": {}, "requests": {"cpu": "1"}}


# --- the memory rule judges a template as the API server will default its Pods ----------

def _template(pod_resources: dict) -> dict:
    return workload("Deployment", [container("a", {"memory": "128Mi"}, {"memory": "128Mi"}),
                                   container("b", {"memory": "128Mi"}, {"memory": "128Mi"})],
                    pod_resources=pod_resources)


def _pod_from(template: dict) -> dict:
    """The Pod the ReplicaSet controller asks for, as the API server stores it."""
    spec = template["spec"]["template"]["spec"]
    return default_pod({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "web-x", "namespace": "team-a"}, "spec": spec})


def test_template_whose_pods_would_be_refused_is_refused_itself() -> None:
    """The FailedCreate case: a pod-level memory limit and smaller container requests.
    The Pod gets pod-level requests.memory = 256Mi (the containers' sum), which
    memory-request-equals-limit denies; the template is now denied for it, up front."""
    template = _template({"limits": {"memory": "4Gi"}})
    pod = _pod_from(template)
    assert pod["spec"]["resources"]["requests"]["memory"] == "268435456"
    pod_errors = run(pod).errors
    assert [e.rule for e in pod_errors] == ["memory-request-equals-limit"]
    assert "memory request 268435456 differs from limit 4Gi" in pod_errors[0].message
    (err,) = run(template).errors
    assert err.rule == "memory-request-equals-limit"
    assert err.path == "spec.template.spec.resources.requests.memory"
    assert "summed memory request 256Mi" in err.message
    assert "set spec.template.spec.resources.requests.memory: 4Gi" in err.message


def test_the_fix_the_message_names_passes_for_template_and_pod() -> None:
    template = _template({"limits": {"memory": "4Gi"}, "requests": {"memory": "4Gi"}})
    assert run(template).errors == []
    assert run(_pod_from(template)).errors == []


def test_template_whose_containers_sum_to_the_pod_limit_passes() -> None:
    template = _template({"limits": {"memory": "256Mi"}})
    assert run(template).errors == []
    assert run(_pod_from(template)).errors == []


def test_written_pod_level_request_keeps_the_plain_message() -> None:
    (err,) = run(_template({"limits": {"memory": "4Gi"}, "requests": {"memory": "1Gi"}})).errors
    assert "memory request 1Gi differs from limit 4Gi" in err.message
