"""Quota-tree gauges for Prometheus, from the audit's view of the cluster.

The audit Deployment (``envelope audit --serve``, :class:`app.audit.watch.Auditor`) keeps every
NodePool, Department, Project, KAI Queue and Node in its view; after each audit
:meth:`QuotaMetrics.observe` reads the trees from it and the next scrape shows, per
queue, its guarantee, limit and what it holds now (KAI's ``status.allocated``), per pool
its GPU cards and guarantees, and the over-commits of departments and pools.

Units are Prometheus' base units (gpu in cards, cpu in cores, memory in bytes, the
spec's mCPU and MB converted exactly); ``-1`` is unlimited, as in the spec, and an
unlimited guarantee over a finite cap is an over-commit of ``+Inf``. Label values are
names of objects, bounded by the objects; KAI Queues no Department or Project generates
have no pool and are not exported. A queue without a status has no ``allocated`` series
(not evaluated, never zero). The series are rebuilt on every audit, so a deleted
project's series leave with it.

The series, their labels and cardinality: docs/metrics.md.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.crds.kai import (
    KRM_GROUP,
    RESOURCES,
    UNLIMITED,
    ZERO,
    ProjectSpec,
    Resource,
    effective,
    exceeds,
    shortfall,
    total,
)
from app.rules.base import Subject
from app.rules.quotas.objects import After, is_ours, name_of, typed_spec
from app.rules.quotas.tree import Slot, pool_capacity, slots
from app.rules.quotas.usage import EXACT, read_usage

__all__ = ["QUEUE_LABELS", "QuotaMetrics", "Rows", "rows"]

QUEUE_LABELS = ("pool", "department", "project", "resource")
POOL_LABELS = ("pool", "resource")
OVER_LABELS = ("pool", "department", "resource")

_BASE: dict[Resource, Decimal] = {"gpu": Decimal(1), "cpu": Decimal("0.001"),
                                  "memory": Decimal(10) ** 6}
"""From the spec's units (cards, mCPU, MB) to Prometheus' (cards, cores, bytes)."""


def base_units(resource: Resource, value: Decimal) -> float:
    """A spec amount in base units; -1 (unlimited) stays -1."""
    if value == UNLIMITED:
        return -1.0
    return float(value * _BASE[resource])


def _over(resource: Resource, demand: Decimal, cap: Decimal) -> float:
    gap = shortfall(demand, cap)
    if gap == UNLIMITED:
        return float("inf")
    return float(gap * _BASE[resource])


@dataclass
class Rows:
    """One observation: label tuples to values, per gauge."""

    guaranteed: dict[tuple[str, ...], float] = field(default_factory=dict)
    limit: dict[tuple[str, ...], float] = field(default_factory=dict)
    allocated: dict[tuple[str, ...], float] = field(default_factory=dict)
    capacity: dict[tuple[str, ...], float] = field(default_factory=dict)
    pool_guaranteed: dict[tuple[str, ...], float] = field(default_factory=dict)
    overcommit: dict[tuple[str, ...], float] = field(default_factory=dict)

    @property
    def series(self) -> int:
        return sum(len(v) for v in vars(self).values())


_NOBODY = Subject(KRM_GROUP, "v1alpha1", "QuotaMetrics")
"""Whose write :class:`After` sees: nobody's, so the view is read as it is."""


def _ours(view: Any, kind: str) -> list[dict[str, Any]]:
    return [o for o in view.list(kind) if is_ours(kind, o)]


def _queue(view: Any, slot: Slot, department: str, project: str, out: Rows) -> None:
    stored = view.get("Queue", slot.queue)
    used = read_usage(stored.get("status"), "allocated") if is_ours("Queue", stored) else None
    for r in RESOURCES:
        key = (slot.pool, department, project, r)
        out.guaranteed[key] = base_units(r, effective(slot.guarantee(r)))
        out.limit[key] = base_units(r, slot.limit(r))
        if used is not None and r in used:
            with localcontext(EXACT):  # a status quantity may be 1e2000000000: +Inf, no error
                out.allocated[key] = float(used[r] * _BASE[r])


