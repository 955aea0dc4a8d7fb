"""Trees that do not add up: children's guarantees above their parent's (on a create or
a raise), a parent cut below what its children hold, departments promising more cards
than a pool has."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.crds.kai import (
    DEFAULT_POOL,
    RESOURCES,
    KaiQueueSpec,
    NodePoolSpec,
    ProjectSpec,
    Resource,
    describe,
    effective,
    exceeds,
    grew,
    total,
)
from app.k8s.util import brief
from app.rules.base import Finding, Subject, warning
from app.rules.quotas.messages import excess, holders_text, names_list, plural, quota_error
from app.rules.quotas.objects import POOL, PROJECT_PARENT, QUEUE_PARENT, After, typed_spec
from app.rules.quotas.tree import (
    Slot,
    all_slots,
    by_pool,
    first_slot,
    old_slots,
    pool_capacity,
    pool_exists,
    slots,
)


def raised(prev: Slot | None, slot: Slot, resource: Resource) -> bool:
    """This write adds guarantee on the slot (a new slot adds all it has)."""
    mine = slot.guarantee(resource)
    if effective(mine) == 0:
        return False
    return prev is None or grew(prev.guarantee(resource), mine)


def overflow(children: list[Slot], parent: Slot, r: Resource) -> tuple[Decimal, Decimal] | None:
    """(children's summed guarantee, parent's) when the children do not fit, else None:
    the one comparison behind rules 1 and 8 for departments and KAI queues alike."""
    demand, cap = total(s.guarantee(r) for s in children), parent.guarantee(r)
    return (demand, cap) if exceeds(demand, cap) else None


def project_sum(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    spec = typed_spec("Project", obj)
    mine = slots("Project", obj)
    if not isinstance(spec, ProjectSpec) or mine is None or not spec.parent:
        return []
    department = by_pool(slots("Department", after.get("Department", spec.parent)))
    old = typed_spec("Project", subject.old) if subject.operation == "UPDATE" else None
    before = by_pool(old_slots(subject)) if old is not None and old.parent == spec.parent else {}
    siblings: list[Slot] | None = None
    findings = []
    for slot in mine:
        cap_slot = department.get(slot.pool)
        for r in RESOURCES:
            if cap_slot is None or not raised(before.get(slot.pool), slot, r):
                continue
            if siblings is None:
                siblings = all_slots("Project", after.by_index(PROJECT_PARENT, spec.parent))
            on_pool = [s for s in siblings if s.pool == slot.pool]
            over = overflow(on_pool, cap_slot, r)
            if over:
                demand, cap = over
                findings.append(quota_error(slot.field_path(r, "deserved"),
                    f"{cap_slot.where}: projects are guaranteed {describe(r, demand)} in total but "
                    f"the department has {describe(r, cap)} - {excess(r, demand, cap)}. This write "
                    f"gives {slot.queue} {describe(r, slot.guarantee(r))}: first lower another "
                    f"project's {r} deserved on this pool, or raise department {spec.parent}'s, "
                    f"in a separate write"))
    return findings


def queue_sum(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    spec = typed_spec("Queue", obj)
    mine = slots("Queue", obj)
    if not isinstance(spec, KaiQueueSpec) or not mine or not spec.parent_queue:
        return []
    parent = slots("Queue", after.get("Queue", spec.parent_queue))
    if not parent:
        return []
    old = typed_spec("Queue", subject.old) if subject.operation == "UPDATE" else None
    same_parent = isinstance(old, KaiQueueSpec) and old.parent_queue == spec.parent_queue
    prev = first_slot(old_slots(subject)) if same_parent else None
    slot, cap_slot = mine[0], parent[0]
    findings = []
    for r in RESOURCES:
        if not raised(prev, slot, r):
            continue
        children = all_slots("Queue", after.by_index(QUEUE_PARENT, spec.parent_queue))
        over = overflow(children, cap_slot, r)
        if over:
            demand, cap = over
            findings.append(quota_error(slot.field_path(r, "quota"),
                f"{cap_slot.queue}: child queues are guaranteed {describe(r, demand)} in total but "
                f"the parent queue has {describe(r, cap)} - {excess(r, demand, cap)}. This write "
                f"gives {slot.queue} {describe(r, slot.guarantee(r))}: first lower a sibling's "
                f"{r} quota or raise {cap_slot.queue}'s, in a separate write"))
    return findings


def lowered(prev: Slot | None, slot: Slot, resource: Resource) -> bool:
    """This write lowers the cap (a queue that did not exist capped nothing before)."""
    return prev is None or grew(slot.guarantee(resource), prev.guarantee(resource))


def department_shrink(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    mine = slots("Department", obj)
    if mine is None:
        return []
    before = by_pool(old_slots(subject))
    children = all_slots("Project", after.by_index(PROJECT_PARENT, after.name))
    findings = []
    for slot in mine:
        on_pool = [s for s in children if s.pool == slot.pool]
        for r in RESOURCES:
            if not on_pool or not lowered(before.get(slot.pool), slot, r):
                continue
            over = overflow(on_pool, slot, r)
            if over:
                demand, cap = over
                findings.append(quota_error(slot.field_path(r, "deserved"),
                    f"{slot.where}: projects already hold {describe(r, demand)} of guarantees but "
                    f"the department would have {describe(r, cap)} - {excess(r, demand, cap)}. "
                    f"Lower the projects first ({holders_text(r, on_pool)}), then the department"))
    kept = {s.pool for s in mine}
    for pool, prev in before.items():
        orphans = sorted({s.owner for s in children if s.pool == pool})
        if pool not in kept and orphans:
            findings.append(quota_error("spec.queues",
                f"{prev.where}: projects {names_list(orphans)} still have queues on pool {pool}; "
                f"without the department's queue they become roots no department caps. Move or "
                f"remove those project queues first, then drop this one"))
    return findings


def queue_shrink(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    mine = slots("Queue", obj)
    prev = first_slot(old_slots(subject))
    if not mine:
        return []
    slot = mine[0]
    children = all_slots("Queue", after.by_index(QUEUE_PARENT, after.name))
    findings = []
    for r in RESOURCES:
        if not children or not lowered(prev, slot, r):
            continue
        over = overflow(children, slot, r)
        if over:
            demand, cap = over
            findings.append(quota_error(slot.field_path(r, "quota"),
                f"{slot.queue}: child queues already hold {describe(r, demand)} of quota but the "
                f"queue would have {describe(r, cap)} - {excess(r, demand, cap)}. Lower the "
                f"children first ({holders_text(r, children)}), then this queue"))
    return findings


def pool_demand(after: After, pool: str) -> Decimal:
    on_pool = [s for s in all_slots("Department", after.by_index(POOL["Department"], pool))
               if s.pool == pool]
    return total(s.guarantee("gpu") for s in on_pool)


def department_fit(after: After, slot: Slot) -> list[Finding]:
    path = slot.field_path("gpu", "deserved")
    demand = pool_demand(after, slot.pool)
    capacity = pool_capacity(after, slot.pool)
    if capacity.cards == 0:
        return [warning(path, brief(
            f"{slot.where}: the pool has no GPU nodes in view, so its {describe('gpu', demand)} "
            f"of guarantees cannot be checked"))]
    if not exceeds(demand, capacity.cards):
        return []
    return [quota_error(path,
        f"{slot.where}: departments are guaranteed {describe('gpu', demand)} in total (this one "
        f"{describe('gpu', slot.guarantee('gpu'))}) but the pool's {plural(capacity.nodes, 'node')} have "
        f"{describe('gpu', capacity.cards)} - {excess('gpu', demand, capacity.cards)}. Lower a "
        f"department's gpu deserved on this pool first, or add nodes to the pool")]


def department_capacity(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    before = by_pool(old_slots(subject))
    findings = []
    for slot in slots("Department", obj) or []:
        if raised(before.get(slot.pool), slot, "gpu") and pool_exists(after, slot.pool):
            findings.extend(department_fit(after, slot))
    return findings


def nodepool_capacity(obj: dict[str, Any], after: After) -> list[Finding]:
    """A new labelled pool takes its nodes out of the default pool. (Departments cannot
    hold queues on a pool before it exists: KRM refuses an unknown pool.)"""
    spec = typed_spec("NodePool", obj)
    if not isinstance(spec, NodePoolSpec) or not spec.label_key or after.name == DEFAULT_POOL:
        return []
    demand = pool_demand(after, DEFAULT_POOL)
    if effective(demand) == 0:
        return []
    remaining = pool_capacity(after, DEFAULT_POOL)
    if not exceeds(demand, remaining.cards):
        return []
    moved = pool_capacity(after, after.name)
    return [quota_error("spec.labelKey",
        f"node pool {after.name} takes {plural(moved.nodes, 'node')} ({describe('gpu', moved.cards)}) "
        f"out of pool {DEFAULT_POOL}, where departments are guaranteed {describe('gpu', demand)} but "
        f"{describe('gpu', remaining.cards)} would remain - {excess('gpu', demand, remaining.cards)}. "
        f"Lower those guarantees first")]
