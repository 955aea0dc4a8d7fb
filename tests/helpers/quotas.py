"""Quota objects (KAI Queues, Run:ai Departments and Projects, Karpenter NodePools, Nodes)
and judging them, for the tests of the quota rules."""

from __future__ import annotations

from typing import Any

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import Evaluation, check_object
from app.rules.base import Subject
from tests.conftest import RULES

KRM = "kai.resources/v1alpha1"


KAI = "scheduling.run.ai/v2"


Pair = tuple[float | str, float | str]


def entry(name: str, pool: str = "rtx", gpu: Pair | None = (0, -1), cpu: Pair | None = (0, -1),
          memory: Pair | None = (0, -1), weight: float = 1, **extra: Any) -> dict[str, Any]:
    resources = {r: {"deserved": pair[0], "limit": pair[1], "overQuotaWeight": weight}
                 for r, pair in (("gpu", gpu), ("cpu", cpu), ("memory", memory)) if pair is not None}
    return {"name": name, "nodepool": pool, "resources": resources, **extra}


def department(name: str, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": KRM, "kind": "Department", "metadata": {"name": name},
            "spec": {"queues": list(entries)}}


def project(name: str, parent: str, *entries: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"queues": list(entries), **spec}
    if parent:
        body["parent"] = parent
    return {"apiVersion": KRM, "kind": "Project", "metadata": {"name": name}, "spec": body}


def nodepool(name: str, key: str = "pool", value: str | None = None) -> dict[str, Any]:
    return {"apiVersion": KRM, "kind": "NodePool", "metadata": {"name": name},
            "spec": {"labelKey": key, "labelValue": value or name}}


def node(name: str, cards: int | str = 4, pool: str | None = None, source: str = "allocatable",
         **labels: str) -> dict[str, Any]:
    all_labels = {**({"pool": pool} if pool else {}), **labels}
    status = {source: {"nvidia.com/gpu": str(cards)}} if source != "label" else {}
    if source == "label":
        all_labels["nvidia.com/gpu.count"] = str(cards)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": all_labels},
            "status": status}


def queue(name: str, parent: str = "", gpu: Pair | None = (0, -1), owner: str | None = None,
          **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {**spec}
    if gpu is not None:
        body["resources"] = {"gpu": {"quota": gpu[0], "limit": gpu[1], "overQuotaWeight": 1}}
    if parent:
        body["parentQueue"] = parent
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": KRM, "kind": "Project", "name": owner, "uid": "u"}]
    return {"apiVersion": KAI, "kind": "Queue", "metadata": meta, "spec": body}


def base() -> list[dict[str, Any]]:
    """Pool rtx: 2 nodes of 4 cards. Departments platform and research, 4 cards each;
    platform's projects hold 3 + 1 of its 4."""
    return [
        nodepool("rtx"), node("rtx-1", 4, pool="rtx"), node("rtx-2", 4, pool="rtx"),
        department("platform", entry("platform-rtx", gpu=(4, 8))),
        department("research", entry("research-rtx", gpu=(4, 8))),
        project("workspace", "platform", entry("workspace-rtx", gpu=(3, 4))),
        project("benchmark", "platform", entry("benchmark-rtx", gpu=(1, 4))),
        queue("inference", gpu=(4, 8)),
        queue("online", "inference", gpu=(3, 4)),
        queue("batch", "inference", gpu=(1, 4)),
    ]


def judge(obj: dict[str, Any] | None, operation: str = "CREATE", old: dict[str, Any] | None = None,
          cluster: list[dict[str, Any]] | None = None, policy: Policy | None = None) -> Evaluation:
    """What the webhook answers: the view holds the cluster (and ``old``, as cached)."""
    view = StaticView(base() if cluster is None else cluster)
    if old is not None:
        view.add(old)
    target = obj if obj is not None else old
    assert target is not None
    group, _, version = target["apiVersion"].rpartition("/")
    subject = Subject(group, version, target["kind"], operation, "", target["metadata"]["name"],
                      obj, old)
    result = check_object(RULES, subject, view, policy or Policy())
    assert not result.internal_errors, result.internal_errors
    for warning in result.warnings:
        assert len(warning.message) < 120, warning.message
    return result
