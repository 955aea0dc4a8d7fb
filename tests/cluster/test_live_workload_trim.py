"""The live view's workload trim (app/cluster/live.py ``trim_workload``) keeps what
namespace-memory-composition reads: judged over trimmed objects, the rule says what it
says over the full ones."""

from __future__ import annotations

import copy
from typing import Any

from app.cluster.live import trim_workload
from app.cluster.view import StaticView
from app.k8s.kinds import KINDS
from tests.conftest import container, run, workload
from tests.helpers.namespace import quota


def _full(kind: str, name: str, memory: str, **spec: Any) -> dict[str, Any]:
    obj = workload(kind, [container(requests={"memory": memory}, limits={"memory": memory},
                                    env=[{"name": "X", "value": "y"}], ports=[{"containerPort": 80}])],
                   name=name)
    obj["metadata"].update(uid=f"uid-{name}", labels={"app": name}, managedFields=[{"manager": "kubectl"}])
    obj["spec"].update(spec)
    return obj


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    return spec["template"]["spec"]  # type: ignore[no-any-return]


def cluster() -> list[dict[str, Any]]:
    web = _full("Deployment", "web", "2Gi", replicas=3)
    current = _full("ReplicaSet", "web-1", "2Gi", replicas=3)
    current["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                               "uid": "uid-web", "controller": True,
                                               "blockOwnerDeletion": True}]
    old = copy.deepcopy(current)
    old["metadata"]["name"] = "web-0"
    old["spec"]["replicas"] = 0
    orphan = _full("ReplicaSet", "orphan", "1Gi", replicas=2)
    orphan["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": "gone", "controller": True}]
    job = _full("Job", "train", "4Gi", parallelism=4, completions=6)
    job["status"] = {"succeeded": 3, "active": 3, "startTime": "2026-12-02T00:00:00Z"}
    done = _full("Job", "done", "64Gi", parallelism=4)
    done["status"] = {"conditions": [{"type": "Complete", "status": "True", "reason": "x"}]}
    cron = _full("CronJob", "nightly", "1Gi", concurrencyPolicy="Forbid", schedule="@daily")
    cron["spec"]["jobTemplate"]["spec"].update(parallelism=2)
    deadline = _full("StatefulSet", "db", "8Gi", replicas=1)
    _spec(deadline).update(activeDeadlineSeconds=30, priorityClassName="high",
                           affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                               {"topologyKey": "zone", "namespaceSelector": {}}]},
                               "nodeAffinity": {"x": 1}})
    rc = _full("ReplicationController", "legacy", "1Gi", replicas=2)
    return [web, current, old, orphan, job, done, cron, deadline, rc]


QUOTAS = [quota({"requests.memory": "10Gi"}, name="all"),
          quota({"limits.memory": "1Gi"}, name="terminating") | {"spec": {
              "hard": {"limits.memory": "1Gi"}, "scopes": ["Terminating"]}},
          quota({"memory": "1Gi"}, name="cross") | {"spec": {
              "hard": {"memory": "1Gi"}, "scopes": ["CrossNamespacePodAffinity"]}}]


def _trimmed(obj: dict[str, Any]) -> dict[str, Any] | None:
    kind = next(k for k in KINDS if k.kind == obj["kind"] and k.api_version == obj["apiVersion"])
    assert kind.trim == "workload", kind
    return trim_workload(kind.name)(copy.deepcopy(obj))


def test_what_runs_no_pods_is_not_kept_and_owners_are() -> None:
    kept = {o["metadata"]["name"]: o for o in (_trimmed(x) for x in cluster()) if o is not None}
    assert sorted(kept) == ["db", "legacy", "nightly", "orphan", "train", "web", "web-1"]
    assert kept["web-1"]["metadata"]["ownerReferences"] == [
        {"kind": "Deployment", "name": "web", "uid": "uid-web", "controller": True}]
    assert "managedFields" not in kept["web"]["metadata"] and kept["web"]["metadata"]["uid"] == "uid-web"


def test_the_rule_says_the_same_over_trimmed_objects() -> None:
    full = cluster()
    trimmed = [t for t in (_trimmed(o) for o in full) if t is not None]
    incoming = _full("Deployment", "api", "1Gi", replicas=1)
    _spec(incoming).update(activeDeadlineSeconds=5, affinity={"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "zone", "namespaces": ["b"]}}]}})

    def said(objs: list[dict[str, Any]]) -> list[str]:
        result = run(incoming, view=StaticView([*QUOTAS, *objs]))
        assert result.internal_errors == []
        return sorted(w.message for w in result.warnings if w.rule == "namespace-memory-composition")

    over_full = said(full)
    assert len(over_full) == 3, over_full  # every quota: the scoped ones count db and api
    # web 6, its ReplicaSet through it, orphan 2, train min(4, 6 - 3) x 4 = 12, done 0,
    # nightly 2, db 8, legacy 2, api 1
    assert any("total 33Gi > quota all" in m for m in over_full), over_full
    assert said(trimmed) == over_full


def test_the_trim_keeps_what_the_admission_plugins_read() -> None:
    """Issue 37: the RuntimeClass whose overhead the quota charges and the class the
    Priority plugin leaves alone survive the trim; a Job another controller runs is not
    kept (it makes no Pod here)."""
    rc = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"},
          "handler": "kata", "overhead": {"podFixed": {"memory": "1Gi"}}}
    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "std"},
          "value": 1, "globalDefault": True}
    sandboxed = _full("Deployment", "sandboxed", "1Gi", replicas=2)
    _spec(sandboxed)["runtimeClassName"] = "kata"
    foreign = _full("Job", "remote", "64Gi", parallelism=4, managedBy="kueue.x-k8s.io/multikueue")
    assert _trimmed(foreign) is None
    q = quota({"requests.memory": "4Gi"}, name="std") | {"spec": {
        "hard": {"requests.memory": "4Gi"},
        "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                                "values": ["std"]}]}}}
    incoming = _full("Deployment", "api", "1Gi", replicas=1)

    def said(objs: list[dict[str, Any]]) -> list[str]:
        result = run(incoming, view=StaticView([q, rc, pc, *objs]))
        assert result.internal_errors == []
        return [w.message for w in result.warnings if w.rule == "namespace-memory-composition"]

    full = said([sandboxed, foreign])
    # sandboxed: 2 x (1Gi + 1Gi overhead); every Pod gets the default class "std"
    assert full == ["sandboxed 2 x 2Gi = 4Gi, api 1 x 1Gi = 1Gi, total 5Gi > quota std requests.memory 4Gi"]
    trimmed = [t for t in (_trimmed(o) for o in (sandboxed, foreign)) if t is not None]
    assert said(trimmed) == full
