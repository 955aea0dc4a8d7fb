"""What KRM (and KAI's queue webhook) refuse on a single object: unknown pools and
parents, a second queue on a pool, negative values, a guarantee above its own limit."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from app.crds.kai import (
    DEFAULT_POOL,
    INT32,
    RESOURCES,
    UNLIMITED,
    KaiQueueSpec,
    NodePoolSpec,
    ProjectSpec,
    describe,
    exceeds,
)
from app.k8s.util import brief
from app.rules.base import Finding, warning
from app.rules.quotas.messages import quota_error
from app.rules.quotas.objects import NODEPOOL_LABEL, After, name_of, typed_spec
from app.rules.quotas.tree import Slot, pool_exists, slots


def structure_of_queues(after: After, kind: str, entries: tuple[Slot, ...]) -> Iterator[Finding]:
    first: dict[str, str] = {}
    for slot in entries:
        path = f"{slot.path}.nodepool"
        if not slot.pool:
            yield quota_error(path,
                          f"queue {slot.queue}: nodepool is empty; name a node pool "
                          f"(the built-in one is {DEFAULT_POOL})")
        elif slot.pool in first:
            yield quota_error(path,
                          f"{slot.where}: a second queue on pool {slot.pool} in this {kind} "
                          f"(the first is {first[slot.pool]}); KRM allows one queue per node pool")
        elif not pool_exists(after, slot.pool):
            yield quota_error(path,
                          f"{slot.where}: node pool {slot.pool} does not exist; create the "
                          f"NodePool first or use an existing pool")
        first.setdefault(slot.pool, slot.path)


def structure_krm(after: After, obj: dict[str, Any]) -> list[Finding]:
    entries = slots(after.kind, obj)
    spec = typed_spec(after.kind, obj)
    if entries is None:
        return []
    findings = list(structure_of_queues(after, after.kind, entries))
    if isinstance(spec, ProjectSpec):
        if spec.parent and after.get("Department", spec.parent) is None:
            findings.append(quota_error("spec.parent",
                f"parent department {spec.parent} does not exist; create it first, or leave "
                f"spec.parent empty for a project with no department"))
        pools = {s.pool for s in entries}
        for i, pool in enumerate(spec.default_node_pools or []):
            if pool not in pools:
                findings.append(quota_error(f"spec.defaultNodePools[{i}]",
                    f"default node pool {pool} has no queue in spec.queues; add a queue on "
                    f"{pool} or drop it from defaultNodePools"))
    return findings


def structure_nodepool(after: After, obj: dict[str, Any]) -> list[Finding]:
    spec = typed_spec("NodePool", obj)
    if not isinstance(spec, NodePoolSpec) or not spec.label_key:
        return []
    pair = f"{spec.label_key}={spec.label_value or ''}"
    others = [name_of(o) for o in after.by_index(NODEPOOL_LABEL, pair) if o is not obj]
    if not others:
        return []
    return [quota_error("spec.labelKey",
                    f"node pool {after.name}: label {pair} already selects the nodes of pool "
                    f"{others[0]}; every pool needs its own label pair")]


def structure_queue(after: After, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Finding]:
    spec = typed_spec("Queue", obj)
    if not isinstance(spec, KaiQueueSpec):
        return []
    findings = []
    if spec.resources is None:
        findings.append(quota_error("spec.resources",
                                f"queue {after.name}: spec.resources is required (KAI's queue "
                                f"webhook refuses a queue without it)"))
    parent = spec.parent_queue
    if parent == after.name:
        findings.append(quota_error("spec.parentQueue",
                                f"queue {after.name} cannot be its own parent"))
    elif parent and after.get("Queue", parent) is None:
        findings.append(warning("spec.parentQueue",
                                brief(f"queue {after.name}: parent queue {parent} not found, "
                                       f"so its quotas cannot be checked against it")))
    elif parent:
        was = typed_spec("Queue", old) if old is not None else None
        kept = isinstance(was, KaiQueueSpec) and was.parent_queue == parent
        findings.extend(_parent_loop(after, parent, closes=not kept))
    return findings


def _parent_chain(after: After, parent: str) -> list[str]:
    """The queue's ancestors, from ``parent`` up, as the cluster would hold them after
    the write, ending at a root, at a queue not found, or at the first queue seen twice
    (a loop; returned as the last name)."""
    chain = [after.name, parent]
    seen = set(chain)
    while True:
        queue = after.get("Queue", chain[-1])
        up = typed_spec("Queue", queue) if queue is not None else None
        nxt = up.parent_queue if isinstance(up, KaiQueueSpec) else None
        if not nxt:
            return chain
        chain.append(nxt)
        if nxt in seen:
            return chain
        seen.add(nxt)


def _parent_loop(after: After, parent: str, *, closes: bool) -> list[Finding]:
    """KAI Scheduler walks ``parentQueue`` up to a root with no cycle check: a chain that
    loops never reaches one. Refused when this write closes the loop (the queue is in
    it and the write sets its parent: CREATE, or an UPDATE that changes parentQueue);
    warned when the loop is above the queue, or was closed before (an UPDATE that
    leaves parentQueue alone must not fail for it)."""
    chain = _parent_chain(after, parent)
    last = chain[-1]
    if chain.count(last) < 2:
        return []
    loop = chain[chain.index(last):]
    shown = " -> ".join(loop) if len(loop) <= 6 else \
        " -> ".join([*loop[:3], f"... {len(loop) - 4} more ...", *loop[-2:]])
    if last == after.name and closes:
        return [quota_error("spec.parentQueue",
            f"queue {after.name}: parentQueue {parent} closes a loop ({shown}); KAI Scheduler "
            f"walks parentQueue up to a root without a cycle check, and a loop has none. Set "
            f"parentQueue to a queue outside the loop, or leave it empty for a root queue")]
    whose = "it is in a loop of parent queues" if last == after.name else "its parent queues loop"
    return [warning("spec.parentQueue", brief(
        f"queue {after.name}: {whose} ({shown}), so KAI Scheduler never reaches a root above "
        f"it; set one of them to a parent outside the loop"))]


def invalid_negative(value: Decimal) -> bool:
    return value < 0 and value != UNLIMITED


def value_findings(after: After, obj: dict[str, Any]) -> list[Finding]:
    findings = []
    for slot in slots(after.kind, obj) or []:
        for r in RESOURCES:
            a = slot.amounts[r]
            for field, value in ((slot.guarantee_field, a.guarantee), ("limit", a.limit)):
                if invalid_negative(value):
                    findings.append(quota_error(slot.field_path(r, field),
                        f"{slot.where}: {r} {field} {describe(r, value)} is negative; use -1 for "
                        f"unlimited, or a value of 0 or more"))
            if a.weight < 0:
                findings.append(quota_error(slot.field_path(r, "overQuotaWeight"),
                    f"{slot.where}: {r} overQuotaWeight {a.weight.normalize():f} is negative; "
                    f"weights are 0 or more"))
        findings.extend(priority_findings(slot))
    return findings


def priority_findings(slot: Slot) -> list[Finding]:
    if slot.priority is None:
        return []
    path = f"{slot.path}.priority"
    if slot.priority != int(slot.priority):
        return [quota_error(path,
                        f"{slot.where}: priority {slot.priority} must be a whole number")]
    if slot.kind != "Queue" and not INT32[0] <= slot.priority <= INT32[1]:
        return [quota_error(path,
                        f"{slot.where}: priority {int(slot.priority)} does not fit in 32 bits")]
    return []


def deserved_limit_findings(after: After, obj: dict[str, Any]) -> list[Finding]:
    findings = []
    for slot in slots(after.kind, obj) or []:
        for r in RESOURCES:
            a = slot.amounts[r]
            if invalid_negative(a.guarantee) or invalid_negative(a.limit) or a.limit == UNLIMITED:
                continue
            if not exceeds(a.guarantee, a.limit):
                continue
            unset = "" if a.limit_set else " (a limit left out is 0)"
            field = slot.guarantee_field
            findings.append(quota_error(slot.field_path(r, field),
                f"{slot.where}: {r} {field} {describe(r, a.guarantee)} is above its limit "
                f"{describe(r, a.limit)}{unset}, so the queue can never use its guarantee; raise "
                f"the limit (-1 = unlimited) or lower {field}"))
    return findings
