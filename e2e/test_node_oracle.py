"""The nodeName oracle: ``pod-fits-node``'s model of the kubelet's admission
(app/k8s/scheduling.py, ``decider=KUBELET``) against the real kubelet (e2e/harness/node.py).

A pod with ``spec.nodeName`` meets no scheduler: the node's kubelet admits it or fails it
(``pkg/kubelet/lifecycle/predicate.go`` at v1.37.2: OutOfcpu, OutOfmemory, NodeAffinity for
nodeSelector and required node affinity, Taint for an untolerated NoExecute taint,
``OutOf<name>`` for an extended resource the node has too little of, none for one it has
none of). Generated cases, in groups: each group sets the real Node's labels, taints and
an extended resource (``example.com/widget`` in its status capacity, as a device vendor
would advertise it), then submits its pods one at a time; the pods the kubelet admits keep
running and count against the next ones, as they do for the kubelet. Each verdict is
compared with the model on the Node as the API server holds it and the node's active pods.

The same cases are then judged by two wrong models — kube-scheduler's filters instead of
the kubelet's (NoSchedule taints, extended resources the node lacks), and one that forgets
the pods already running — and the oracle must catch each (disagreements > 0)."""

from __future__ import annotations

import json
import random
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nodepods as p
import pytest
from conftest import NodeEnv, oracle_cases

from app.k8s.scheduling import KUBELET, SCHEDULER, NodeGroup, node_from_object, place_pod, pod_requests
from harness import HarnessError, Node

pytestmark = pytest.mark.e2e

DEFAULT_CASES = 160
PER_GROUP = 10
WIDGET = "example.com/widget"
LABELS = {"oracle.envelope.test/zone": ["a", "b"], "oracle.envelope.test/tier": ["x"]}
TAINTS = [
    {"key": "oracle.envelope.test/dedicated", "value": "gpu", "effect": "NoSchedule"},
    {"key": "oracle.envelope.test/spot", "effect": "NoExecute"},
    {"key": "oracle.envelope.test/team", "value": "a", "effect": "NoExecute"},
]
TOLERATIONS = [
    {"key": "oracle.envelope.test/spot", "operator": "Exists", "effect": "NoExecute"},
    {"key": "oracle.envelope.test/spot", "operator": "Exists", "effect": "NoSchedule"},  # wrong effect
    {"key": "oracle.envelope.test/team", "operator": "Equal", "value": "b"},
    {"key": "oracle.envelope.test/team", "operator": "Equal", "value": "a"},
    {"operator": "Exists", "effect": "NoExecute"},
    {"key": "oracle.envelope.test/dedicated", "operator": "Exists"},
]
CPU = ["10m", "50m", "100m", "100m", "250m", "250m", "500m", "700m", "1", "1500m", "2", "3"]


@dataclass
class Group:
    labels: dict[str, str]
    taints: list[dict[str, str]]
    widgets: int | None  # None: the node advertises none
    pods: list[dict[str, Any]]


def _memory(rng: random.Random, node_memory_mi: int) -> str:
    share = rng.choice([0.001, 0.01, 0.02, 0.05, 0.1, 0.3, 0.6, 1.2])
    return f"{max(16, int(node_memory_mi * share))}Mi"


def _pod(rng: random.Random, name: str, ns: str, node: Node, node_memory_mi: int) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if rng.random() < 0.9:
        requests["cpu"] = rng.choice(CPU)
    if rng.random() < 0.8:
        requests["memory"] = _memory(rng, node_memory_mi)
    if rng.random() < 0.35:
        requests[WIDGET] = str(rng.choice([1, 1, 2, 3]))
    limits = {WIDGET: requests[WIDGET]} if WIDGET in requests else {}  # extended: limit == request
    if "memory" in requests and rng.random() < 0.5:
        limits["memory"] = requests["memory"]
    body = p.box("c", "while :; do sleep 5; done", requests=requests, limits=limits)
    spec: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.25:
        key = rng.choice(list(LABELS))
        spec["nodeSelector"] = {key: rng.choice([*LABELS[key], "z"])}
    elif roll < 0.45:
        key = rng.choice(list(LABELS))
        op = rng.choice(["In", "NotIn", "Exists", "DoesNotExist"])
        expr: dict[str, Any] = {"key": key, "operator": op}
        if op in ("In", "NotIn"):
            expr["values"] = rng.sample([*LABELS[key], "z"], k=rng.randint(1, 2))
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}
    if rng.random() < 0.6:
        spec["tolerations"] = rng.sample(TOLERATIONS, k=rng.randint(1, 3))
    return p.pod(name, ns, node, body, **spec)


