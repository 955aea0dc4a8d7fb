"""Quota trees: KAI Resource Management (NodePool, Department, Project) and KAI Queues.

The arithmetic of a quota tree (children's guarantees fit their parent's, a guarantee
is not above its own limit, -1 means unlimited, node pools hold the cards promised on
them, names are cluster-wide) plus KRM's own structural checks, so that
``envelope check`` catches offline what the cluster would refuse. Every rule is a pure
function of the write and of :class:`After` — the view as the write would leave it,
with the subject's cached copy replaced by the admitted object. Nothing lists a whole
kind on the admission path: siblings, names and pools are read through indexes
registered below, so a request costs the same in a cluster of 10 Projects or 10,000.

A write is judged on what it changes:

- an UPDATE that leaves ``spec`` alone (finalizers, labels, status) is not judged
  (every rule declares ``judges=spec``);
- the sums (rules 1, 3, 8) deny only a write that grows a guarantee (or shrinks a cap)
  into an excess: a project that shrinks while its department is still over-promised
  is let through, because refusing it would block the very fix;
- the per-object rules drop, on UPDATE, findings the old object already had, as the
  API server ratchets CRD validation (``ratchet=Ratchet.DROP``; a finding whose
  numbers changed is new).

``envelope check`` and a later audit judge every object as a CREATE, so they report
everything, once per object involved.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import orjson

from app.cluster.view import NODE_LABEL, ClusterView, Index
from app.config import Mode, Policy
from app.kai import (
    DEFAULT_POOL,
    INT32,
    KAI_GROUP,
    KRM_GROUP,
    RESOURCES,
    SPEC_MODELS,
    UNLIMITED,
    ZERO,
    Amounts,
    KaiQueueSpec,
    NodePoolSpec,
    ProjectSpec,
    Resource,
    describe,
    effective,
    exceeds,
    grew,
    node_cards,
    node_labels,
    parse,
    project_namespace,
    queue_name,
    shortfall,
    total,
    unknown_fields,
)
from app.rules.base import Finding, Ratchet, Subject, error, rule, warning
from app.util import Memo, brief

__all__ = ["INDEXES", "After", "Capacity", "Slot", "pool_capacity", "slots"]

DEPARTMENT = (KRM_GROUP, "Department")
PROJECT = (KRM_GROUP, "Project")
NODEPOOL = (KRM_GROUP, "NodePool")
QUEUE = (KAI_GROUP, "Queue")
KINDS = frozenset({DEPARTMENT, PROJECT, NODEPOOL, QUEUE})
TREES = frozenset({DEPARTMENT, PROJECT, QUEUE})
GROUP_OF = {"Department": KRM_GROUP, "Project": KRM_GROUP, "NodePool": KRM_GROUP,
            "Queue": KAI_GROUP, "Node": ""}


# --- raw objects ----------------------------------------------------------------------

@lru_cache(maxsize=256)
def _group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _group(obj: dict[str, Any]) -> str:
    api = obj.get("apiVersion")
    return _group_of(api) if isinstance(api, str) else ""


def _ours(kind: str, obj: Any) -> bool:
    """Same kind name, right API group: a Volcano Queue or an OpenShift Project is not ours."""
    return isinstance(obj, dict) and _group(obj) == GROUP_OF[kind]


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _raw_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _raw_entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    queues = _raw_spec(obj).get("queues")
    return [q for q in queues if isinstance(q, dict)] if isinstance(queues, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _krm_owned(obj: dict[str, Any]) -> bool:
    """A KAI Queue that KRM generated from a Department or Project (its ownerReference)."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    return isinstance(owners, list) and any(
        isinstance(o, dict) and o.get("kind") in ("Department", "Project")
        and str(o.get("apiVersion", "")).startswith(f"{KRM_GROUP}/") for o in owners)


# --- indexes: what a request may look up instead of listing ----------------------------

def _index_parent(obj: dict[str, Any]) -> Iterator[str]:
    if _ours("Project", obj) and _text(_raw_spec(obj).get("parent")):
        yield _raw_spec(obj)["parent"]


def _index_namespace(obj: dict[str, Any]) -> Iterator[str]:
    if _ours("Project", obj):
        yield project_namespace(_name(obj), _text(_raw_spec(obj).get("namespace")))


def _index_queue_names(kind: str) -> Callable[[dict[str, Any]], Iterator[str]]:
    def names(obj: dict[str, Any]) -> Iterator[str]:
        if _ours(kind, obj):
            for entry in _raw_entries(obj):
                yield queue_name(_text(entry.get("name")), _name(obj), _text(entry.get("nodepool")))
    return names


def _index_pools(kind: str) -> Callable[[dict[str, Any]], Iterator[str]]:
    def pools(obj: dict[str, Any]) -> Iterator[str]:
        if _ours(kind, obj):
            yield from {_text(entry.get("nodepool")) for entry in _raw_entries(obj)}
    return pools


def _index_pool_label(obj: dict[str, Any]) -> Iterator[str]:
    spec = _raw_spec(obj)
    if _ours("NodePool", obj) and _text(spec.get("labelKey")):
        yield f"{spec['labelKey']}={_text(spec.get('labelValue'))}"


def _index_queue_parent(obj: dict[str, Any]) -> Iterator[str]:
    if _ours("Queue", obj) and _text(_raw_spec(obj).get("parentQueue")):
        yield _raw_spec(obj)["parentQueue"]


