"""Queues as numbers: every Department, Project or KAI Queue becomes :class:`Slot` values
(one per queue and node pool), remembered by content; and the cards a node pool has."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from app.cluster.view import NODE_LABEL
from app.crds.kai import (
    DEFAULT_POOL,
    RESOURCES,
    ZERO,
    Amounts,
    KaiQueueSpec,
    NodePoolSpec,
    Resource,
    node_cards,
    node_labels,
    queue_name,
)
from app.k8s.util import Memo, digest
from app.rules.base import Subject
from app.rules.quotas.objects import NODE_CARDS, After, is_ours, name_of, spec_input, typed_spec


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


SLOTS_BUDGET = 16 * 2**20
SLOTS_MEMO: Memo[tuple[str, str, bytes], tuple[Slot, ...] | None] = Memo(20_000, SLOTS_BUDGET)
"""Each object's queues by kind, name and the digest of its spec, at most 16 MiB (measured)."""


MISSING = object()


def slots(kind: str, obj: dict[str, Any] | None) -> tuple[Slot, ...] | None:
    """The queues an object declares (None when it does not parse), remembered by the
    object's name and spec content, like :func:`app.crds.kai.parse`."""
    if not isinstance(obj, dict):
        return None
    owner = name_of(obj)
    raw = spec_input(kind, obj)
    try:
        key = (kind, owner, digest(raw))
    except TypeError:
        return build_slots(kind, owner, typed_spec(kind, obj))
    found = SLOTS_MEMO.get(key, MISSING)
    if found is None or isinstance(found, tuple):  # remembered (None too: no slots)
        return found
    return SLOTS_MEMO.put(key, build_slots(kind, owner, typed_spec(kind, obj)))


def build_slots(kind: str, owner: str, spec: Any) -> tuple[Slot, ...] | None:
    if spec is None:
        return None
    if isinstance(spec, KaiQueueSpec):
        return (Slot(kind, owner, owner, "", "spec", spec.priority,
                     {r: spec.amounts(r) for r in RESOURCES}),)
    return tuple(Slot(kind, owner, queue_name(e.name, owner, e.nodepool), e.nodepool,
                      f"spec.queues[{i}]", e.priority, {r: e.amounts(r) for r in RESOURCES})
                 for i, e in enumerate(spec.queues))


def all_slots(kind: str, objects: Iterable[dict[str, Any]]) -> list[Slot]:
    return [s for obj in objects for s in slots(kind, obj) or ()]


def by_pool(found: Iterable[Slot] | None) -> dict[str, Slot]:
    out: dict[str, Slot] = {}
    for slot in found or ():
        out.setdefault(slot.pool, slot)
    return out


def pool_exists(after: After, pool: str) -> bool:
    return pool == DEFAULT_POOL or after.get("NodePool", pool) is not None


@dataclass(frozen=True)
class Capacity:
    nodes: int
    cards: Decimal


CAPACITY_MEMO: Memo[Hashable, Capacity] = Memo(1024, 2**20)


def count_cards(after: After, key: Hashable, nodes: Callable[[], list[dict[str, Any]]],
           select: Callable[[dict[str, Any]], bool] | None = None) -> Capacity:
    """Nodes and cards among ``nodes()`` (those ``select`` keeps), remembered until what
    is counted changes in the view — a Node's labels, cards or group, a Node added or
    removed (``index_version``) — not on a Node's status report, so no request recounts
    them."""
    full_key = (key, after.view.index_version(NODE_LABEL), after.view.index_version(NODE_CARDS))
    found = CAPACITY_MEMO.get(full_key)
    if found is not None:
        return found
    mine = [n for n in nodes() if select(n)] if select else nodes()
    return CAPACITY_MEMO.put(full_key, Capacity(len(mine), sum((node_cards(n) for n in mine), ZERO)))


def label_pairs(after: After) -> frozenset[tuple[str, str]]:
    pairs = set()
    for pool in after.list("NodePool"):
        spec = typed_spec("NodePool", pool)
        if isinstance(spec, NodePoolSpec) and spec.label_key and name_of(pool) != DEFAULT_POOL:
            pairs.add((spec.label_key, spec.label_value or ""))
    return frozenset(pairs)


def outside_pools(pairs: frozenset[tuple[str, str]]) -> Callable[[dict[str, Any]], bool]:
    """A node no labelled pool selects."""
    by_key: dict[str, set[str]] = {}
    for key, value in pairs:
        by_key.setdefault(key, set()).add(value)
    return lambda node: is_ours("Node", node) and not any(
        node_labels(node).get(k) in v for k, v in by_key.items())


def pool_capacity(after: After, pool: str) -> Capacity:
    """Nodes and GPU cards of a node pool, counted on the view's Nodes. The default pool
    is every node no labelled pool selects, the one answer that needs every Node."""
    if pool == DEFAULT_POOL:
        pairs = label_pairs(after)
        return count_cards(after, (DEFAULT_POOL, pairs), lambda: after.view.list("Node"),
                           outside_pools(pairs))
    spec = typed_spec("NodePool", after.get("NodePool", pool))
    if not isinstance(spec, NodePoolSpec) or not spec.label_key:
        return Capacity(0, ZERO)
    pair = f"{spec.label_key}={spec.label_value or ''}"
    return count_cards(after, pair, lambda: after.by_index(NODE_LABEL, pair))


def first_slot(found: tuple[Slot, ...] | None) -> Slot | None:
    return found[0] if found else None


def old_slots(subject: Subject) -> tuple[Slot, ...] | None:
    if subject.operation != "UPDATE" or not isinstance(subject.old, dict):
        return None
    return slots(subject.kind, subject.old)
