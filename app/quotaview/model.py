"""The quota tree as ``envelope quotas`` draws it, built with the rules' own arithmetic.

Nothing here adds or compares a quota itself: a queue's numbers are the
:class:`~app.rules.quotas.tree.Slot` the rules read, a parent's load is
:func:`app.crds.kai.total` of its children, over-commit is
:func:`app.rules.quotas.sums.overflow` (rules 1 and 8) and a pool's cards and demand are
:func:`~app.rules.quotas.tree.pool_capacity` and :func:`~app.rules.quotas.sums.pool_demand`
(rule 3). So the picture and ``envelope check`` can never disagree, and 0.1 + 0.2 cards
are exactly 0.3 here as there.

Allocated amounts come from KAI Queue ``status.allocated`` (a ResourceList written by
the KAI Scheduler); a queue with no status, or none yet, is "not reported" (None),
never 0.

Why one module of ~400 lines: the tree's types, how they are built from the rules' slots,
compared (before and after a change) and written as JSON change together: a number
added to a node is built, compared and exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from app.cluster.view import ClusterView, StaticView
from app.core.config import Policy
from app.core.frontdoor import FrontDoor
from app.core.ruleset import RuleSet
from app.crds.kai import DEFAULT_POOL, RESOURCES, Resource, exceeds, total
from app.k8s.util import plain_number
from app.rules.base import Subject
from app.rules.quotas.objects import (
    POOL,
    PROJECT_PARENT,
    QUEUE_PARENT,
    After,
    is_ours,
    krm_owned,
    name_of,
    raw_spec,
    text_or_empty,
)
from app.rules.quotas.sums import overflow, pool_demand
from app.rules.quotas.tree import Slot, all_slots, pool_capacity, slots
from app.rules.quotas.usage import read_usage

__all__ = ["QUOTAS_SCHEMA", "Numbers", "Pool", "Tree", "TreeNode", "allocated", "as_json",
           "build", "compare", "judge"]

QUOTAS_SCHEMA = "quotas/v1"
"""``schemaVersion`` of ``envelope quotas -o json`` (docs/schemas/quotas-v1.json)."""

QUOTA_KINDS = ("NodePool", "Department", "Project", "Queue")
Findings = dict[tuple[str, str], list[dict[str, str]]]
"""The quota rules' findings per (kind, object name)."""



@dataclass
class Numbers:
    """One resource of one queue."""

    guarantee: Decimal
    limit: Decimal
    limit_set: bool
    held: Decimal | None = None
    """The children's guarantees summed (``total``); None when it has no children."""
    over: bool = False
    """The children's guarantees do not fit under this guarantee (rules 1 and 8)."""
    allocated: Decimal | None = None
    """``status.allocated`` of its KAI Queue; None when not reported."""


@dataclass
class TreeNode:
    """A queue: a Department's or Project's queue on one pool, or a KAI Queue."""

    kind: str
    name: str
    """The object's name."""
    queue: str
    pool: str
    """"" for a KAI Queue."""
    path: str
    numbers: dict[Resource, Numbers]
    children: list[TreeNode] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)
    change: str = ""
    """"" (unchanged or no review), "added", "changed" (numbers) or "moved" (another
    parent; ``before`` is set when the numbers changed too)."""
    before: dict[Resource, Numbers] | None = None

    @property
    def over(self) -> bool:
        return any(n.over for n in self.numbers.values())

    def walk(self) -> Iterable[TreeNode]:
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


@dataclass
class Pool:
    name: str
    declared: bool
    """A NodePool object exists (``default`` never has to)."""
    nodes: int
    cards: Decimal
    """GPU cards on the pool's nodes; 0 = unknown capacity."""
    guaranteed: dict[Resource, Decimal]
    """The departments' guarantees on the pool, summed (gpu: rule 3's demand)."""
    departments: list[TreeNode] = field(default_factory=list)
    uncapped: list[TreeNode] = field(default_factory=list)
    """Project queues on this pool that no department queue caps."""
    findings: list[dict[str, str]] = field(default_factory=list)
    change: str = ""
    before: tuple[Decimal, Decimal] | None = None
    """(cards, gpu guaranteed) before the change under review, when either differs."""

    @property
    def over(self) -> bool:
        return self.cards > 0 and exceeds(self.guaranteed["gpu"], self.cards)

    @property
    def nodes_all(self) -> Iterable[TreeNode]:
        for top in (*self.departments, *self.uncapped):
            yield from top.walk()