PROJECT_PARENT = Index("Project", "kai-parent", _index_parent)
QUEUE_PARENT = Index("Queue", "kai-parent", _index_queue_parent)
PROJECT_NAMESPACE = Index("Project", "kai-namespace", _index_namespace)
QUEUE_NAME = {kind: Index(kind, "kai-queue-name", _index_queue_names(kind))
              for kind in ("Department", "Project")}
POOL = {kind: Index(kind, "kai-nodepool", _index_pools(kind)) for kind in ("Department", "Project")}
NODEPOOL_LABEL = Index("NodePool", "kai-label", _index_pool_label)
INDEXES = (PROJECT_PARENT, QUEUE_PARENT, PROJECT_NAMESPACE, *QUEUE_NAME.values(), *POOL.values(),
           NODEPOOL_LABEL, NODE_LABEL)


class After:
    """The cluster as the write would leave it: the view, with the subject's cached
    copy replaced by ``obj`` (or gone when ``obj`` is None, on DELETE).

    Only objects of the right API group are returned. Rules read nothing else, so the
    same rule judges a webhook request, a file in ``envelope check`` or an audit.
    """

    def __init__(self, view: ClusterView, subject: Subject, obj: dict[str, Any] | None) -> None:
        self.view = view
        self.kind = subject.kind
        self.obj = obj
        self.name = (_name(obj) if obj else "") or subject.name

    def _is_subject(self, kind: str, obj: dict[str, Any]) -> bool:
        return kind == self.kind and _name(obj) == self.name

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        if kind == self.kind and name == self.name:
            return self.obj
        found = self.view.get(kind, name)
        return found if _ours(kind, found) else None

    def by_index(self, index: Index, value: str) -> list[dict[str, Any]]:
        found = self.view.by_index(index, value)  # our indexes hold only our group
        kind = index.kind
        if kind != self.kind:
            return found
        found = [o for o in found if not self._is_subject(kind, o)]
        if self.obj is not None and value in index.values(self.obj):
            found.append(self.obj)
        return found

    def list(self, kind: str) -> list[dict[str, Any]]:
        """Every object of a kind: used only for NodePools (few) and, for the default
        pool's capacity, Nodes (see :func:`pool_capacity`)."""
        found = [o for o in self.view.list(kind) if _ours(kind, o) and not self._is_subject(kind, o)]
        if kind == self.kind and self.obj is not None:
            found.append(self.obj)
        return found


# --- typed reading --------------------------------------------------------------------

def _spec_input(kind: str, obj: dict[str, Any]) -> Any:
    spec = obj.get("spec")
    if spec is None and kind in ("Department", "Project"):
        return {"queues": []}  # the CRDs require queues only inside a spec
    return spec


def typed_spec(kind: str, obj: dict[str, Any] | None) -> Any:
    """The object's typed spec, or None when it does not parse (``kai-schema`` says why)."""
    if not isinstance(obj, dict):
        return None
    spec, _ = parse(SPEC_MODELS[(GROUP_OF[kind], kind)], _spec_input(kind, obj))
    return spec


@dataclass(eq=False, slots=True)
class Slot:
    """One queue's numbers: a queue entry of a Department or Project, or a KAI Queue.
    Slots are remembered and shared between requests: never change one."""

    kind: str
    owner: str
    queue: str
    """The queue's cluster-wide name (what the KAI Queue is called)."""
    pool: str
    """The node pool; "" for a KAI Queue, which belongs to no KRM pool."""
    path: str
    """``spec.queues[2]`` or, for a KAI Queue, ``spec``."""
    priority: float | None
    amounts: dict[Resource, Amounts]

    @property
    def where(self) -> str:
        return f"{self.queue} (pool {self.pool})" if self.pool else self.queue

    @property
    def guarantee_field(self) -> str:
        return "quota" if self.kind == "Queue" else "deserved"

    def field_path(self, resource: Resource, field: str) -> str:
        return f"{self.path}.resources.{resource}.{field}"

    def guarantee(self, resource: Resource) -> Decimal:
        return self.amounts[resource].guarantee

    def limit(self, resource: Resource) -> Decimal:
        return self.amounts[resource].limit


_slots: Memo[tuple[str, str, bytes], tuple[Slot, ...] | None] = Memo(20_000)
_MISSING = object()


def slots(kind: str, obj: dict[str, Any] | None) -> tuple[Slot, ...] | None:
    """The queues an object declares (None when it does not parse), remembered by the
    object's name and spec content, like :func:`app.kai.parse`."""
    if not isinstance(obj, dict):
        return None
    owner = _name(obj)
    raw = _spec_input(kind, obj)
    try:
        key = (kind, owner, orjson.dumps(raw))
    except TypeError:
        return _build_slots(kind, owner, typed_spec(kind, obj))
    found = _slots.get(key, _MISSING)
    if found is _MISSING:
        found = _slots.put(key, _build_slots(kind, owner, typed_spec(kind, obj)))
    return found


def _build_slots(kind: str, owner: str, spec: Any) -> tuple[Slot, ...] | None:
    if spec is None:
        return None
    if isinstance(spec, KaiQueueSpec):
        return (Slot(kind, owner, owner, "", "spec", spec.priority,
                     {r: spec.amounts(r) for r in RESOURCES}),)
    return tuple(Slot(kind, owner, queue_name(e.name, owner, e.nodepool), e.nodepool,
                      f"spec.queues[{i}]", e.priority, {r: e.amounts(r) for r in RESOURCES})
                 for i, e in enumerate(spec.queues))


