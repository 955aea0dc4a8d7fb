"""Nodes, ResourceQuotas and LimitRanges for the tests of the namespace rules."""

from __future__ import annotations

from typing import Any


def quota(hard: dict[str, str], name: str = "compute", ns: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": ns}, "spec": {"hard": hard}}


def node(name: str, cpu: str, memory: str, labels: dict[str, str] | None = None,
         unschedulable: bool = False) -> dict[str, Any]:
    n: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": name, "labels": labels or {}},
                         "status": {"allocatable": {"cpu": cpu, "memory": memory}}}
    if unschedulable:
        n["spec"] = {"unschedulable": True}
    return n


def limitrange(item: dict[str, Any], name: str = "defaults", ns: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name, "namespace": ns},
            "spec": {"limits": [{"type": "Container", **item}]}}