def rows(view: Any) -> Rows:
    """Every gauge's series from a view (a live :class:`~app.cluster.live.Store` or a
    :class:`~app.cluster.view.StaticView`): one pass over the quota objects, linear in
    their number."""
    out = Rows()
    after = After(view, _NOBODY, None)
    department_slots: dict[tuple[str, str], Slot] = {}
    by_pool: dict[str, list[Slot]] = {}
    for obj in _ours(view, "Department"):
        name = name_of(obj)
        for slot in slots("Department", obj) or ():
            department_slots.setdefault((name, slot.pool), slot)
            by_pool.setdefault(slot.pool, []).append(slot)
            _queue(view, slot, name, "", out)
    children: dict[tuple[str, str], list[Slot]] = {}
    for obj in _ours(view, "Project"):
        spec = typed_spec("Project", obj)
        parent = (spec.parent or "") if isinstance(spec, ProjectSpec) else ""
        for slot in slots("Project", obj) or ():
            children.setdefault((parent, slot.pool), []).append(slot)
            _queue(view, slot, parent, name_of(obj), out)
    for (department, pool), found in children.items():
        cap = department_slots.get((department, pool))
        if cap is None:
            continue  # no department queue on the pool: nothing caps them (kai-tree-warnings)
        for r in RESOURCES:
            demand = total(s.guarantee(r) for s in found)
            out.overcommit[(pool, department, r)] = _over(r, demand, cap.guarantee(r)) \
                if exceeds(demand, cap.guarantee(r)) else 0.0
    pools = set(by_pool) | {name_of(p) for p in _ours(view, "NodePool")}
    for pool in sorted(pools):
        on_pool = by_pool.get(pool, [])
        for r in RESOURCES:
            out.pool_guaranteed[(pool, r)] = base_units(r, total(s.guarantee(r) for s in on_pool))
        cards = pool_capacity(after, pool).cards
        out.capacity[(pool, "gpu")] = float(cards)
        demand = total(s.guarantee("gpu") for s in on_pool)
        if cards > ZERO:  # no cards counted is unknown capacity, not an over-commit
            out.overcommit[(pool, "", "gpu")] = _over("gpu", demand, cards) \
                if exceeds(demand, cards) else 0.0
    return out


_GAUGES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("guaranteed", "envelope_quota_guaranteed",
     "A queue's guarantee (deserved): gpu in cards, cpu in cores, memory in bytes; -1 unlimited",
     QUEUE_LABELS),
    ("limit", "envelope_quota_limit",
     "A queue's limit (a limit left out is 0): gpu in cards, cpu in cores, memory in bytes; "
     "-1 unlimited", QUEUE_LABELS),
    ("allocated", "envelope_quota_allocated",
     "What a queue holds now (its KAI Queue's status.allocated); no series when KAI has not "
     "reported it", QUEUE_LABELS),
    ("capacity", "envelope_quota_pool_capacity",
     "GPU cards of a node pool's nodes", POOL_LABELS),
    ("pool_guaranteed", "envelope_quota_pool_guaranteed",
     "Departments' guarantees on a node pool, summed; -1 unlimited", POOL_LABELS),
    ("overcommit", "envelope_quota_overcommit",
     "Guarantees beyond their cap: a department's projects over the department "
     "(department set), a pool's departments over its cards (department empty); 0 fits",
     OVER_LABELS),
)


class QuotaMetrics(Collector):
    """The gauges, served from the last observation (a collector, so a scrape never
    sees half an update and gone objects leave no series)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._rows = Rows()
        self._lock = threading.Lock()
        self.observed = False
        if registry is not None:
            registry.register(self)

    def observe(self, view: Any) -> Rows:
        found = rows(view)
        with self._lock:
            self._rows, self.observed = found, True
        return found

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily(name, text, labels=list(labels))
                for _, name, text, labels in _GAUGES]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            current = self._rows
        for attr, name, text, labels in _GAUGES:
            family = GaugeMetricFamily(name, text, labels=list(labels))
            for key, value in sorted(getattr(current, attr).items()):
                family.add_metric(list(key), value)
            yield family