def _all_slots(kind: str, objects: Iterable[dict[str, Any]]) -> list[Slot]:
    return [s for obj in objects for s in slots(kind, obj) or ()]


def _by_pool(found: Iterable[Slot] | None) -> dict[str, Slot]:
    out: dict[str, Slot] = {}
    for slot in found or ():
        out.setdefault(slot.pool, slot)
    return out


def _pool_exists(after: After, pool: str) -> bool:
    return pool == DEFAULT_POOL or after.get("NodePool", pool) is not None


@dataclass(frozen=True)
class Capacity:
    nodes: int
    cards: Decimal


_capacity: Memo[Hashable, Capacity] = Memo(1024)


def _cards(after: After, key: Hashable, nodes: Callable[[], list[dict[str, Any]]],
           select: Callable[[dict[str, Any]], bool] | None = None) -> Capacity:
    """Nodes and cards among ``nodes()`` (those ``select`` keeps), remembered until a
    Node changes in the view (its Node version moves), so no request recounts them."""
    full_key = (key, after.view.version("Node"))
    found = _capacity.get(full_key)
    if found is not None:
        return found
    mine = [n for n in nodes() if select(n)] if select else nodes()
    return _capacity.put(full_key, Capacity(len(mine), sum((node_cards(n) for n in mine), ZERO)))


def _label_pairs(after: After) -> frozenset[tuple[str, str]]:
    pairs = set()
    for pool in after.list("NodePool"):
        spec = typed_spec("NodePool", pool)
        if isinstance(spec, NodePoolSpec) and spec.label_key and _name(pool) != DEFAULT_POOL:
            pairs.add((spec.label_key, spec.label_value or ""))
    return frozenset(pairs)


def _outside(pairs: frozenset[tuple[str, str]]) -> Callable[[dict[str, Any]], bool]:
    """A node no labelled pool selects."""
    by_key: dict[str, set[str]] = {}
    for key, value in pairs:
        by_key.setdefault(key, set()).add(value)
    return lambda node: _ours("Node", node) and not any(
        node_labels(node).get(k) in v for k, v in by_key.items())


def pool_capacity(after: After, pool: str) -> Capacity:
    """Nodes and GPU cards of a node pool, counted on the view's Nodes. The default pool
    is every node no labelled pool selects, the one answer that needs every Node."""
    if pool == DEFAULT_POOL:
        pairs = _label_pairs(after)
        return _cards(after, (DEFAULT_POOL, pairs), lambda: after.view.list("Node"), _outside(pairs))
    spec = typed_spec("NodePool", after.get("NodePool", pool))
    if not isinstance(spec, NodePoolSpec) or not spec.label_key:
        return Capacity(0, ZERO)
    pair = f"{spec.label_key}={spec.label_value or ''}"
    return _cards(after, pair, lambda: after.by_index(NODE_LABEL, pair))


# --- messages -------------------------------------------------------------------------

def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" +{len(names) - limit} more" if len(names) > limit else "")


def _excess(resource: Resource, demand: Decimal, cap: Decimal) -> str:
    if effective(demand) == UNLIMITED:
        return f"an unlimited guarantee cannot fit in {describe(resource, cap)}"
    return f"{describe(resource, shortfall(demand, cap))} cannot be met"


def _holders(resource: Resource, found: list[Slot]) -> str:
    ranked = sorted((s for s in found if effective(s.guarantee(resource)) != 0),
                    key=lambda s: (effective(s.guarantee(resource)) != UNLIMITED,
                                   -effective(s.guarantee(resource))))
    return _names([f"{s.owner} {describe(resource, s.guarantee(resource))}" for s in ranked])


# --- plumbing -------------------------------------------------------------------------

def spec(subject: Subject, obj: dict[str, Any]) -> Any:
    """What the quota rules judge: an UPDATE that leaves ``spec`` alone is not judged."""
    return obj.get("spec")


def _not_ours(subject: Subject, obj: dict[str, Any] | None) -> bool:
    """A KAI Queue that KRM generates: its Department or Project was judged instead."""
    return subject.kind == "Queue" and _krm_owned(obj or subject.old or {})


RuleFn = Callable[[Subject, dict[str, Any], ClusterView, Policy], list[Finding]]
Check = Callable[["After", dict[str, Any]], list[Finding]]


def _skip_generated(fn: RuleFn) -> RuleFn:
    """Skip KAI Queues that KRM generates."""

    def judged(subject: Subject, obj: dict[str, Any], view: ClusterView, policy: Policy) -> list[Finding]:
        return [] if _not_ours(subject, obj) else fn(subject, obj, view, policy)

    judged.__name__, judged.__doc__ = fn.__name__, fn.__doc__
    return judged


def _error(path: str, text: str) -> Finding:
    """An error whose warn-mode form fits a Warning header."""
    return error(path, text, as_warning=brief(text))


def _first(found: tuple[Slot, ...] | None) -> Slot | None:
    return found[0] if found else None


def _old_slots(subject: Subject) -> tuple[Slot, ...] | None:
    if subject.operation != "UPDATE" or not isinstance(subject.old, dict):
        return None
    return slots(subject.kind, subject.old)


# --- kai-schema -----------------------------------------------------------------------

_NUMBER_HINT = " (KAI quotas are plain numbers: gpu in cards, cpu in mCPU, memory in MB)"


@rule("kai-schema", "validate", KINDS, Mode.ENFORCE,
      "quota objects have the CRD's types (numbers are numbers)", judges=spec)
