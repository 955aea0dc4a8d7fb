"""ActorTemplates and WorkerPools, and judging them, for the tests of the actor rules."""

from __future__ import annotations

import copy
from typing import Any

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import Evaluation, check_object
from app.rules.base import Subject
from tests.conftest import RULES

NS = "team-a"


def template(limits: dict[str, Any] | None = None, cls: str | None = "microvm", name: str = "agent",
             namespace: str = NS, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"snapshotsConfig": {"location": "gs://snapshots/team-a"},
                            "containers": [{"name": "main", "image": "registry.example/agent@sha256:00"}]}
    if cls is not None:
        body["sandboxClass"] = cls
    if limits is not None:
        body["resources"] = {"limits": dict(limits)}
    body.update(copy.deepcopy(spec))
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"name": name, "namespace": namespace}, "spec": body}


def pool(limits: dict[str, Any] | None = None, cls: str | None = "microvm", name: str = "workers",
         namespace: str = NS, labels: dict[str, str] | None = None,
         requests: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"replicas": 2, "ateomImage": "registry.example/ateom@sha256:00"}
    if cls is not None:
        body["sandboxClass"] = cls
    resources = {k: dict(v) for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    if resources:
        body["template"] = {"resources": resources}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        meta["labels"] = dict(labels)
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool", "metadata": meta, "spec": body}


def run(obj: dict[str, Any], cluster: list[dict[str, Any]] | None = None, operation: str = "CREATE",
        old: dict[str, Any] | None = None, policy: Policy | None = None,
        view: StaticView | None = None) -> Evaluation:
    meta = obj["metadata"]
    subject = Subject("ate.dev", "v1alpha1", obj["kind"], operation, meta["namespace"], meta["name"],
                      obj, old)
    return check_object(RULES, subject, view or StaticView(cluster or []), policy or Policy())


def by_rule(result: Evaluation, rule: str) -> list[str]:
    return [f"{f.severity}: {f.message}" for f in result.findings if f.rule == rule]


ROOMY = pool({"cpu": "8", "memory": "16Gi"}, name="roomy")