@dataclass
class Tree:
    pools: list[Pool]
    queues: list[TreeNode]
    """KAI Queue trees KRM does not manage (roots first)."""
    loose: list[TreeNode]
    """Quota objects with findings that have no place in the tree (a spec that does not
    parse, a NodePool's own findings live on its pool)."""
    reviewing: bool = False
    removed: list[dict[str, str]] = field(default_factory=list)
    """Queues the change under review removes: kind, name, queue, pool."""

    def every_node(self) -> Iterable[TreeNode]:
        for pool in self.pools:
            yield from pool.nodes_all
        for root in self.queues:
            yield from root.walk()
        yield from self.loose


# --- status ---------------------------------------------------------------------------

def allocated(queue: dict[str, Any] | None) -> dict[Resource, Decimal | None]:
    """``status.allocated`` of a KAI Queue in quota units, read as the usage rules read it
    (:func:`app.rules.quotas.usage.read_usage`: every key KAI counts as a GPU, DRA
    DeviceClass names included, summed): no status, no usage list or an unreadable
    quantity is None (not reported), never 0. A resource missing from a reported list is
    0 (a ResourceList leaves out what is not used)."""
    status = queue.get("status") if isinstance(queue, dict) else None
    used = read_usage(status, "allocated")
    if used is None:
        return dict.fromkeys(RESOURCES)
    return {r: used.get(r) for r in RESOURCES}


# --- findings -------------------------------------------------------------------------

def judge(objects: Iterable[dict[str, Any]], view: ClusterView, rules: RuleSet,
          policy: Policy) -> Findings:
    """The quota rules' findings on each object, as ``envelope check`` computes them
    (each object judged as a CREATE against the view)."""
    out: Findings = {}
    door = FrontDoor(rules, view, policy, namespace=None)
    for obj in objects:
        kind = str(obj.get("kind", ""))
        if kind not in QUOTA_KINDS or not is_ours(kind, obj):
            continue
        result = door.judge(obj).evaluation
        found = [f.as_dict() for f in result.findings if f.rule.startswith("kai-")]
        found += [{"severity": "error", "rule": "internal", "path": "", "message": str(e)}
                  for e in result.internal_errors]
        if found:
            out.setdefault((kind, name_of(obj)), []).extend(found)
    return out


def _attach(nodes: list[TreeNode], found: list[dict[str, str]]) -> list[dict[str, str]]:
    """Each finding goes to the queue its path is under; the rest to the first queue.
    Returns what could not be attached (no queue at all)."""
    if not nodes:
        return found
    for f in found:
        path = f.get("path", "")
        home = next((n for n in nodes if path == n.path or path.startswith(n.path + ".")), nodes[0])
        home.findings.append(f)
    return []


# --- the tree -------------------------------------------------------------------------

def _node(slot: Slot, after: After, children: list[Slot]) -> TreeNode:
    status = allocated(after.get("Queue", slot.queue))  # a KAI Queue only, not Volcano's
    numbers = {}
    for r in RESOURCES:
        amounts = slot.amounts[r]
        held = total(s.guarantee(r) for s in children) if children else None
        numbers[r] = Numbers(amounts.guarantee, amounts.limit, amounts.limit_set, held,
                             bool(children) and overflow(children, slot, r) is not None,
                             status[r])
    return TreeNode(slot.kind, slot.owner, slot.queue, slot.pool, slot.path, numbers)


def _pool_names(view: ClusterView, after: After) -> list[str]:
    names = {name_of(p) for p in after.list("NodePool")}
    for kind in ("Department", "Project"):
        for obj in view.list(kind):
            if is_ours(kind, obj):
                names.update(s.pool for s in slots(kind, obj) or ())
    if view.list("Node"):
        names.add(DEFAULT_POOL)
    names.discard("")
    return sorted(names, key=lambda n: (n != DEFAULT_POOL, n))


