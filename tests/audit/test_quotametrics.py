"""Quota-tree gauges (app/audit/quotametrics.py): values, units, bounded series, the hook in the
audit, and the dashboard row and alert that read them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from app.audit import AuditMetrics
from app.audit.quotametrics import QuotaMetrics, rows
from app.cluster.live import RESOURCES as LIVE_RESOURCES
from app.cluster.live import Store
from app.cluster.view import StaticView
from tests.conftest import RULES

ROOT = Path(__file__).resolve().parents[2]
from tests.helpers.quotametrics import KAI, KRM, entry, exercised_quota_metrics, tenancy  # noqa: E402


def test_values_in_base_units() -> None:
    found = rows(StaticView(tenancy(), RULES.indexes))
    assert found.guaranteed[("rtx", "platform", "", "gpu")] == 5
    assert found.guaranteed[("rtx", "platform", "", "cpu")] == 1.5  # 1500 mCPU in cores
    assert found.guaranteed[("rtx", "platform", "", "memory")] == 64e9  # 64000 MB in bytes
    assert found.limit[("rtx", "research", "", "gpu")] == 8
    assert found.limit[("rtx", "platform", "benchmark", "gpu")] == -1  # unlimited
    assert found.allocated == {("rtx", "platform", "workspace", "gpu"): 2.5,
                               ("rtx", "platform", "workspace", "cpu"): 1.5,
                               ("rtx", "platform", "workspace", "memory"): 2147483648.0}
    # benchmark-rtx has no status: no series (not evaluated), never 0
    assert ("rtx", "platform", "benchmark", "gpu") not in found.allocated
    assert found.capacity == {("rtx", "gpu"): 8.0}
    assert found.pool_guaranteed[("rtx", "gpu")] == 9
    assert found.overcommit[("rtx", "", "gpu")] == 1  # 9 cards on 8
    assert found.overcommit[("rtx", "platform", "gpu")] == 1  # 6 on 5
    assert found.overcommit[("rtx", "platform", "cpu")] == 0


def test_exact_decimals_in_the_sums() -> None:
    objs = tenancy()
    objs[3]["spec"]["queues"] = [entry("platform-rtx", "rtx", (0.3, 8))]
    objs[5]["spec"]["queues"] = [entry("workspace-rtx", "rtx", (0.1, 4))]
    objs[6]["spec"]["queues"] = [entry("benchmark-rtx", "rtx", (0.2, -1))]
    found = rows(StaticView(objs, RULES.indexes))
    assert found.overcommit[("rtx", "platform", "gpu")] == 0  # 0.1 + 0.2 fits 0.3 exactly


def test_unlimited_guarantee_under_a_finite_cap_is_infinite_overcommit() -> None:
    objs = tenancy()
    objs[6]["spec"]["queues"] = [entry("benchmark-rtx", "rtx", (-1, -1))]
    assert rows(StaticView(objs, RULES.indexes)).overcommit[("rtx", "platform", "gpu")] == float("inf")


def test_series_are_rebuilt_and_gone_objects_leave() -> None:
    registry = CollectorRegistry()
    metrics = QuotaMetrics(registry)
    metrics.observe(StaticView(tenancy(), RULES.indexes))
    text = generate_latest(registry).decode()
    assert ('envelope_quota_allocated{department="platform",pool="rtx",project="workspace",'
            'resource="gpu"} 2.5') in text
    assert 'envelope_quota_overcommit{department="",pool="rtx",resource="gpu"} 1.0' in text
    metrics.observe(StaticView([o for o in tenancy() if o["metadata"]["name"] != "workspace"],
                               RULES.indexes))
    assert 'project="workspace"' not in generate_latest(registry).decode()


def test_series_are_bounded_linear_in_queues() -> None:
    """3 resources x 3 gauges per queue, plus the pools and over-commit: the figures in
    docs/metrics.md (1,000 projects on 1 pool under 20 departments)."""
    objs = tenancy()[:3]
    for d in range(20):
        objs.append({"apiVersion": KRM, "kind": "Department", "metadata": {"name": f"d{d}"},
                     "spec": {"queues": [entry(f"d{d}-rtx", "rtx", (0, -1))]}})
    for p in range(1000):
        objs.append({"apiVersion": KRM, "kind": "Project", "metadata": {"name": f"p{p}"},
                     "spec": {"parent": f"d{p % 20}", "queues": [entry(f"p{p}-rtx", "rtx", (0, 1))]}})
        objs.append({"apiVersion": KAI, "kind": "Queue", "metadata": {"name": f"p{p}-rtx"},
                     "spec": {}, "status": {"allocated": {"nvidia.com/gpu": "1"}}})
    found = rows(StaticView(objs, RULES.indexes))
    assert len(found.guaranteed) == len(found.limit) == 1020 * 3
    assert len(found.allocated) == 1000 * 3
    assert len(found.overcommit) == 20 * 3 + 1
    assert found.series == 1020 * 3 * 2 + 3000 + 61 + 1 + 3
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert f"{found.series:,}" in doc


def test_the_audit_metrics_carry_the_gauges() -> None:
    audit = AuditMetrics()
    assert isinstance(audit.quotas, QuotaMetrics)
    store = Store(indexes=RULES.indexes)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in tenancy():
        by_kind.setdefault(obj["kind"], []).append(obj)
    for resource in LIVE_RESOURCES:
        if resource.kind in by_kind:  # trimmed as the audit's view trims them
            store.replace(resource.kind, [t for t in map(resource.trim, by_kind[resource.kind])
                                          if t is not None])
    audit.quotas.observe(store)
    text = generate_latest(audit.registry).decode()
    assert 'envelope_quota_pool_capacity{pool="rtx",resource="gpu"} 8.0' in text
    assert ('envelope_quota_allocated{department="platform",pool="rtx",project="workspace",'
            'resource="gpu"} 2.5') in text


def test_documented_rows() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    exported = set(re.findall(r"^# TYPE (envelope_quota_[a-z_]+) gauge$", exercised_quota_metrics(), re.M))
    assert exported == set(re.findall(r"^\| `(envelope_quota_[a-z_]+)` \|", doc, re.M))
    assert len(exported) == 6


def test_dashboard_row_reads_the_gauges() -> None:
    board = json.loads((ROOT / "charts" / "envelope" / "dashboards" / "envelope.json").read_text())
    rows_ = [p for p in board["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows_] == ["Quota trees (KAI)"]
    start = board["panels"].index(rows_[0])
    exprs = [t["expr"] for p in board["panels"][start + 1:] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\benvelope_quota_[a-z_]+", e)}
    assert used == {"envelope_quota_pool_guaranteed", "envelope_quota_pool_capacity",
                    "envelope_quota_allocated", "envelope_quota_guaranteed", "envelope_quota_limit",
                    "envelope_quota_overcommit"}


def test_a_huge_status_quantity_is_infinite_not_an_error() -> None:
    objs = tenancy()
    objs[7]["status"] = {"allocated": {"nvidia.com/gpu": "1e2000000000", "memory": "junk"}}
    found = rows(StaticView(objs, RULES.indexes))
    assert found.allocated[("rtx", "platform", "workspace", "gpu")] == float("inf")
    assert ("rtx", "platform", "workspace", "memory") not in found.allocated  # not a quantity
