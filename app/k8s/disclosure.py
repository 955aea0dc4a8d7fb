"""What a message may say about objects the caller may not be able to read.

A user who may create a Deployment in namespace A gets Envelope's answer for it; the
answer must carry the numbers they need to fix the object, but nothing about the
cluster they could not see with their own RBAC. Node names are such a thing (Nodes
are cluster-scoped; namespace users usually cannot list them): when a message needs
to point at a node, it describes the node's shape instead."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from app.k8s.quantity import format_bytes, format_cpu
from app.k8s.scheduling import Node

__all__ = ["node_reference", "node_shape", "pool_reference", "pool_room"]

_BYTES = ("memory", "ephemeral-storage")


def _amount(resource: str, units: int) -> str:
    if resource == "cpu":
        return format_cpu(Decimal(units) / 1000)
    if resource in _BYTES or resource.startswith("hugepages-"):
        return format_bytes(Decimal(units))
    return str(units)


def node_shape(node: Node, also: Iterable[str] = ()) -> str:
    """``a node with 16 cpu, 32Gi memory`` (+ each resource of ``also`` it has):
    the node's allocatable as the scheduler judged it, never its name or labels."""
    names = ["cpu", "memory", *(r for r in dict.fromkeys(also) if r not in ("cpu", "memory"))]
    parts = [f"{_amount(r, node.allocatable.get(r, 0))} {r}" for r in names]
    return "a node with " + ", ".join(parts)


def node_reference(node: Node, name_in_messages: bool, also: Iterable[str] = ()) -> str:
    """How a message refers to ``node``: its name when the policy allows it
    (``nodes.nameInMessages``), its shape otherwise."""
    return node.name if name_in_messages else node_shape(node, also)


def pool_reference(name: str, name_in_messages: bool) -> str:
    """How a message refers to a Karpenter NodePool: ``Karpenter NodePool "gpu"`` when
    the policy allows names, ``a Karpenter NodePool`` otherwise."""
    return f'Karpenter NodePool "{name}"' if name_in_messages else "a Karpenter NodePool"


def pool_room(resource: str, requested: int, left: int, name_in_messages: bool) -> str:
    """A resource a NodePool's limits leave too little of: the pod's request (the user's
    own number) and, only when the policy allows it, what is left under the limits (the
    cluster's spend against them)."""
    asked = f"{resource} {_amount(resource, requested)} requested"
    if name_in_messages:
        return f"{asked}, {_amount(resource, max(left, 0))} left under its limits"
    return f"{asked}, more than its limits leave"