def build(view: ClusterView, findings: Findings | None = None) -> Tree:
    """The tree of every quota object in ``view``, with ``findings`` beside them."""
    after = After(view, Subject("", "", ""), None)
    found = dict(findings or {})
    pools: list[Pool] = []
    nodes_of: dict[tuple[str, str], list[TreeNode]] = {}

    def keep(node: TreeNode) -> TreeNode:
        nodes_of.setdefault((node.kind, node.name), []).append(node)
        return node

    for name in _pool_names(view, after):
        capacity = pool_capacity(after, name)
        departments = sorted(
            (s for s in all_slots("Department", after.by_index(POOL["Department"], name))
             if s.pool == name), key=lambda s: s.owner)
        guaranteed = {r: (pool_demand(after, name) if r == "gpu" else
                          total(s.guarantee(r) for s in departments)) for r in RESOURCES}
        pool = Pool(name, after.get("NodePool", name) is not None, capacity.nodes,
                    capacity.cards, guaranteed)
        capped: set[str] = set()
        for slot in departments:
            projects = sorted((s for s in all_slots("Project", after.by_index(PROJECT_PARENT, slot.owner))
                               if s.pool == name), key=lambda s: s.owner)
            node = keep(_node(slot, after, projects))
            node.children = [keep(_node(p, after, [])) for p in projects]
            capped.update(p.owner for p in projects)
            pool.departments.append(node)
        for slot in sorted((s for s in all_slots("Project", after.by_index(POOL["Project"], name))
                            if s.pool == name and s.owner not in capped), key=lambda s: s.owner):
            pool.uncapped.append(keep(_node(slot, after, [])))
        pool.findings = found.pop(("NodePool", name), [])
        if pool.declared or pool.nodes or pool.departments or pool.uncapped or pool.findings:
            pools.append(pool)
    queues = _queue_trees(view, after, keep)
    loose: list[TreeNode] = []
    for (kind, name), items in sorted(found.items()):
        rest = _attach(nodes_of.get((kind, name), []), items)
        if rest:
            loose.append(TreeNode(kind, name, name, "", "", {}, findings=rest))
    return Tree(pools, queues, loose)


MAX_DEPTH = 100
"""Queue levels drawn under one root; a deeper queue starts a tree of its own."""


def _queue_trees(view: ClusterView, after: After,
                 keep: Callable[[TreeNode], TreeNode]) -> list[TreeNode]:
    """KAI Queues KRM does not generate, under ``spec.parentQueue``; a queue whose parent
    is missing is a root. KAI walks parents without a cycle check: a cycle is drawn once,
    from its alphabetically first member."""
    queues = {name_of(q): q for q in view.list("Queue") if is_ours("Queue", q) and not krm_owned(q, view)}
    seen: set[str] = set()

    def grow(name: str, depth: int = 0) -> TreeNode | None:
        mine = slots("Queue", queues[name])
        if not mine or name in seen or depth > MAX_DEPTH:
            return None
        seen.add(name)
        kids = sorted(name_of(c) for c in after.by_index(QUEUE_PARENT, name)
                      if name_of(c) in queues and name_of(c) != name)  # its own parent: no child
        child_slots = [s for k in kids for s in slots("Queue", queues[k]) or ()]
        node = keep(_node(mine[0], after, child_slots))
        node.children = [c for c in (grow(k, depth + 1) for k in kids) if c is not None]
        return node

    queues.pop("", None)  # a Queue without a name is not in the cluster to draw
    roots = sorted(n for n, q in queues.items()
                   if (text_or_empty(raw_spec(q).get("parentQueue")) or "") not in queues)
    out = [r for r in (grow(n) for n in roots) if r is not None]
    for name in sorted(set(queues) - seen):  # cycles: nothing leads to them from a root
        node = grow(name)
        if node is not None:
            out.append(node)
    return out


# --- before -> after ------------------------------------------------------------------

def _key(node: TreeNode) -> tuple[str, str, str, str]:
    return (node.kind, node.name, node.queue, node.pool)


def _same(a: dict[Resource, Numbers], b: dict[Resource, Numbers]) -> bool:
    return all((a[r].guarantee, a[r].limit, a[r].limit_set) == (b[r].guarantee, b[r].limit, b[r].limit_set)
               for r in RESOURCES)


