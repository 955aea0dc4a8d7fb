"""Objects and a runner for the tests of `envelope audit`."""

from __future__ import annotations

from typing import Any

from app.audit import JUDGED, Audit, judge
from app.cluster.view import StaticView
from app.core.config import load_policy
from app.core.ruleset import default_ruleset

RULES = default_ruleset()


DEPLOYMENT = next(j for j in JUDGED if j.kind == "Deployment")


QUEUE = next(j for j in JUDGED if j.kind == "Queue")


def deployment(name: str, resources: dict[str, Any], namespace: str = "team-a",
               **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **meta},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "app", "image": "registry.example/app:1", "resources": resources}]}}}}


CPU_LIMIT = deployment("cpu", {"requests": {"cpu": "1", "memory": "1Gi"},
                               "limits": {"cpu": "2", "memory": "1Gi"}})


MEMORY_SPLIT = deployment("mem", {"requests": {"cpu": "1", "memory": "1Gi"},
                                  "limits": {"memory": "2Gi"}})


GOOD = deployment("ok", {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}})


def run(objs: list[dict[str, Any]], policy_env: dict[str, str] | None = None) -> Audit:
    policy = load_policy(None, policy_env or {}, RULES)
    view = StaticView(objs, RULES.indexes)
    out = Audit(started=1_700_000_000.25)
    for obj in objs:
        judged = QUEUE if obj["kind"] == "Queue" else DEPLOYMENT
        judge(RULES, view, policy, obj, judged, out)
    return out
