"""Nodes an autoscaler can still create (issue 12, class 10).

``pod-fits-node`` refuses a pod no node can take; on a cluster that grows with Karpenter
or cluster-autoscaler, "no current node" is not "no node". This says which new nodes
could take a pod, from two sources: the policy's ``nodes.autoscaledShapes`` (judged
exactly like a Node, ``app.k8s.scheduling.node_shape``) and Karpenter NodePools
(``karpenter.sh/v1``), which do not say how big their nodes are, so what they give is an
upper bound: the labels and taints of ``spec.template``, room from ``spec.limits`` less
``status.resources``, and *open* label keys a pod may select on without being refused.
What is read of a NodePool, and why a warning and never a refusal: docs/fidelity.md,
"Autoscaled clusters (class 10)".

Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from app.k8s import kinds
from app.k8s.disclosure import pool_reference, pool_room
from app.k8s.quantity import QuantityError, format_units, parse_quantity
from app.k8s.scheduling import (
    NOT_SELECTED,
    Node,
    NodeVerdict,
    clamp_quantity,
    counted_requests,
    fit_node,
    node_shape,
    scheduler_units,
)

__all__ = ["KARPENTER_GROUP", "KARPENTER_NODEPOOL", "WELL_KNOWN_OPEN", "PoolShape", "ScaleUp",
           "karpenter_pools", "pod_label_keys", "policy_nodes", "pool_shape", "scale_up"]

KARPENTER_GROUP = "karpenter.sh"
KARPENTER_NODEPOOL = kinds.KARPENTER_NODEPOOL
"""The view name of Karpenter NodePools (``app.k8s.kinds``): KAI has a kind named NodePool
too (``kai.resources``), named ``NodePool``; every view files objects by (group, kind)."""

NODEPOOL_LABEL = "karpenter.sh/nodepool"

WELL_KNOWN_OPEN = frozenset({
    "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type", "kubernetes.io/arch", "kubernetes.io/os",
    "karpenter.sh/capacity-type", "node.kubernetes.io/windows-build",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "beta.kubernetes.io/arch", "beta.kubernetes.io/os",
})
"""Karpenter's well-known labels (``pkg/apis/v1/labels.go`` ``WellKnownLabels``): a
pod may select them without the pool naming them; the value comes from the instance
type or the zone chosen. Provider labels (any key whose domain ends in
``karpenter.k8s.aws``, ``karpenter.azure.com`` and the like: ``*karpenter*``) count as
well known too."""


def _is_well_known(key: str) -> bool:
    domain = key.partition("/")[0] if "/" in key else ""
    return key in WELL_KNOWN_OPEN or ("karpenter" in domain and key != NODEPOOL_LABEL)


def karpenter_pools(*lists: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Karpenter NodePools among objects of kind NodePool (by apiVersion group)."""
    out = []
    for objects in lists:
        for obj in objects:
            api = obj.get("apiVersion")
            if isinstance(api, str) and api.partition("/")[0] == KARPENTER_GROUP:
                out.append(obj)
    return out


@dataclass(frozen=True)
class PoolShape:
    """What a Karpenter NodePool says about the nodes it can create."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    cap: Mapping[str, int]
    """Scheduler units left under ``spec.limits`` per limited resource (may be <= 0)."""
    open_keys: frozenset[str]
    closed_keys: frozenset[str]
    """Keys a requirement ``DoesNotExist`` keeps off its nodes."""


def _dig(obj: Mapping[str, Any], *path: str) -> Any:
    node: Any = obj
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def _units(raw: Any) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            try:
                out[str(name)] = clamp_quantity(parse_quantity(value))
            except QuantityError:
                continue
    return out


def pool_shape(pool: Mapping[str, Any]) -> PoolShape:
    """A Karpenter NodePool as the nodes it can create (see the module docstring)."""
    name = str(_dig(pool, "metadata", "name") or "")
    labels: dict[str, str] = {}
    raw_labels = _dig(pool, "spec", "template", "metadata", "labels")
    if isinstance(raw_labels, Mapping):
        labels.update({str(k): str(v) for k, v in raw_labels.items()})
    open_keys: set[str] = set()
    closed: set[str] = set()
    for req in _dig(pool, "spec", "template", "spec", "requirements") or []:
        if not isinstance(req, Mapping) or not isinstance(req.get("key"), str):
            continue
        key, op = req["key"], req.get("operator")
        values = [str(v) for v in req.get("values") or []]
        if op == "In" and len(values) == 1:
            labels[key] = values[0]
        elif op == "DoesNotExist":
            closed.add(key)
        elif key not in labels:
            open_keys.add(key)
    labels[NODEPOOL_LABEL] = name
    taints = tuple(t for t in _dig(pool, "spec", "template", "spec", "taints") or []
                   if isinstance(t, Mapping))
    limits = _units(_dig(pool, "spec", "limits"))
    used = _units(_dig(pool, "status", "resources"))
    cap = {res: scheduler_units(res, limit - used.get(res, Decimal(0))) for res, limit in limits.items()}
    return PoolShape(name=name, labels=labels, taints=taints, cap=cap,
                     open_keys=frozenset(open_keys - set(labels)), closed_keys=frozenset(closed))


def pod_label_keys(spec: Mapping[str, Any]) -> set[str]:
    """Label keys the pod's nodeSelector and required node affinity select on."""
    keys: set[str] = set()
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        keys.update(str(k) for k in selector)
    terms = _dig(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                 "nodeSelectorTerms")
    for term in terms if isinstance(terms, list) else []:
        for expr in (term.get("matchExpressions") or []) if isinstance(term, Mapping) else []:
            if isinstance(expr, Mapping) and isinstance(expr.get("key"), str):
                keys.add(expr["key"])
    return keys


