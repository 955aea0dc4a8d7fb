"""Legal but almost always a mistake: a limit above the parent's (the lower one wins), a
project queue no department caps, a department limit above the pool."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.crds.kai import (
    RESOURCES,
    UNLIMITED,
    KaiQueueSpec,
    ProjectSpec,
    describe,
    exceeds,
)
from app.rules.base import Finding
from app.rules.quotas.messages import plural, tree_warning
from app.rules.quotas.objects import PROJECT_PARENT, QUEUE_PARENT, After, Check, typed_spec
from app.rules.quotas.tree import Slot, all_slots, by_pool, pool_capacity, pool_exists, slots


def limits_above(child: Slot, cap: Slot, label: str) -> Iterator[Finding]:
    for r in RESOURCES:
        mine, theirs = child.limit(r), cap.limit(r)
        if exceeds(mine, theirs):
            yield tree_warning(child.field_path(r, "limit"),
                        f"{child.where}: {r} limit {describe(r, mine)} is above {label} "
                        f"{cap.queue}'s {describe(r, theirs)}; the lower limit wins")


def project_tree(after: After, obj: dict[str, Any]) -> list[Finding]:
    spec = typed_spec("Project", obj)
    if not isinstance(spec, ProjectSpec) or not spec.parent:
        return []
    department = slots("Department", after.get("Department", spec.parent))
    if department is None:
        return []  # kai-structure or kai-schema reports it
    caps = by_pool(department)
    findings = []
    for slot in slots("Project", obj) or []:
        cap = caps.get(slot.pool)
        if cap is None:
            findings.append(tree_warning(f"{slot.path}.nodepool",
                                  f"{slot.where}: department {spec.parent} has no queue on this pool, "
                                  f"so this queue is a root no department caps"))
        else:
            findings.extend(limits_above(slot, cap, "department queue"))
    return findings


def department_tree(after: After, obj: dict[str, Any]) -> list[Finding]:
    children = all_slots("Project", after.by_index(PROJECT_PARENT, after.name))
    findings = []
    for slot in slots("Department", obj) or []:
        for r in RESOURCES:
            above = [c for c in children if c.pool == slot.pool and exceeds(c.limit(r), slot.limit(r))]
            if above:
                queues = plural(len(above), "project queue")
                findings.append(tree_warning(slot.field_path(r, "limit"),
                                      f"{slot.where}: the {r} limit of {queues} is above the "
                                      f"department's {describe(r, slot.limit(r))}, which wins"))
        limit = slot.limit("gpu")
        if limit == UNLIMITED or limit <= 0 or not pool_exists(after, slot.pool):
            continue
        cards = pool_capacity(after, slot.pool).cards
        if cards > 0 and limit > cards:
            findings.append(tree_warning(slot.field_path("gpu", "limit"),
                                  f"{slot.where}: gpu limit {describe('gpu', limit)} is above the "
                                  f"pool's {describe('gpu', cards)}"))
    return findings


def queue_tree(after: After, obj: dict[str, Any]) -> list[Finding]:
    spec = typed_spec("Queue", obj)
    mine = slots("Queue", obj)
    if not isinstance(spec, KaiQueueSpec) or not mine:
        return []
    findings: list[Finding] = []
    parent = slots("Queue", after.get("Queue", spec.parent_queue)) if spec.parent_queue else None
    if parent:
        findings.extend(limits_above(mine[0], parent[0], "parent queue"))
    children = all_slots("Queue", after.by_index(QUEUE_PARENT, after.name))
    for r in RESOURCES:
        above = [c for c in children if exceeds(c.limit(r), mine[0].limit(r))]
        if above:
            findings.append(tree_warning(mine[0].field_path(r, "limit"),
                                  f"{after.name}: the {r} limit of {plural(len(above), 'child queue')} is "
                                  f"above this queue's {describe(r, mine[0].limit(r))}, which wins"))
    return findings


TREE_CHECKS: dict[str, Check] = {"Project": project_tree, "Department": department_tree,
                            "Queue": queue_tree}
