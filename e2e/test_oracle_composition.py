"""Composition oracle: what ``namespace-memory-composition`` charges a quota for one Pod of
a template against what the API server's ResourceQuota admission charges (issue 37,
classes 1 and 2).

Each case is a fresh namespace out of the webhook's path with one or two memory quotas
(``requests.memory``, ``limits.memory``; unscoped, or scoped ``PriorityClass``
In/NotIn/Exists/DoesNotExist), ``status.hard`` and ``used: 0`` written as the absent
quota controller would, sometimes a LimitRange with memory defaults, and a Deployment
template of one replica whose Pod may name a RuntimeClass with ``overhead.podFixed``
(the RuntimeClass plugin copies it into the Pod; the quota charges it) and names no
PriorityClass (a ``globalDefault`` one exists for the run: the Priority plugin gives it
to the Pod and the scopes match it). The Deployment is judged through the engine
(mutate, then validate) against the same objects, and a Pod of the template Envelope
stores (its mutations applied: a memory limit from the request, say) is created
(``dryRun=All``) in that namespace: the API server refuses it with ``exceeded quota``
exactly when the rule warns that the namespace's total exceeds a quota. Pods refused
for another reason (a ``limits.memory`` quota needs a memory limit on every container)
are not compared.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import oracle_cases
from oracle import (
    create,
    global_default_priority_class,
    isolated_namespace,
    parallel,
    priority_classes,
    status_message,
)

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.core.ruleset import default_ruleset
from app.rules.base import Subject
from harness import Cluster

DEFAULT_CASES = 160
RULES = default_ruleset()
RULE = "namespace-memory-composition"
RUNTIME_CLASS = "oracle-comp-rc"
OVERHEAD = {"cpu": "250m", "memory": "384Mi"}
DEFAULT_CLASS = "oracle-comp-default"
OTHER_CLASS = "oracle-comp-other"
MEMORY = ("64Mi", "128Mi", "256Mi", "512Mi", "1Gi")
HARD = ("256Mi", "384Mi", "512Mi", "640Mi", "768Mi", "1Gi", "1280Mi", "1536Mi", "2Gi")


@dataclass
class Case:
    index: int
    quotas: list[dict[str, Any]] = field(default_factory=list)
    limit_ranges: list[dict[str, Any]] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    namespace: str = ""


def _quota(rng: random.Random, name: str) -> dict[str, Any]:
    hard = {key: rng.choice(HARD) for key in rng.choice((("requests.memory",), ("limits.memory",),
                                                          ("requests.memory", "limits.memory")))}
    spec: dict[str, Any] = {"hard": hard}
    if rng.random() < 0.4:
        op = rng.choice(("In", "NotIn", "Exists", "DoesNotExist"))
        expr: dict[str, Any] = {"scopeName": "PriorityClass", "operator": op}
        if op in ("In", "NotIn"):
            expr["values"] = [rng.choice((DEFAULT_CLASS, OTHER_CLASS))]
        spec["scopeSelector"] = {"matchExpressions": [expr]}
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": spec}


def _container(rng: random.Random, name: str) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.5:
        resources = {"requests": {"memory": rng.choice(MEMORY)}}
        resources["limits"] = {"memory": resources["requests"]["memory"]}
    elif roll < 0.75:
        resources = {"requests": {"memory": rng.choice(MEMORY)}}
    elif roll < 0.9:
        resources = {"limits": {"memory": rng.choice(MEMORY)}}
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": resources}


def generate(index: int, seed: int) -> Case:
    rng = random.Random(f"composition-{seed}-{index}")
    case = Case(index)
    case.quotas = [_quota(rng, f"q{i}") for i in range(rng.choice((1, 1, 2)))]
    if rng.random() < 0.3:
        case.limit_ranges = [{"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
                              "spec": {"limits": [{"type": "Container", "default": {"memory": "512Mi"},
                                                   "defaultRequest": {"memory": "256Mi"}}]}}]
    case.spec = {"containers": [_container(rng, f"c{i}") for i in range(rng.choice((1, 1, 2)))]}
    if rng.random() < 0.5:
        case.spec["runtimeClassName"] = RUNTIME_CLASS
    if rng.random() < 0.15:
        case.spec["priorityClassName"] = OTHER_CLASS
    return case


def _setup(cluster: Cluster, case: Case) -> str | None:
    case.namespace = isolated_namespace(cluster, f"oracle-comp-{case.index}")
    for lr in case.limit_ranges:
        status, body = create(cluster, case.namespace, "limitranges", lr)
        if status != 201:
            return f"LimitRange refused: {status_message(body)}"
    for quota in case.quotas:
        status, body = create(cluster, case.namespace, "resourcequotas", quota)
        if status != 201:
            return f"ResourceQuota refused: {status_message(body)}"
        hard = quota["spec"]["hard"]
        quota["status"] = {"hard": hard, "used": dict.fromkeys(hard, "0")}
        status, body = cluster.api(
            "PATCH", f"/api/v1/namespaces/{case.namespace}/resourcequotas/{quota['metadata']['name']}/status",
            {"status": quota["status"]}, content_type="application/merge-patch+json")
        assert status == 200, body
    return None


def _runtime_class(cluster: Cluster) -> dict[str, Any]:
    body = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_CLASS},
            "handler": "runc", "overhead": {"podFixed": OVERHEAD}}
    status, got = cluster.api("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{RUNTIME_CLASS}")
    if status == 404:
        status, got = cluster.api("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
        assert status == 201, got
    return body


def _other_class(cluster: Cluster) -> None:
    status, _ = cluster.api("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{OTHER_CLASS}")
    if status == 404:
        status, got = cluster.api("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": OTHER_CLASS}, "value": 100})
        assert status == 201, got


def _judged(case: Case, cluster_objects: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """The rule's findings on a one-replica Deployment of the case's template, through
    the engine, against the case's quotas and LimitRanges and the cluster's classes; and
    the template's pod spec as Envelope lets it be stored."""
    meta = {"name": "w", "namespace": case.namespace}
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
           "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": case.spec}}}
    objects = [{**o, "metadata": {**o["metadata"], "namespace": case.namespace}}
               for o in (*case.quotas, *case.limit_ranges)]
    view = StaticView([*objects, *cluster_objects])
    result = check_object(RULES, Subject("apps", "v1", "Deployment", "CREATE", case.namespace,
                                                     "w", obj, None), view, Policy())
    assert result.internal_errors == [] and result.obj is not None
    return ([f.message for f in [*result.warnings, *result.errors] if f.rule == RULE],
            result.obj["spec"]["template"]["spec"])


