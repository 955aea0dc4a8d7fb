"""Class 1 (issue 12): pod-level resources as the API server defaults them."""

from __future__ import annotations

from decimal import Decimal

from app.envelope import move_pod_level_cpu_limit, pod_amount, pod_level_cpu_request_default


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
