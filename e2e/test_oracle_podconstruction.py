"""Pod-construction oracle: Envelope's model of the Pods a template makes
(app/k8s/podmodel.py ``pod_of``, ``concurrent``) against the Pods a real
kube-controller-manager and kube-apiserver make (issue #28).

Generated Deployments, StatefulSets, DaemonSets and Jobs (parallelism, completions,
Indexed, suspended), some naming a RuntimeClass with overhead and scheduling (one whose
nodeSelector conflicts with the template's), with tolerations, hostNetwork, labels and
annotations on the template and on the workload, in namespaces with and without
LimitRange defaults — out of the webhook's path, so the stored Pods are what the admission
plugins make of them, which is what Envelope's Pod webhook receives. Compared per Pod:
container resources, overhead, tolerations, nodeSelector, the template's labels and
annotations (and none of the workload's own), the PriorityClass and priority (a
``globalDefault`` class exists for the run: the Priority plugin gives it to every Pod
that names none; issue 37); per workload: how many Pods run — none for a Job whose
``managedBy`` names another controller (issue 37, class 3) — and refused Pods where the
model says an admission plugin refuses them.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from conftest import RUNTIME_CLASS, Converging, oracle_cases
from oracle import global_default_priority_class, parallel, priority_classes, status_message

import harness
from app.k8s.podmodel import concurrent, pod_of
from app.k8s.quantity import parse_quantity

DEFAULT_CASES = 80
LABEL = "envelope.test/podc"
SETUPS: tuple[list[dict[str, Any]], ...] = (
    [],
    [{"type": "Container", "default": {"memory": "512Mi", "cpu": "1"},
      "defaultRequest": {"memory": "256Mi", "cpu": "250m"}}],
    [{"type": "Container", "max": {"memory": "2Gi"}}],
)
KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
PLURAL = {"Deployment": "deployments", "StatefulSet": "statefulsets", "DaemonSet": "daemonsets",
          "Job": "jobs"}
API = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1", "Job": "batch/v1"}


def _resources(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    requests = {k: v for k, v in (("cpu", rng.choice((None, "100m", "500m"))),
                                  ("memory", rng.choice((None, "128Mi", "300Mi")))) if v}
    limits = {k: v for k, v in (("cpu", rng.choice((None, "1", "2"))),
                                ("memory", rng.choice((None, "300Mi", "1Gi")))) if v}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def generate(index: int, seed: int) -> tuple[int, dict[str, Any]]:
    rng = random.Random(seed * 7_919 + index)
    kind = KINDS[index % len(KINDS)]
    name = f"p{index}"
    spec: dict[str, Any] = {
        "schedulerName": harness.SCHEDULER_NAME, "terminationGracePeriodSeconds": 0,
        "containers": [{"name": f"c{i}", "image": "registry.k8s.io/pause:3.10", "resources": _resources(rng)}
                       for i in range(rng.choice((1, 2)))]}
    if rng.random() < 0.3:
        spec["tolerations"] = rng.choice((
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": 60}],
            [{"operator": "Exists"}]))
    if rng.random() < 0.3:
        spec["runtimeClassName"] = RUNTIME_CLASS
        if rng.random() < 0.3:
            spec["nodeSelector"] = {"envelope.test/pool": "gpu"}  # conflicts with the class's
    if kind == "DaemonSet" and rng.random() < 0.3:
        spec["hostNetwork"] = True
    if kind == "DaemonSet" and rng.random() < 0.2 and "nodeSelector" not in spec:
        spec["nodeSelector"] = {"envelope.test/pool": rng.choice(("gpu", "none-such"))}
    if kind == "Job":
        spec["restartPolicy"] = "Never"
    labels = {LABEL: name, "app": name}
    template = {"metadata": {"labels": dict(labels), "annotations": {"envelope.test/template": name}},
                "spec": spec}
    obj: dict[str, Any] = {"apiVersion": API[kind], "kind": kind,
                           "metadata": {"name": name, "labels": dict(labels),
                                        "annotations": {"envelope.test/workload-only": "x"}},
                           "spec": {"template": template}}
    if kind != "Job":
        obj["spec"]["selector"] = {"matchLabels": dict(labels)}
    if kind in ("Deployment", "StatefulSet"):
        obj["spec"]["replicas"] = rng.choice((1, 2, 3))
    if kind == "StatefulSet":
        obj["spec"].update(serviceName=name, podManagementPolicy="Parallel")
    if kind == "Job":
        obj["spec"].update(parallelism=rng.choice((1, 2, 3)), backoffLimit=0)
        completions = rng.choice((None, 1, 2, 5))
        if completions is not None:
            obj["spec"]["completions"] = completions
            if rng.random() < 0.3:
                obj["spec"]["completionMode"] = "Indexed"
        if rng.random() < 0.2:
            obj["spec"]["suspend"] = True
        if random.Random(f"managed-{seed}-{index}").random() < 0.25:  # own draw: the rest stays
            obj["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    return rng.randrange(len(SETUPS)), obj


def _q(items: Any) -> dict[str, Decimal]:
    return {str(k): parse_quantity(str(v)) for k, v in (items or {}).items()}


def _toleration_set(items: Any) -> list[tuple[Any, ...]]:
    return sorted((t.get("key") or "", t.get("operator") or "Equal", t.get("value") or "",
                   t.get("effect") or "", t.get("tolerationSeconds")) for t in items or [])


def _compare(model: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    out: list[str] = []
    want, got = model["spec"], pod["spec"]
    for key in ("containers", "initContainers"):
        for w, g in zip(want.get(key) or [], got.get(key) or [], strict=False):
            for which in ("requests", "limits"):
                mine = _q((w.get("resources") or {}).get(which))
                theirs = _q((g.get("resources") or {}).get(which))
                if mine != theirs:
                    out.append(f"{key} {w['name']} {which}: model {mine} != pod {theirs}")
    if _q(want.get("overhead")) != _q(got.get("overhead")):
        out.append(f"overhead: model {want.get('overhead')} != pod {got.get('overhead')}")
    if _toleration_set(want.get("tolerations")) != _toleration_set(got.get("tolerations")):
        out.append(f"tolerations: model {want.get('tolerations')} != pod {got.get('tolerations')}")
    for key in ("priorityClassName", "priority"):
        if want.get(key) != got.get(key) and (key != "priority" or "priorityClassName" in want):
            out.append(f"{key}: model {want.get(key)} != pod {got.get(key)}")
    if (want.get("nodeSelector") or {}) != (got.get("nodeSelector") or {}):
        out.append(f"nodeSelector: model {want.get('nodeSelector')} != pod {got.get('nodeSelector')}")
    meta = pod.get("metadata") or {}
    for part in ("labels", "annotations"):
        missing = {k: v for k, v in (model["metadata"].get(part) or {}).items()
                   if (meta.get(part) or {}).get(k) != v}
        if missing:
            out.append(f"template {part} missing on the pod: {missing}")
    if "envelope.test/workload-only" in (meta.get("annotations") or {}):
        out.append("the workload's own annotation reached the pod")
    return out


def test_pod_construction_oracle(converging: Converging, oracle_seed: int,
                                 request: pytest.FixtureRequest) -> None:
    with global_default_priority_class(converging.cluster, "podc-default"):
        _pod_construction_oracle(converging, oracle_seed, request)


def _pod_construction_oracle(converging: Converging, oracle_seed: int,
                             request: pytest.FixtureRequest) -> None:
    cluster = converging.cluster
    cases = [generate(i, oracle_seed) for i in range(oracle_cases(request, DEFAULT_CASES))]
    tag = f"{oracle_seed}-{int(time.time()) % 100000}"
    namespaces = []
    for i, items in enumerate(SETUPS):
        name = f"podc-{tag}-{i}"
        cluster.create_namespace(name, labels={harness.ISOLATED_NAMESPACE_LABEL: "true"})
        if items:
            status, body = cluster.api("POST", f"/api/v1/namespaces/{name}/limitranges",
                                       {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
                                        "spec": {"limits": items}})
            assert status == 201, body
        namespaces.append(name)
    status, rc = cluster.api("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{RUNTIME_CLASS}")
    assert status == 200, rc
    status, nodes_body = cluster.api("GET", "/api/v1/nodes")
    assert status == 200, nodes_body
    nodes = list(nodes_body["items"])
    classes = priority_classes(cluster)

    def create(case: tuple[int, dict[str, Any]]) -> tuple[int, str]:
        setup, obj = case
        path = f"/apis/{API[obj['kind']]}/namespaces/{namespaces[setup]}/{PLURAL[obj['kind']]}"
        status, body = cluster.api("POST", path, obj)
        return status, "" if status == 201 else status_message(body)

    created = parallel(create, cases)
    for (_, obj), (status, message) in zip(cases, created, strict=True):
        assert status == 201, f"{obj['kind']} {obj['metadata']['name']}: {message}"

    expected: dict[str, int] = {}
    models: dict[str, Any] = {}
    for setup, obj in cases:
        name = obj["metadata"]["name"]
        lrs = [{"spec": {"limits": SETUPS[setup]}}] if SETUPS[setup] else []
        model = pod_of(obj["kind"], API[obj["kind"]].split("/")[0], obj, limit_ranges=lrs,
                       runtime_classes={RUNTIME_CLASS: rc}, priority_classes=classes)
        models[name] = model
        count = concurrent(obj["kind"], obj, nodes)
        assert count is not None
        expected[name] = 0 if model.pod is None else count

    def pods() -> dict[str, list[dict[str, Any]]]:
        status, body = cluster.api("GET", f"/api/v1/pods?labelSelector={LABEL}", timeout=60)
        assert status == 200, body
        out: dict[str, list[dict[str, Any]]] = {}
        for pod in body["items"]:
            out.setdefault(pod["metadata"]["labels"][LABEL], []).append(pod)
        return out

    deadline = time.monotonic() + 180
    while True:
        found = pods()
        counts = {name: len(found.get(name, [])) for name in expected}
        if counts == expected or time.monotonic() > deadline:
            break
        time.sleep(2)
    time.sleep(3)  # anything beyond the expected count would show now
    found = pods()
    problems: list[str] = []
    tally: Counter[str] = Counter()
    status, events = cluster.api("GET", "/api/v1/events?fieldSelector=reason%3DFailedCreate", timeout=60)
    assert status == 200, events
    failed = {str((e.get("involvedObject") or {}).get("name", "")).split("-")[0]
              for e in events["items"] if str((e.get("involvedObject") or {}).get("namespace")) in namespaces}
    for setup, obj in cases:
        name = obj["metadata"]["name"]
        got = found.get(name, [])
        model = models[name]
        if len(got) != expected[name]:
            problems.append(f"{obj['kind']} {name} ({namespaces[setup]}): {len(got)} pods, model says "
                            f"{expected[name]}; spec {obj['spec']}")
            continue
        if model.pod is None:
            if name not in failed:
                problems.append(f"{obj['kind']} {name}: model says refused ({model.refused}); "
                                "no FailedCreate")
            tally["refused by an admission plugin, as modelled"] += 1
            continue
        for pod in got:
            diff = _compare(model.pod, pod)
            if diff:
                problems.append(f"{obj['kind']} {name} pod {pod['metadata']['name']}: " + "; ".join(diff))
        tally[f"{obj['kind']} pods as modelled"] += len(got)
        tally["Jobs managed elsewhere (no Pod)"] += obj["spec"].get("managedBy") is not None
    print(f"\npod-construction oracle (seed {oracle_seed}, {len(cases)} workloads): "
          f"{dict(sorted(tally.items()))}")
    assert not problems, f"{len(problems)} disagreements (seed {oracle_seed}):\n" + "\n".join(problems[:30])