def _parents(tree: Tree) -> dict[int, str]:
    """Each queue's parent (a department, a parent queue; "" at the top), by identity."""
    out: dict[int, str] = {}
    for top in (*(n for p in tree.pools for n in (*p.departments, *p.uncapped)), *tree.queues):
        out[id(top)] = ""
        for node in top.walk():
            for child in node.children:
                out[id(child)] = node.name
    return out


def compare(before: Tree, after: Tree) -> Tree:
    """Mark in ``after`` what the change under review adds, changes (with the numbers
    before it) or moves to another parent, and list the queues it removes."""
    old = {_key(n): n for n in before.every_node() if n.numbers}
    old_parent, new_parent = _parents(before), _parents(after)
    seen = set()
    for node in after.every_node():
        if not node.numbers:
            continue
        key = _key(node)
        prev = old.get(key)
        seen.add(key)
        if prev is None:
            node.change = "added"
            continue
        if not _same(prev.numbers, node.numbers):
            node.change, node.before = "changed", prev.numbers
        if old_parent.get(id(prev), "") != new_parent.get(id(node), ""):
            node.change = "moved"
    old_pools = {p.name: p for p in before.pools}
    for pool in after.pools:
        prev_pool = old_pools.get(pool.name)
        if prev_pool is None:
            pool.change = "added"
        elif (prev_pool.cards, prev_pool.guaranteed["gpu"]) != (pool.cards, pool.guaranteed["gpu"]):
            pool.change, pool.before = "changed", (prev_pool.cards, prev_pool.guaranteed["gpu"])
    after.removed = [{"kind": k, "name": n, "queue": q, "pool": p}
                     for (k, n, q, p) in sorted(set(old) - seen)]
    after.reviewing = True
    return after


def tree_of(objects: list[dict[str, Any]], rules: RuleSet, policy: Policy,
            judged: Iterable[dict[str, Any]] | None = None) -> Tree:
    """The tree of ``objects`` with the findings of ``judged`` (default: all of them)."""
    view = StaticView(objects, rules.indexes)
    return build(view, judge(objects if judged is None else judged, view, rules, policy))


# --- JSON -----------------------------------------------------------------------------

def number(value: Decimal | None) -> str | None:
    """An exact decimal as text ("0.3", "-1" = unlimited); None stays None."""
    return None if value is None else plain_number(value)


def _numbers_json(numbers: dict[Resource, Numbers]) -> dict[str, Any]:
    return {r: {"guarantee": number(n.guarantee), "limit": number(n.limit), "limitSet": n.limit_set,
                "children": number(n.held), "overCommitted": n.over, "allocated": number(n.allocated)}
            for r, n in numbers.items()}


def _node_json(node: TreeNode) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": node.kind, "name": node.name, "queue": node.queue,
                           "pool": node.pool, "resources": _numbers_json(node.numbers),
                           "overCommitted": node.over, "findings": node.findings,
                           "change": node.change,
                           "before": _numbers_json(node.before) if node.before else None,
                           "children": [_node_json(c) for c in node.children]}
    return out


def as_json(tree: Tree) -> dict[str, Any]:
    return {
        "schemaVersion": QUOTAS_SCHEMA,
        "reviewing": tree.reviewing,
        "pools": [{"name": p.name, "declared": p.declared, "nodes": p.nodes,
                   "cards": number(p.cards), "capacityKnown": p.cards > 0,
                   "guaranteed": {r: number(v) for r, v in p.guaranteed.items()},
                   "overCommitted": p.over, "findings": p.findings, "change": p.change,
                   "before": ({"cards": number(p.before[0]), "gpuGuaranteed": number(p.before[1])}
                              if p.before else None),
                   "departments": [_node_json(d) for d in p.departments],
                   "uncapped": [_node_json(u) for u in p.uncapped]} for p in tree.pools],
        "queues": [_node_json(q) for q in tree.queues],
        "unplaced": [{"kind": n.kind, "name": n.name, "findings": n.findings} for n in tree.loose],
        "removed": tree.removed,
    }