def generate(seed: int, cases: int, ns: str, node: Node, node_memory_mi: int) -> list[Group]:
    rng = random.Random(seed)
    groups = []
    for g in range((cases + PER_GROUP - 1) // PER_GROUP):
        labels = {k: rng.choice(v) for k, v in LABELS.items() if rng.random() < 0.6}
        taints = [t for t in TAINTS if rng.random() < 0.35]
        widgets = rng.choice([None, 1, 2, 4])
        count = min(PER_GROUP, cases - g * PER_GROUP)
        groups.append(Group(labels, taints, widgets,
                            [_pod(rng, f"o{g}-{i}", ns, node, node_memory_mi) for i in range(count)]))
    return groups


def _set_node(node: Node, labels: dict[str, str], taints: list[dict[str, str]],
              widgets: int | None) -> None:
    """The group's labels, taints and extended resource on the real Node (the kubelet keeps
    labels and taints it did not set, and an extended resource advertised in its status)."""
    current = node.node_object()
    old = {k: None for k in current["metadata"].get("labels", {}) if k.startswith("oracle.envelope.test/")}
    keep = [t for t in current["spec"].get("taints") or []
            if not t["key"].startswith("oracle.envelope.test/")]
    status, body = node.cluster.api("PATCH", f"/api/v1/nodes/{node.name}",
                                    {"metadata": {"labels": {**old, **labels}},
                                     "spec": {"taints": keep + taints}},
                                    content_type="application/merge-patch+json")
    assert status == 200, body
    value = None if widgets is None else str(widgets)
    status, body = node.cluster.api("PATCH", f"/api/v1/nodes/{node.name}/status",
                                    {"status": {"capacity": {WIDGET: value}, "allocatable": {WIDGET: value}}},
                                    content_type="application/merge-patch+json")
    assert status == 200, body

    def seen() -> bool:
        got = node.node_object()
        return got["status"].get("allocatable", {}).get(WIDGET) == value and \
            all(got["metadata"]["labels"].get(k) == v for k, v in labels.items())

    node.wait("the Node to carry the group's state", seen, 30)
    time.sleep(1.5)  # the kubelet's Node informer


def _kubelet_pods(node: Node) -> list[str]:
    """The pods the kubelet's pod manager holds (its /pods endpoint)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(f"https://127.0.0.1:{node.kubelet_port}/pods", context=ctx, timeout=10) as r:
        return [x["metadata"]["name"] for x in json.loads(r.read())["items"] or []]


def _active_on_node(node: Node, exclude: str) -> list[dict[str, Any]]:
    status, body = node.cluster.api("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node.name}")
    assert status == 200, body
    return [x for x in body["items"] if x["metadata"]["name"] != exclude
            and x.get("status", {}).get("phase") not in ("Failed", "Succeeded")]


def _outcome(got: dict[str, Any]) -> tuple[str, str] | None:
    st = got.get("status") or {}
    if st.get("phase") == "Failed" and st.get("reason"):
        return ("rejected", f"{st['reason']}: {st.get('message', '')}")
    if st.get("containerStatuses") or st.get("phase") == "Running":
        return ("admitted", "")
    return None


Obj = dict[str, Any]
Model = Callable[[Obj, Obj, list[Obj]], tuple[bool, str]]


def kubelet_model(spec: Obj, node_obj: Obj, others: list[Obj]) -> tuple[bool, str]:
    verdict = place_pod(spec, [NodeGroup(node_from_object(node_obj, others))], pod_requests(spec), 2,
                        decider=KUBELET)
    if verdict.fits:
        return True, "admits"
    closest = verdict.closest
    short = [f"{s.resource} {s.requested}>{s.free}" for s in closest.shortfalls] if closest else []
    return False, "; ".join([*verdict.reasons, *short])


def scheduler_model(spec: Obj, node_obj: Obj, others: list[Obj]) -> tuple[bool, str]:
    """Wrong on purpose: kube-scheduler's filters, not the kubelet's admission."""
    verdict = place_pod(spec, [NodeGroup(node_from_object(node_obj, others))], pod_requests(spec), 2,
                        decider=SCHEDULER)
    return verdict.fits, "scheduler's filters"


def empty_node_model(spec: Obj, node_obj: Obj, others: list[Obj]) -> tuple[bool, str]:
    """Wrong on purpose: forgets the pods the node already runs."""
    return kubelet_model(spec, node_obj, [])


@dataclass
class Case:
    name: str
    spec: dict[str, Any]
    node_obj: dict[str, Any]
    others: list[dict[str, Any]]
    outcome: tuple[str, str]


def _run_group(node: Node, ns: str, group: Group) -> list[Case]:
    _set_node(node, group.labels, group.taints, group.widgets)
    out = []
    for manifest in group.pods:
        name = manifest["metadata"]["name"]
        node_obj = node.node_object()
        stored, _ = p.create(node.cluster, manifest)
        others = _active_on_node(node, name)
        got = p.wait_for(node, f"the kubelet's verdict on {name}", ns, name,
                         lambda x: _outcome(x) is not None, timeout=60)
        outcome = _outcome(got)
        assert outcome is not None
        out.append(Case(name, stored["spec"], node_obj, others, outcome))
    for manifest in group.pods:
        p.delete(node.cluster, ns, manifest["metadata"]["name"])
    names = {m["metadata"]["name"] for m in group.pods}
    node.wait("the kubelet to drop the group's pods", lambda: not names & set(_kubelet_pods(node)), 60)
    return out


def _disagreements(cases: list[Case], model: Model) -> list[str]:
    found = []
    for case in cases:
        fits, why = model(case.spec, case.node_obj, case.others)
        if fits != (case.outcome[0] == "admitted"):
            found.append(f"{case.name}: model {'admits' if fits else 'rejects'} ({why}); kubelet "
                         f"{case.outcome[0]} {case.outcome[1]}\n  pod={json.dumps(case.spec)[:600]}\n"
                         f"  node labels={case.node_obj['metadata'].get('labels')} "
                         f"taints={case.node_obj['spec'].get('taints')} "
                         f"allocatable={case.node_obj['status'].get('allocatable')}\n"
                         f"  running={[x['metadata']['name'] for x in case.others]}")
    return found


def test_nodename_oracle(node_env: NodeEnv, oracle_seed: int, request: pytest.FixtureRequest) -> None:
    env, node = node_env, node_env.node
    cases = oracle_cases(request, DEFAULT_CASES)
    ns = env.namespace("oracle-nodename", webhook=False)
    memory = node.node_object()["status"]["allocatable"]["memory"]
    assert memory.endswith("Ki"), memory
    groups = generate(oracle_seed, cases, ns, node, int(memory[:-2]) // 1024)
    judged: list[Case] = []
    started = time.monotonic()
    try:
        for group in groups:
            judged += _run_group(node, ns, group)
    finally:
        try:
            _set_node(node, {}, [], None)
        except (AssertionError, HarnessError) as err:
            print(f"restoring the node: {err}")
    reasons: dict[str, int] = {}
    for case in judged:
        key = case.outcome[1].split(":", 1)[0] if case.outcome[0] == "rejected" else "admitted"
        reasons[key] = reasons.get(key, 0) + 1
    found = _disagreements(judged, kubelet_model)
    broken = {name: len(_disagreements(judged, model))
              for name, model in (("scheduler-filters", scheduler_model),
                                  ("forgets-running-pods", empty_node_model))}
    print(f"nodeName oracle: {len(judged)} cases on the real kubelet ({reasons}), seed {oracle_seed}, "
          f"{time.monotonic() - started:.0f}s, {len(found)} disagreements; broken models caught: {broken}")
    assert len(judged) == cases
    assert not found, "\n".join(found[:8])
    assert all(n > 0 for n in broken.values()), f"a wrong model went unnoticed: {broken}"