@_skip_generated
def check_schema(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """The object as the CRD types it; a type error is a finding, never an exception."""
    spec = _spec_input(subject.kind, obj)
    model, errors = parse(SPEC_MODELS[(subject.group, subject.kind)], spec)
    findings = []
    for problem in errors:
        text = str(problem)
        if "expected a number, got '" in text:
            text += _NUMBER_HINT
        findings.append(_error(problem.path, text))
    for path in unknown_fields(model) if model is not None else ():
        findings.append(warning(path, brief(
            f"{path}: unknown field; kubectl apply refuses it, other clients' writes lose it")))
    return findings


# --- kai-structure: what KRM (and KAI's queue webhook) refuse --------------------------

def _structure_of_queues(after: After, kind: str, entries: tuple[Slot, ...]) -> Iterator[Finding]:
    first: dict[str, str] = {}
    for slot in entries:
        path = f"{slot.path}.nodepool"
        if not slot.pool:
            yield _error(path,
                          f"queue {slot.queue}: nodepool is empty; name a node pool "
                          f"(the built-in one is {DEFAULT_POOL})")
        elif slot.pool in first:
            yield _error(path,
                          f"{slot.where}: a second queue on pool {slot.pool} in this {kind} "
                          f"(the first is {first[slot.pool]}); KRM allows one queue per node pool")
        elif not _pool_exists(after, slot.pool):
            yield _error(path,
                          f"{slot.where}: node pool {slot.pool} does not exist; create the "
                          f"NodePool first or use an existing pool")
        first.setdefault(slot.pool, slot.path)


def _structure_krm(after: After, obj: dict[str, Any]) -> list[Finding]:
    entries = slots(after.kind, obj)
    spec = typed_spec(after.kind, obj)
    if entries is None:
        return []
    findings = list(_structure_of_queues(after, after.kind, entries))
    if isinstance(spec, ProjectSpec):
        if spec.parent and after.get("Department", spec.parent) is None:
            findings.append(_error("spec.parent",
                f"parent department {spec.parent} does not exist; create it first, or leave "
                f"spec.parent empty for a project with no department"))
        pools = {s.pool for s in entries}
        for i, pool in enumerate(spec.default_node_pools or []):
            if pool not in pools:
                findings.append(_error(f"spec.defaultNodePools[{i}]",
                    f"default node pool {pool} has no queue in spec.queues; add a queue on "
                    f"{pool} or drop it from defaultNodePools"))
    return findings


def _structure_nodepool(after: After, obj: dict[str, Any]) -> list[Finding]:
    spec = typed_spec("NodePool", obj)
    if not isinstance(spec, NodePoolSpec) or not spec.label_key:
        return []
    pair = f"{spec.label_key}={spec.label_value or ''}"
    others = [_name(o) for o in after.by_index(NODEPOOL_LABEL, pair) if o is not obj]
    if not others:
        return []
    return [_error("spec.labelKey",
                    f"node pool {after.name}: label {pair} already selects the nodes of pool "
                    f"{others[0]}; every pool needs its own label pair")]


def _structure_queue(after: After, obj: dict[str, Any]) -> list[Finding]:
    spec = typed_spec("Queue", obj)
    if not isinstance(spec, KaiQueueSpec):
        return []
    findings = []
    if spec.resources is None:
        findings.append(_error("spec.resources",
                                f"queue {after.name}: spec.resources is required (KAI's queue "
                                f"webhook refuses a queue without it)"))
    parent = spec.parent_queue
    if parent == after.name:
        findings.append(_error("spec.parentQueue",
                                f"queue {after.name} cannot be its own parent"))
    elif parent and after.get("Queue", parent) is None:
        findings.append(warning("spec.parentQueue",
                                brief(f"queue {after.name}: parent queue {parent} not found, "
                                       f"so its quotas cannot be checked against it")))
    return findings


@rule("kai-structure", "validate", KINDS, Mode.ENFORCE,
      "known pools and parents, one queue per pool, one NodePool per label pair",
      reads={"NodePool", "Department", "Queue"}, judges=spec)
@_skip_generated
def check_structure(subject: Subject, obj: dict[str, Any], view: ClusterView,
                    policy: Policy) -> list[Finding]:
    """Unknown pool or parent, two queues on one pool, a default pool without a queue,
    two NodePools on one label pair, a Queue without resources."""
    after = After(view, subject, obj)
    if subject.kind == "NodePool":
        return _structure_nodepool(after, obj)
    if subject.kind == "Queue":
        return _structure_queue(after, obj)
    return _structure_krm(after, obj)


# --- kai-values (rule 4) --------------------------------------------------------------

def _invalid_negative(value: Decimal) -> bool:
    return value < 0 and value != UNLIMITED


def _values(after: After, obj: dict[str, Any]) -> list[Finding]:
    findings = []
    for slot in slots(after.kind, obj) or []:
        for r in RESOURCES:
            a = slot.amounts[r]
            for field, value in ((slot.guarantee_field, a.guarantee), ("limit", a.limit)):
                if _invalid_negative(value):
                    findings.append(_error(slot.field_path(r, field),
                        f"{slot.where}: {r} {field} {describe(r, value)} is negative; use -1 for "
                        f"unlimited, or a value of 0 or more"))
            if a.weight < 0:
                findings.append(_error(slot.field_path(r, "overQuotaWeight"),
                    f"{slot.where}: {r} overQuotaWeight {a.weight.normalize():f} is negative; "
                    f"weights are 0 or more"))
        findings.extend(_priority(slot))
    return findings


def _priority(slot: Slot) -> list[Finding]:
    if slot.priority is None:
        return []
    path = f"{slot.path}.priority"
    if slot.priority != int(slot.priority):
        return [_error(path,
                        f"{slot.where}: priority {slot.priority} must be a whole number")]
    if slot.kind != "Queue" and not INT32[0] <= slot.priority <= INT32[1]:
        return [_error(path,
                        f"{slot.where}: priority {int(slot.priority)} does not fit in 32 bits")]
    return []


@rule("kai-values", "validate", TREES, Mode.ENFORCE,
      "no negative quota but -1; overQuotaWeight >= 0; priority a whole number",
      judges=spec, ratchet=Ratchet.DROP)
@_skip_generated
def check_values(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """No value below 0 but -1; overQuotaWeight never negative; priority a whole number."""
    return _values(After(view, subject, obj), obj)


# --- kai-deserved-limit (rule 2) ------------------------------------------------------

def _deserved_limit(after: After, obj: dict[str, Any]) -> list[Finding]:
    findings = []
    for slot in slots(after.kind, obj) or []:
        for r in RESOURCES:
            a = slot.amounts[r]
            if _invalid_negative(a.guarantee) or _invalid_negative(a.limit) or a.limit == UNLIMITED:
                continue
            if not exceeds(a.guarantee, a.limit):
                continue
            unset = "" if a.limit_set else " (a limit left out is 0)"
            field = slot.guarantee_field
            findings.append(_error(slot.field_path(r, field),
                f"{slot.where}: {r} {field} {describe(r, a.guarantee)} is above its limit "
                f"{describe(r, a.limit)}{unset}, so the queue can never use its guarantee; raise "
                f"the limit (-1 = unlimited) or lower {field}"))
    return findings


@rule("kai-deserved-limit", "validate", TREES, Mode.ENFORCE,
      "a queue's guarantee is not above its own limit", judges=spec, ratchet=Ratchet.DROP)
@_skip_generated
def check_deserved_limit(subject: Subject, obj: dict[str, Any], view: ClusterView,
                         policy: Policy) -> list[Finding]:
    """A guarantee never above its own queue's limit (-1 = unlimited)."""
    return _deserved_limit(After(view, subject, obj), obj)


# --- kai-guarantee-sum (rule 1) -------------------------------------------------------

def _raised(prev: Slot | None, slot: Slot, resource: Resource) -> bool:
    """This write adds guarantee on the slot (a new slot adds all it has)."""
    mine = slot.guarantee(resource)
    if effective(mine) == 0:
        return False
    return prev is None or grew(prev.guarantee(resource), mine)


def _overflow(children: list[Slot], parent: Slot, r: Resource) -> tuple[Decimal, Decimal] | None:
    """(children's summed guarantee, parent's) when the children do not fit, else None:
    the one comparison behind rules 1 and 8 for departments and KAI queues alike."""
    demand, cap = total(s.guarantee(r) for s in children), parent.guarantee(r)
    return (demand, cap) if exceeds(demand, cap) else None


def _project_sum(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    spec = typed_spec("Project", obj)
    mine = slots("Project", obj)
    if not isinstance(spec, ProjectSpec) or mine is None or not spec.parent:
        return []
    department = _by_pool(slots("Department", after.get("Department", spec.parent)))
    old = typed_spec("Project", subject.old) if subject.operation == "UPDATE" else None
    before = _by_pool(_old_slots(subject)) if old is not None and old.parent == spec.parent else {}
    siblings: list[Slot] | None = None
    findings = []
    for slot in mine:
        cap_slot = department.get(slot.pool)
        for r in RESOURCES:
            if cap_slot is None or not _raised(before.get(slot.pool), slot, r):
                continue
            if siblings is None:
                siblings = _all_slots("Project", after.by_index(PROJECT_PARENT, spec.parent))
            on_pool = [s for s in siblings if s.pool == slot.pool]
            over = _overflow(on_pool, cap_slot, r)
            if over:
                demand, cap = over
                findings.append(_error(slot.field_path(r, "deserved"),
                    f"{cap_slot.where}: projects are guaranteed {describe(r, demand)} in total but "
                    f"the department has {describe(r, cap)} - {_excess(r, demand, cap)}. This write "
                    f"gives {slot.queue} {describe(r, slot.guarantee(r))}: first lower another "
                    f"project's {r} deserved on this pool, or raise department {spec.parent}'s, "
                    f"in a separate write"))
    return findings


def _queue_sum(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    spec = typed_spec("Queue", obj)
    mine = slots("Queue", obj)
    if not isinstance(spec, KaiQueueSpec) or not mine or not spec.parent_queue:
        return []
    parent = slots("Queue", after.get("Queue", spec.parent_queue))
    if not parent:
        return []
    old = typed_spec("Queue", subject.old) if subject.operation == "UPDATE" else None
    same_parent = isinstance(old, KaiQueueSpec) and old.parent_queue == spec.parent_queue
    prev = _first(_old_slots(subject)) if same_parent else None
    slot, cap_slot = mine[0], parent[0]
    findings = []
    for r in RESOURCES:
        if not _raised(prev, slot, r):
            continue
        children = _all_slots("Queue", after.by_index(QUEUE_PARENT, spec.parent_queue))
        over = _overflow(children, cap_slot, r)
        if over:
            demand, cap = over
            findings.append(_error(slot.field_path(r, "quota"),
                f"{cap_slot.queue}: child queues are guaranteed {describe(r, demand)} in total but "
                f"the parent queue has {describe(r, cap)} - {_excess(r, demand, cap)}. This write "
                f"gives {slot.queue} {describe(r, slot.guarantee(r))}: first lower a sibling's "
                f"{r} quota or raise {cap_slot.queue}'s, in a separate write"))
    return findings


@rule("kai-guarantee-sum", "validate", {PROJECT, QUEUE}, Mode.ENFORCE,
      "children's guarantees fit in their parent's",
      reads={"Department", "Project", "Queue"}, judges=spec)
@_skip_generated
def check_guarantee_sum(subject: Subject, obj: dict[str, Any], view: ClusterView,
                        policy: Policy) -> list[Finding]:
    """Children's guarantees on a pool fit in their parent's (projects in their
    department, KAI queues in their parentQueue)."""
    after = After(view, subject, obj)
    if subject.kind == "Queue":
        return _queue_sum(subject, obj, after)
    return _project_sum(subject, obj, after)


# --- kai-shrink (rule 8) --------------------------------------------------------------

def _lowered(prev: Slot | None, slot: Slot, resource: Resource) -> bool:
    """This write lowers the cap (a queue that did not exist capped nothing before)."""
    return prev is None or grew(slot.guarantee(resource), prev.guarantee(resource))


def _department_shrink(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    mine = slots("Department", obj)
    if mine is None:
        return []
    before = _by_pool(_old_slots(subject))
    children = _all_slots("Project", after.by_index(PROJECT_PARENT, after.name))
    findings = []
    for slot in mine:
        on_pool = [s for s in children if s.pool == slot.pool]
        for r in RESOURCES:
            if not on_pool or not _lowered(before.get(slot.pool), slot, r):
                continue
            over = _overflow(on_pool, slot, r)
            if over:
                demand, cap = over
                findings.append(_error(slot.field_path(r, "deserved"),
                    f"{slot.where}: projects already hold {describe(r, demand)} of guarantees but "
                    f"the department would have {describe(r, cap)} - {_excess(r, demand, cap)}. "
                    f"Lower the projects first ({_holders(r, on_pool)}), then the department"))
    kept = {s.pool for s in mine}
    for pool, prev in before.items():
        orphans = sorted({s.owner for s in children if s.pool == pool})
        if pool not in kept and orphans:
            findings.append(_error("spec.queues",
                f"{prev.where}: projects {_names(orphans)} still have queues on pool {pool}; "
                f"without the department's queue they become roots no department caps. Move or "
                f"remove those project queues first, then drop this one"))
    return findings


def _queue_shrink(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    mine = slots("Queue", obj)
    prev = _first(_old_slots(subject))
    if not mine:
        return []
    slot = mine[0]
    children = _all_slots("Queue", after.by_index(QUEUE_PARENT, after.name))
    findings = []
    for r in RESOURCES:
        if not children or not _lowered(prev, slot, r):
            continue
        over = _overflow(children, slot, r)
        if over:
            demand, cap = over
            findings.append(_error(slot.field_path(r, "quota"),
                f"{slot.queue}: child queues already hold {describe(r, demand)} of quota but the "
                f"queue would have {describe(r, cap)} - {_excess(r, demand, cap)}. Lower the "
                f"children first ({_holders(r, children)}), then this queue"))
    return findings


@rule("kai-shrink", "validate", {DEPARTMENT, QUEUE}, Mode.ENFORCE,
      "a parent is not cut below what its children hold", operations={"UPDATE"},
      reads={"Project", "Queue"}, judges=spec)
@_skip_generated
def check_shrink(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """A parent's UPDATE may not cut below what its children already hold, nor drop a
    department queue that projects sit under."""
    after = After(view, subject, obj)
    if subject.kind == "Queue":
        return _queue_shrink(subject, obj, after)
    return _department_shrink(subject, obj, after)


# --- kai-pool-capacity (rule 3) -------------------------------------------------------

def _pool_demand(after: After, pool: str) -> Decimal:
    on_pool = [s for s in _all_slots("Department", after.by_index(POOL["Department"], pool))
               if s.pool == pool]
    return total(s.guarantee("gpu") for s in on_pool)


def _department_fit(after: After, slot: Slot) -> list[Finding]:
    path = slot.field_path("gpu", "deserved")
    demand = _pool_demand(after, slot.pool)
    capacity = pool_capacity(after, slot.pool)
    if capacity.cards == 0:
        return [warning(path, brief(
            f"{slot.where}: the pool has no GPU nodes in view, so its {describe('gpu', demand)} "
            f"of guarantees cannot be checked"))]
    if not exceeds(demand, capacity.cards):
        return []
    return [_error(path,
        f"{slot.where}: departments are guaranteed {describe('gpu', demand)} in total (this one "
        f"{describe('gpu', slot.guarantee('gpu'))}) but the pool's {_plural(capacity.nodes, 'node')} have "
        f"{describe('gpu', capacity.cards)} - {_excess('gpu', demand, capacity.cards)}. Lower a "
        f"department's gpu deserved on this pool first, or add nodes to the pool")]


def _department_capacity(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    before = _by_pool(_old_slots(subject))
    findings = []
    for slot in slots("Department", obj) or []:
        if _raised(before.get(slot.pool), slot, "gpu") and _pool_exists(after, slot.pool):
            findings.extend(_department_fit(after, slot))
    return findings


def _nodepool_capacity(obj: dict[str, Any], after: After) -> list[Finding]:
    """A new labelled pool takes its nodes out of the default pool. (Departments cannot
    hold queues on a pool before it exists: KRM refuses an unknown pool.)"""
    spec = typed_spec("NodePool", obj)
    if not isinstance(spec, NodePoolSpec) or not spec.label_key or after.name == DEFAULT_POOL:
        return []
    demand = _pool_demand(after, DEFAULT_POOL)
    if effective(demand) == 0:
        return []
    remaining = pool_capacity(after, DEFAULT_POOL)
    if not exceeds(demand, remaining.cards):
        return []
    moved = pool_capacity(after, after.name)
    return [_error("spec.labelKey",
        f"node pool {after.name} takes {_plural(moved.nodes, 'node')} ({describe('gpu', moved.cards)}) "
        f"out of pool {DEFAULT_POOL}, where departments are guaranteed {describe('gpu', demand)} but "
        f"{describe('gpu', remaining.cards)} would remain - {_excess('gpu', demand, remaining.cards)}. "
        f"Lower those guarantees first")]


@rule("kai-pool-capacity", "validate", {DEPARTMENT, NODEPOOL}, Mode.ENFORCE,
      "departments' GPU guarantees fit in the pool's cards",
      reads={"Department", "NodePool", "Node"}, judges=spec)
@_skip_generated
def check_pool_capacity(subject: Subject, obj: dict[str, Any], view: ClusterView,
                        policy: Policy) -> list[Finding]:
    """Departments' GPU guarantees on a pool fit in the cards its nodes have."""
    after = After(view, subject, obj)
    if subject.kind == "NodePool":
        return _nodepool_capacity(obj, after) if subject.operation == "CREATE" else []
    return _department_capacity(subject, obj, after)


# --- kai-queue-name-unique (rule 5) ---------------------------------------------------

def _claimed_by(after: After, name: str, mine: dict[str, Any] | None) -> str | None:
    """Who else holds a queue name: a Department, a Project or a KAI Queue KRM does not own."""
    for kind in ("Department", "Project"):
        for other in after.by_index(QUEUE_NAME[kind], name):
            if other is not mine:
                return f"{kind.lower()} {_name(other)}"
    if after.kind != "Queue":
        queue = after.get("Queue", name)
        if queue is not None and not _krm_owned(queue):
            return "a KAI Queue that KRM does not manage"
    return None


def _krm_queue_names(subject: Subject, obj: dict[str, Any], after: After) -> list[Finding]:
    mine = slots(subject.kind, obj)
    if mine is None:
        return []
    had = {s.queue for s in _old_slots(subject) or []}
    first: dict[str, str] = {}
    findings = []
    for slot in mine:
        path = f"{slot.path}.name"
        if slot.queue in first:
            findings.append(_error(path,
                                    f"{slot.where}: queue name {slot.queue} is used twice in this "
                                    f"{subject.kind} (also {first[slot.queue]}); queue names are "
                                    f"cluster-wide"))
            continue
        first[slot.queue] = slot.path
        other = None if slot.queue in had else _claimed_by(after, slot.queue, obj)
        if other:
            findings.append(_error(path,
                f"{slot.where}: queue name {slot.queue} is already used by {other}; queue names "
                f"are cluster-wide and KRM would silently rename this queue. Pick another name"))
    return findings


@rule("kai-queue-name-unique", "validate", TREES, Mode.ENFORCE,
      "a queue name is used once across Departments, Projects and KAI Queues",
      reads={"Department", "Project", "Queue"}, judges=spec)
@_skip_generated
def check_queue_names(subject: Subject, obj: dict[str, Any], view: ClusterView,
                      policy: Policy) -> list[Finding]:
    """A queue name belongs to one Department or Project (or one unmanaged KAI Queue)."""
    after = After(view, subject, obj)
    if subject.kind != "Queue":
        return _krm_queue_names(subject, obj, after)
    if subject.operation != "CREATE":
        return []  # a Queue's name never changes
    other = _claimed_by(after, after.name, obj)
    if other is None:
        return []
    return [_error("metadata.name",
                    f"queue name {after.name} is already used by {other}; KRM manages that queue. "
                    f"Pick another name")]


# --- kai-namespace-unique (rule 6) ----------------------------------------------------

@rule("kai-namespace-unique", "validate", {PROJECT}, Mode.ENFORCE, "one Project per namespace",
      reads={"Project"}, judges=spec)
@_skip_generated
def check_namespace(subject: Subject, obj: dict[str, Any], view: ClusterView,
                    policy: Policy) -> list[Finding]:
    """One Project per namespace (``spec.namespace``, else ``kai-<name>``)."""
    spec = typed_spec("Project", obj)
    if not isinstance(spec, ProjectSpec):
        return []
    after = After(view, subject, obj)
    namespace = project_namespace(after.name, spec.namespace)
    old = typed_spec("Project", subject.old) if subject.operation == "UPDATE" else None
    if isinstance(old, ProjectSpec) and project_namespace(after.name, old.namespace) == namespace:
        return []
    others = sorted(_name(o) for o in after.by_index(PROJECT_NAMESPACE, namespace) if o is not obj)
    if not others:
        return []
    implicit = "" if spec.namespace else f" (the default for a project named {after.name})"
    return [_error("spec.namespace",
                    f"namespace {namespace}{implicit} is already claimed by project {others[0]}; "
                    f"KRM would mark this project not ready. Set spec.namespace to a namespace no "
                    f"project uses")]


# --- kai-tree-warnings (rule 7) -------------------------------------------------------

def _warn(path: str, text: str) -> Finding:
    # "error" so that enforce mode can deny it; the rule's default mode (warn) shows it.
    return error(path, brief(text))


def _limits_above(child: Slot, cap: Slot, label: str) -> Iterator[Finding]:
    for r in RESOURCES:
        mine, theirs = child.limit(r), cap.limit(r)
        if exceeds(mine, theirs):
            yield _warn(child.field_path(r, "limit"),
                        f"{child.where}: {r} limit {describe(r, mine)} is above {label} "
                        f"{cap.queue}'s {describe(r, theirs)}; the lower limit wins")


def _project_tree(after: After, obj: dict[str, Any]) -> list[Finding]:
    spec = typed_spec("Project", obj)
    if not isinstance(spec, ProjectSpec) or not spec.parent:
        return []
    department = slots("Department", after.get("Department", spec.parent))
    if department is None:
        return []  # kai-structure or kai-schema reports it
    caps = _by_pool(department)
    findings = []
    for slot in slots("Project", obj) or []:
        cap = caps.get(slot.pool)
        if cap is None:
            findings.append(_warn(f"{slot.path}.nodepool",
                                  f"{slot.where}: department {spec.parent} has no queue on this pool, "
                                  f"so this queue is a root no department caps"))
        else:
            findings.extend(_limits_above(slot, cap, "department queue"))
    return findings


def _department_tree(after: After, obj: dict[str, Any]) -> list[Finding]:
    children = _all_slots("Project", after.by_index(PROJECT_PARENT, after.name))
    findings = []
    for slot in slots("Department", obj) or []:
        for r in RESOURCES:
            above = [c for c in children if c.pool == slot.pool and exceeds(c.limit(r), slot.limit(r))]
            if above:
                queues = _plural(len(above), "project queue")
                findings.append(_warn(slot.field_path(r, "limit"),
                                      f"{slot.where}: the {r} limit of {queues} is above the "
                                      f"department's {describe(r, slot.limit(r))}, which wins"))
        limit = slot.limit("gpu")
        if limit == UNLIMITED or limit <= 0 or not _pool_exists(after, slot.pool):
            continue
        cards = pool_capacity(after, slot.pool).cards
        if cards > 0 and limit > cards:
            findings.append(_warn(slot.field_path("gpu", "limit"),
                                  f"{slot.where}: gpu limit {describe('gpu', limit)} is above the "
                                  f"pool's {describe('gpu', cards)}"))
    return findings


def _queue_tree(after: After, obj: dict[str, Any]) -> list[Finding]:
    spec = typed_spec("Queue", obj)
    mine = slots("Queue", obj)
    if not isinstance(spec, KaiQueueSpec) or not mine:
        return []
    findings = []
    parent = slots("Queue", after.get("Queue", spec.parent_queue)) if spec.parent_queue else None
    if parent:
        findings.extend(_limits_above(mine[0], parent[0], "parent queue"))
    children = _all_slots("Queue", after.by_index(QUEUE_PARENT, after.name))
    for r in RESOURCES:
        above = [c for c in children if exceeds(c.limit(r), mine[0].limit(r))]
        if above:
            findings.append(_warn(mine[0].field_path(r, "limit"),
                                  f"{after.name}: the {r} limit of {_plural(len(above), 'child queue')} is "
                                  f"above this queue's {describe(r, mine[0].limit(r))}, which wins"))
    return findings


_TREES: dict[str, Check] = {"Project": _project_tree, "Department": _department_tree,
                            "Queue": _queue_tree}


@rule("kai-tree-warnings", "validate", TREES, Mode.WARN,
      "uncapped project queues, child limits above the parent's, limits above the pool",
      reads={"Department", "Project", "Queue", "NodePool", "Node"}, judges=spec,
      ratchet=Ratchet.DROP)
@_skip_generated
def check_tree(subject: Subject, obj: dict[str, Any], view: ClusterView,
               policy: Policy) -> list[Finding]:
    """Legal but almost always a mistake: a project queue with no department queue
    above it, a child limit above its parent's, a department limit above the pool."""
    return _TREES[subject.kind](After(view, subject, obj), obj)


# --- kai-delete-in-use ----------------------------------------------------------------

@rule("kai-delete-in-use", "validate", KINDS - {PROJECT}, Mode.WARN,
      "deleting a parent, pool or queue that others still use", operations={"DELETE"},
      reads={"Department", "Project", "Queue"})
def check_delete(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    """Deleting what others still point at: a parent department, a pool with queues,
    a queue with children."""
    old = subject.old if isinstance(subject.old, dict) else {}
    if subject.kind == "Queue" and _krm_owned(old):
        return []
    after = After(view, subject, None)
    name = after.name
    if subject.kind == "Department":
        users = sorted(_name(o) for o in after.by_index(PROJECT_PARENT, name))
        text = (f"department {name} is still the parent of {_plural(len(users), 'project')} "
                f"({_names(users)}); move them first")
    elif subject.kind == "NodePool":
        departments = after.by_index(POOL["Department"], name)
        projects = after.by_index(POOL["Project"], name)
        users = [_name(o) for o in departments + projects]
        text = (f"node pool {name} still has queues of {_plural(len(departments), 'department')} and "
                f"{_plural(len(projects), 'project')}; KRM keeps the pool until they move")
    else:
        users = sorted(_name(o) for o in after.by_index(QUEUE_PARENT, name))
        text = f"queue {name} still has {_plural(len(users), 'child queue')} ({_names(users)})"
    if not users:
        return []
    return [_error("metadata.name", brief(text))]