@dataclass(frozen=True)
class ScaleUp:
    """A new node that would take the pod: ``source`` names it for the message."""

    source: str
    verdict: NodeVerdict
    uncertain: bool = False
    """True when it depends on a label a new node may or may not get (an open key)."""


def policy_nodes(shapes: Sequence[Any], reserve_cpu_units: int, reserve_memory: int) -> list[Node]:
    """``nodes.autoscaledShapes`` as potential Nodes, the node reserves taken off."""
    out = []
    for shape in shapes:
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in shape.taints]
        node = node_shape(shape.name, shape.allocatable, labels=shape.labels, taints=taints)
        alloc = dict(node.allocatable)
        alloc["cpu"] = alloc.get("cpu", 0) - reserve_cpu_units
        alloc["memory"] = alloc.get("memory", 0) - reserve_memory
        alloc.setdefault("pods", 110)
        out.append(Node(name=node.name, allocatable=alloc, labels=node.labels, taints=node.taints,
                        potential=True))
    return out


def _pool_node(shape: PoolShape, counted: Mapping[str, int]) -> Node:
    """An empty node as large as the pod needs on every resource the pool does not
    limit, and at most what is left under each limit."""
    alloc = {res: shape.cap.get(res, want) for res, want in counted.items()}
    nodes_left = shape.cap.get("nodes")
    alloc["pods"] = shape.cap.get("pods", 1) if nodes_left is None or nodes_left >= 1 else 0
    return Node(name=shape.name, allocatable=alloc, labels=shape.labels, taints=shape.taints,
                potential=True)


def scale_up(spec: Mapping[str, Any], requests: Mapping[str, Decimal], *, shapes: Iterable[Node] = (),
             pools: Iterable[PoolShape] = (),
             name_pools: bool = False) -> tuple[ScaleUp | None, list[str]]:
    """The first new node that would take the pod: a policy shape (exact), else a
    Karpenter NodePool (bounded by its limits; ``uncertain`` when the pod selects on a
    key the pool leaves open). Also, for a refusal message, why each one does not.
    NodePools are cluster-scoped: unless ``name_pools`` (``nodes.nameInMessages``), the
    text names none and says no room left under a limit (app/k8s/disclosure.py)."""
    why_not: list[str] = []
    for node in shapes:
        verdict = fit_node(spec, node, requests)
        if verdict.fits:
            return ScaleUp(f"autoscaled shape {node.name}", verdict), why_not
        why_not.append(f"shape {node.name}: {_reason(verdict)}")
    counted = {res: units for res, units in counted_requests(requests).items() if units > 0}
    keys = pod_label_keys(spec)
    for shape in pools:
        node = _pool_node(shape, counted)
        verdict = fit_node(spec, node, requests)
        source = pool_reference(shape.name, name_pools)
        if verdict.fits:
            return ScaleUp(source, verdict), why_not
        open_selected = {k for k in keys if k in shape.open_keys or _is_well_known(k)} \
            - set(shape.labels) - shape.closed_keys
        if verdict.blocked == (NOT_SELECTED,) and open_selected:
            # Judge again as if each open key took the value the pod asks for.
            relaxed = fit_node(_without_keys(spec, open_selected), node, requests)
            if relaxed.fits:
                return ScaleUp(source, relaxed, uncertain=True), why_not
        if name_pools:
            why_not.append(f"NodePool {shape.name}: {_reason(verdict, 'left under its limits')}")
        else:
            reason = "; ".join([*verdict.blocked, *(pool_room(s.resource, s.requested, s.free, False)
                                                    for s in verdict.shortfalls)])
            item = f"{pool_reference(shape.name, False)}: {reason}"
            if item not in why_not:
                why_not.append(item)
    return None, why_not


def _without_keys(spec: Mapping[str, Any], keys: set[str]) -> dict[str, Any]:
    """The pod spec with its node selection on ``keys`` taken out: a nodeSelector entry
    goes; an expression goes from its term, and a term left with nothing (it held only
    such expressions) matches any node, so the required affinity goes."""
    out = dict(spec)
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        out["nodeSelector"] = {k: v for k, v in selector.items() if k not in keys}
    terms = _dig(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                 "nodeSelectorTerms")
    if not isinstance(terms, list):
        return out
    kept: list[Any] = []
    for term in terms:
        if not isinstance(term, Mapping):
            kept.append(term)
            continue
        exprs = term.get("matchExpressions") or []
        left = [e for e in exprs if not (isinstance(e, Mapping) and e.get("key") in keys)]
        if exprs and not left and not term.get("matchFields"):
            kept = []  # this term is met: the whole requirement is
            break
        kept.append({**term, "matchExpressions": left})
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    if kept:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": kept}
    else:
        node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    affinity["nodeAffinity"] = node_affinity
    out["affinity"] = affinity
    return out


def _reason(verdict: NodeVerdict, room: str = "allocatable") -> str:
    parts = list(verdict.blocked)
    parts += [f"{s.resource} {format_units(s.resource, s.requested)} requested, "
              f"{format_units(s.resource, max(s.free, 0))} {room}"
              for s in verdict.shortfalls]
    return "; ".join(parts)
