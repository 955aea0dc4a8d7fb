"""A small KAI tenancy with Queue status, and the quota gauges it exports (the quota
metrics' tests and the metrics doc test)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from app.audit.quotametrics import QuotaMetrics
from app.cluster.view import StaticView
from tests.conftest import RULES

KRM = "kai.resources/v1alpha1"
KAI = "scheduling.run.ai/v2"


def entry(name: str, pool: str, gpu: tuple[float, float], cpu: tuple[float, float] = (0, -1),
          memory: tuple[float, float] = (0, -1)) -> dict[str, Any]:
    return {"name": name, "nodepool": pool, "resources": {
        r: {"deserved": d, "limit": lim, "overQuotaWeight": 1}
        for r, (d, lim) in (("gpu", gpu), ("cpu", cpu), ("memory", memory))}}


def tenancy() -> list[dict[str, Any]]:
    """Pool rtx, 2 nodes of 4 cards. platform 5 cards (over the pool with research's 4),
    its projects 3 + 3 (over platform's 5). Queue workspace-rtx holds 2.5 cards."""
    return [
        {"apiVersion": KRM, "kind": "NodePool", "metadata": {"name": "rtx"},
         "spec": {"labelKey": "pool", "labelValue": "rtx"}},
        *({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}", "labels": {"pool": "rtx"}},
           "status": {"allocatable": {"nvidia.com/gpu": "4"}}} for i in (1, 2)),
        {"apiVersion": KRM, "kind": "Department", "metadata": {"name": "platform"},
         "spec": {"queues": [entry("platform-rtx", "rtx", (5, 8), cpu=(1500, -1), memory=(64000, -1))]}},
        {"apiVersion": KRM, "kind": "Department", "metadata": {"name": "research"},
         "spec": {"queues": [entry("research-rtx", "rtx", (4, 8))]}},
        {"apiVersion": KRM, "kind": "Project", "metadata": {"name": "workspace"},
         "spec": {"parent": "platform", "queues": [entry("workspace-rtx", "rtx", (3, 4))]}},
        {"apiVersion": KRM, "kind": "Project", "metadata": {"name": "benchmark"},
         "spec": {"parent": "platform", "queues": [entry("benchmark-rtx", "rtx", (3, -1))]}},
        {"apiVersion": KAI, "kind": "Queue", "metadata": {"name": "workspace-rtx"},
         "spec": {"parentQueue": "platform-rtx"},
         "status": {"allocated": {"nvidia.com/gpu": "2500m", "cpu": "1500m", "memory": "2Gi"}}},
        {"apiVersion": KAI, "kind": "Queue", "metadata": {"name": "benchmark-rtx"},
         "spec": {"parentQueue": "platform-rtx"}},
    ]


def exercised_quota_metrics() -> str:
    """The quota gauges with a sample each (tests/test_metrics_doc.py)."""
    registry = CollectorRegistry()
    QuotaMetrics(registry).observe(StaticView(tenancy(), RULES.indexes))
    return generate_latest(registry).decode()