def test_composition_oracle(cluster: Cluster, oracle_seed: int, request: pytest.FixtureRequest) -> None:
    runtime_class = _runtime_class(cluster)
    _other_class(cluster)
    try:
        with global_default_priority_class(cluster, DEFAULT_CLASS):
            _composition_oracle(cluster, oracle_seed, request, runtime_class)
    finally:
        cluster.api("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{RUNTIME_CLASS}")


def _composition_oracle(cluster: Cluster, oracle_seed: int, request: pytest.FixtureRequest,
                        runtime_class: dict[str, Any]) -> None:
    cases = [generate(i, oracle_seed) for i in range(oracle_cases(request, DEFAULT_CASES))]
    started = time.monotonic()
    setups = parallel(lambda c: _setup(cluster, c), cases)
    invalid = {c.index: why for c, why in zip(cases, setups, strict=True) if why}
    live = [c for c in cases if c.index not in invalid]
    time.sleep(1.5)  # the admission plugins' informers see the new objects
    cluster_objects = [*priority_classes(cluster), runtime_class]
    verdicts = {c.index: _judged(c, cluster_objects) for c in live}

    def judge(case: Case) -> tuple[int, str]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
               "spec": verdicts[case.index][1]}
        status, body = create(cluster, case.namespace, "pods", pod, dry_run=True)
        return status, "" if status == 201 else status_message(body)

    disagreements: list[str] = []
    exceeded = judged = other = overhead = 0
    for case, (status, message) in zip(live, parallel(judge, live), strict=True):
        if status != 201 and "exceeded quota" not in message:
            other += 1  # e.g. "must specify limits.memory": not the composition's question
            continue
        judged += 1
        refused = status != 201
        exceeded += refused
        overhead += "runtimeClassName" in case.spec
        warned, stored = verdicts[case.index]
        if bool(warned) != refused:
            disagreements.append(
                f"case {case.index}: {RULE} {'warns ' + warned[0] if warned else 'is silent'}; API server: "
                f"{'refused: ' + message if refused else 'accepted'} the Pod\n"
                f"  quotas={[q['spec'] for q in case.quotas]}\n"
                f"  limitranges={[lr['spec'] for lr in case.limit_ranges]}\n  pod={case.spec}\n"
                f"  stored={stored}")
    print(f"composition oracle: {judged} cases judged ({len(invalid)} invalid, {other} Pods refused for "
          f"something else), {exceeded} refused for exceeding a quota, {overhead} with RuntimeClass "
          f"overhead, seed {oracle_seed}, {time.monotonic() - started:.1f}s, "
          f"{len(disagreements)} disagreements")
    for index, why in list(invalid.items())[:5]:
        print(f"case {index} invalid: {why}")
    assert not disagreements, "\n".join(disagreements[:10])
    assert judged >= len(cases) // 3, f"only {judged} cases judged"
    assert 0 < exceeded < judged, "the generator must produce both outcomes"


def test_a_zero_memory_limit_takes_limits_memory_out_of_the_quota_charge_since_1_38(
        cluster: Cluster, kube_minor: int) -> None:
    """A recorded disagreement (docs/fidelity.md, the version matrix): from v1.38.0-beta.0
    the quota charges no ``limits.memory`` for a Pod one of whose containers limits memory
    to 0 (component-helpers ``PodLimits`` -> ``AggregateContainerLimits`` ->
    ``omitPartiallySetCPUMemLimits``, kubernetes #141014); up to 1.37 it charges the sum.
    ``namespace-memory-composition`` models the newest supported minor (1.37) and warns on
    both. When 1.38 becomes the default, this row says the rule must follow it."""
    case = Case(index=9000)
    case.quotas = [{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "mem"},
                    "spec": {"hard": {"limits.memory": "1Gi"}}}]
    image = "registry.k8s.io/pause:3.10"
    memory = {"memory": "1536Mi"}
    case.spec = {"containers": [
        {"name": "a", "image": image, "resources": {"requests": memory, "limits": memory}},
        {"name": "b", "image": image, "resources": {"requests": {"memory": "0"}, "limits": {"memory": "0"}}}]}
    assert _setup(cluster, case) is None
    time.sleep(1.5)  # the quota admission's informer sees the quota
    warned, stored = _judged(case, priority_classes(cluster))
    assert warned, "namespace-memory-composition charges 1536Mi against limits.memory 1Gi"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": stored}
    status, body = create(cluster, case.namespace, "pods", pod, dry_run=True)
    if kube_minor < 38:
        assert status == 403 and "exceeded quota" in status_message(body), (status, body)
    else:
        assert status == 201, (kube_minor, status_message(body))
