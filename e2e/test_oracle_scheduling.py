"""Scheduling oracle: app/k8s/scheduling.py's verdict against the real kube-scheduler.

Each generated scenario is 1-3 Node objects (cpu, memory, ephemeral-storage,
pods, nvidia.com/gpu, example.com/fpga; labels; NoSchedule / NoExecute /
PreferNoSchedule taints; sometimes cordoned; sometimes already running pods
bound by ``spec.nodeName``) and one pod (containers, init containers, sidecars,
pod-level resources, a RuntimeClass with overhead, tolerations, nodeSelector,
required node affinity with every operator and ``matchFields``). The pod goes to
kube-scheduler (profile ``envelope-oracle``) in a namespace the Envelope webhook
does not see; the model must say "fits" exactly when the scheduler binds it and
"does not fit" exactly when it marks it Unschedulable.

Scenarios are isolated by a per-scenario node label that each pod selects, and
run in batches of ``BATCH`` on one API server. ``--cases N`` and
``--oracle-seed S`` change the run (see e2e/conftest.py).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import oracle_cases
from oracle import create, isolated_namespace, parallel, status_message

from app.k8s.defaulting import default_pod, effective_pod_requests
from app.k8s.scheduling import (
    NodeGroup,
    node_from_object,
    place_pod,
    pod_requests,
)
from harness import SCHEDULER_NAME, Cluster, HarnessError, Scheduler, pod_schedule_outcome

DEFAULT_CASES = 320  # >= 300 judged after the few the API server refuses as invalid
BATCH = 75
CASE_LABEL = "oracle.envelope.test/case"
RUNTIME_CLASS = "oracle-overhead"
OVERHEAD = {"cpu": "250m", "memory": "64Mi"}

CPU = ["100m", "250m", "500m", "1", "1500m", "2", "3", "4", "1001m", "2500u"]
MEM = ["64Mi", "128Mi", "256Mi", "512Mi", "1Gi", "1500Mi", "2Gi", "4Gi", "1G", "3Gi"]
NODE_CPU = ["1", "2", "2500m", "4", "8", "8"]
NODE_MEM = ["1Gi", "2Gi", "4Gi", "8Gi", "16Gi", "16Gi"]
TAINTS = [
    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "batch", "effect": "NoExecute"},
    {"key": "spot", "effect": "NoExecute"},
    {"key": "soft", "value": "x", "effect": "PreferNoSchedule"},
    {"key": "team", "value": "a", "effect": "NoExecute"},
]
TOLERATIONS = [
    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Exists"},
    {"key": "dedicated", "value": "batch"},
    {"key": "spot", "operator": "Exists", "effect": "NoSchedule"},  # wrong effect
    {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
    {"key": "team", "operator": "Equal", "value": "b"},
    {"operator": "Exists", "effect": "NoExecute"},  # every NoExecute taint
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
ZONES = ["a", "b", "c"]


@dataclass
class Scenario:
    index: int
    nodes: list[dict[str, Any]]  # Node manifests (labels, taints kept aside below)
    taints: list[list[dict[str, str]]]
    existing: list[dict[str, Any]]  # pods bound by nodeName
    pod: dict[str, Any]


def _resources(rng: random.Random, *, allow_gpu: bool) -> dict[str, Any]:
    req: dict[str, str] = {}
    lim: dict[str, str] = {}
    if rng.random() < 0.8:
        req["cpu"] = rng.choice(CPU)
    if rng.random() < 0.3:
        lim["cpu"] = rng.choice(CPU)
        if "cpu" in req and _q(req["cpu"]) > _q(lim["cpu"]):
            req["cpu"], lim["cpu"] = lim["cpu"], req["cpu"]
    if rng.random() < 0.7:
        req["memory"] = rng.choice(MEM)
    if rng.random() < 0.4:
        lim["memory"] = req.get("memory") or rng.choice(MEM)
    if rng.random() < 0.1:
        req["ephemeral-storage"] = rng.choice(["1Gi", "5Gi", "20Gi"])
    if allow_gpu and rng.random() < 0.12:
        n = str(rng.choice([1, 1, 2, 4]))
        lim["nvidia.com/gpu"] = n  # extended resources: request defaults to the limit
        if rng.random() < 0.5:
            req["nvidia.com/gpu"] = n
    if allow_gpu and rng.random() < 0.05:
        lim["example.com/fpga"] = req["example.com/fpga"] = "1"
    out: dict[str, Any] = {}
    if req:
        out["requests"] = req
    if lim:
        out["limits"] = lim
    return out


def _q(text: str) -> Any:
    from app.k8s.quantity import parse_quantity

    return parse_quantity(text)


def _container(name: str, rng: random.Random, *, allow_gpu: bool = True, restart: str | None = None) -> dict:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10",
                         "resources": _resources(rng, allow_gpu=allow_gpu)}
    if restart:
        c["restartPolicy"] = restart
    return c


def _affinity(rng: random.Random, node_names: list[str]) -> dict[str, Any]:
    def expr() -> dict[str, Any]:
        kind = rng.randrange(7)
        if kind == 0:
            return {"key": "zone", "operator": "In", "values": rng.sample(ZONES, rng.randint(1, 2))}
        if kind == 1:
            return {"key": "zone", "operator": "NotIn", "values": [rng.choice(ZONES)]}
        if kind == 2:
            return {"key": "gpu", "operator": "Exists"}
        if kind == 3:
            return {"key": "gpu", "operator": "DoesNotExist"}
        if kind == 4:
            return {"key": "gen", "operator": "Gt", "values": [str(rng.randint(1, 4))]}
        if kind == 5:
            return {"key": "gen", "operator": "Lt", "values": [str(rng.randint(2, 5))]}
        return {"key": "arch", "operator": "In", "values": ["arm64"]}

    terms = []
    for _ in range(rng.randint(1, 2)):
        term: dict[str, Any] = {}
        if rng.random() < 0.85:
            term["matchExpressions"] = [expr() for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.25:
            term["matchFields"] = [{"key": "metadata.name", "operator": rng.choice(["In", "NotIn"]),
                                    "values": [rng.choice(node_names)]}]
        if not term:
            term["matchExpressions"] = [expr()]
        terms.append(term)
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def generate(index: int, seed: int, run: str) -> Scenario:
    rng = random.Random(f"{seed}-{index}")
    case = f"{run}-{index}"
    nodes, taints = [], []
    for n in range(rng.randint(1, 3)):
        name = f"oracle-{case}-{n}"
        alloc = {"cpu": rng.choice(NODE_CPU), "memory": rng.choice(NODE_MEM),
                 "pods": str(rng.choice([1, 2, 3, 110, 110, 110, 110]))}
        if rng.random() < 0.8:
            alloc["ephemeral-storage"] = rng.choice(["10Gi", "50Gi"])
        labels = {CASE_LABEL: case, "zone": rng.choice(ZONES), "gen": str(rng.randint(1, 5))}
        if rng.random() < 0.45:
            alloc["nvidia.com/gpu"] = str(rng.choice([1, 2, 4, 8]))
            labels["gpu"] = "true"
        if rng.random() < 0.3:
            alloc["example.com/fpga"] = "2"
        node: dict[str, Any] = {"name": name, "allocatable": alloc, "labels": labels,
                                "unschedulable": rng.random() < 0.07}
        nodes.append(node)
        taints.append(rng.sample(TAINTS, rng.choice([0, 0, 0, 0, 1, 2])))
    existing = []
    for i, node in enumerate(nodes):
        for j in range(rng.choice([0, 0, 1, 2])):
            existing.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"existing-{index}-{i}-{j}"},
                "spec": {"schedulerName": SCHEDULER_NAME, "nodeName": node["name"],
                         "containers": [_container("c", rng)]},
            })
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "nodeSelector": {CASE_LABEL: case},
        "containers": [_container(f"c{i}", rng) for i in range(rng.randint(1, 2))],
        "terminationGracePeriodSeconds": 0,
    }
    if rng.random() < 0.35:
        spec["initContainers"] = [
            _container(f"i{i}", rng, allow_gpu=False, restart="Always" if rng.random() < 0.5 else None)
            for i in range(rng.randint(1, 3))
        ]
    if rng.random() < 0.2:
        spec["runtimeClassName"] = RUNTIME_CLASS
    if rng.random() < 0.25:
        _pod_level(spec, rng)
    if rng.random() < 0.5:
        spec["tolerations"] = rng.sample(TOLERATIONS, rng.randint(1, 3))
    if rng.random() < 0.2:
        spec["nodeSelector"]["zone"] = rng.choice(ZONES)
    if rng.random() < 0.3:
        spec["affinity"] = _affinity(rng, [n["name"] for n in nodes])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"case-{index}"}, "spec": spec}
    return Scenario(index=index, nodes=nodes, taints=taints, existing=existing, pod=pod)


def _pod_level(spec: dict[str, Any], rng: random.Random) -> None:
    """Pod-level cpu/memory that validation accepts: a limit at or above the
    containers' aggregate request and every container limit, a request (when set)
    between the aggregate request and the limit."""
    containers = {k: v for k, v in spec.items() if k != "resources"}
    aggregate = effective_pod_requests({"spec": containers})
    res: dict[str, Any] = {}
    for name, choices in (("cpu", ["2", "4", "6"]), ("memory", ["4Gi", "6Gi", "8Gi"])):
        if rng.random() >= 0.7:
            continue
        limit = _q(rng.choice(choices))
        container_limits = [_q(c["resources"]["limits"][name])
                            for c in spec["containers"] + spec.get("initContainers", [])
                            if name in c["resources"].get("limits", {})]
        floor = max([aggregate.get(name, 0), *container_limits])
        if limit < floor:
            continue
        res.setdefault("limits", {})[name] = str(limit)
        if rng.random() < 0.4 and floor * 2 <= limit:
            res.setdefault("requests", {})[name] = str(limit / 2)
    if res:
        spec["resources"] = res


def _ensure_runtime_class(cluster: Cluster) -> None:
    status, _ = cluster.api("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{RUNTIME_CLASS}")
    if status == 200:
        return
    status, body = cluster.api("POST", "/apis/node.k8s.io/v1/runtimeclasses", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_CLASS},
        "handler": "runc", "overhead": {"podFixed": OVERHEAD}})
    assert status == 201, body


def _model(scn: Scenario, minor: int) -> tuple[bool, str]:
    """app/k8s/scheduling.py on exactly what was submitted (plus the RuntimeClass
    overhead the RuntimeClass admission plugin adds)."""
    spec = dict(scn.pod["spec"])
    if spec.get("runtimeClassName") == RUNTIME_CLASS:
        spec["overhead"] = OVERHEAD
    stored = default_pod({"spec": spec}, minor=minor)["spec"]
    nodes = []
    for node, taints in zip(scn.nodes, scn.taints, strict=True):
        obj = {"metadata": {"name": node["name"], "labels": {"kubernetes.io/hostname": node["name"],
                                                             "kubernetes.io/os": "linux", **node["labels"]}},
               "spec": {"taints": taints, "unschedulable": node["unschedulable"]},
               "status": {"allocatable": node["allocatable"]}}
        on_node = [default_pod(p, minor=minor) for p in scn.existing if p["spec"]["nodeName"] == node["name"]]
        nodes.append(node_from_object(obj, on_node))
    verdict = place_pod(stored, [NodeGroup(n) for n in nodes], pod_requests(stored), len(nodes) + 1)
    if verdict.fits:
        return True, "fits a node"
    closest = verdict.closest
    if closest is not None:
        short = ", ".join(f"{s.resource} {s.requested} requested, {max(s.free, 0)} free of {s.allocatable}"
                          for s in closest.shortfalls)
        return False, f"fits no node; closest is {closest.node.name}: {short}"
    return False, f"no node admits the pod's placement ({verdict.count} nodes: {'; '.join(verdict.reasons)})"


def _run_batch(cluster: Cluster, namespace: str, batch: list[Scenario],
               minor: int) -> tuple[list[str], int, int]:
    """Create the batch, wait for every pod's outcome, compare; returns
    (disagreements, pods the API server refused, pods bound)."""
    def make_node(item: tuple[dict[str, Any], list[dict[str, str]]]) -> None:
        node, taints = item
        cluster.create_node(node["name"], node["allocatable"], labels=node["labels"], taints=taints,
                            unschedulable=node["unschedulable"])

    pairs = [(n, t) for s in batch for n, t in zip(s.nodes, s.taints, strict=True)]
    parallel(make_node, pairs)
    refused: dict[int, str] = {}
    existing = [(s, p) for s in batch for p in s.existing]
    for (s, _), (status, body) in zip(existing, parallel(
            lambda sp: create(cluster, namespace, "pods", sp[1]), existing), strict=True):
        if status != 201:
            refused[s.index] = f"existing pod refused: {status_message(body)}"
    time.sleep(1.0)  # let the scheduler's informers see the nodes and bound pods
    results = parallel(lambda s: create(cluster, namespace, "pods", s.pod), batch)
    pending = {}
    for scn, (status, body) in zip(batch, results, strict=True):
        if status != 201:
            refused[scn.index] = status_message(body)
        elif scn.index not in refused:
            pending[scn.pod["metadata"]["name"]] = scn
    outcomes: dict[str, tuple[str, str]] = {}
    deadline = time.monotonic() + 90
    while len(outcomes) < len(pending):
        status, listed = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods")
        assert status == 200, listed
        for pod in listed["items"]:
            name = pod["metadata"]["name"]
            if name in pending:
                outcome = pod_schedule_outcome(pod)
                if outcome is not None:
                    outcomes[name] = outcome
        if time.monotonic() > deadline:
            raise HarnessError(f"kube-scheduler decided {len(outcomes)} of {len(pending)} pods in 90s")
        time.sleep(0.3)
    time.sleep(0.5)
    disagreements = []
    for name, scn in pending.items():
        fits, why = _model(scn, minor)
        kind, detail = outcomes[name]
        if fits != (kind == "bound"):
            disagreements.append(
                f"case {scn.index}: model says {'fits' if fits else 'does not fit'} ({why}); "
                f"kube-scheduler: {kind} {detail}\n  nodes={scn.nodes}\n  taints={scn.taints}\n"
                f"  existing={[p['spec'] for p in scn.existing]}\n  pod={scn.pod['spec']}")
    # Clean up: pods first (bound ones need grace period 0), then the nodes.
    names = [s.pod["metadata"]["name"] for s in batch] + [p["metadata"]["name"] for _, p in existing]
    parallel(lambda n: cluster.force_delete_pod(namespace, n), names)
    parallel(lambda item: cluster.delete_node(item[0]["name"]), pairs)
    for index, why in refused.items():
        print(f"case {index}: the API server refused the pod: {why}")
    bound = sum(1 for kind, _ in outcomes.values() if kind == "bound")
    return disagreements, len(refused), bound


def test_scheduling_oracle(cluster: Cluster, scheduler: Scheduler, oracle_seed: int, kube_minor: int,
                           request: pytest.FixtureRequest) -> None:
    cases = oracle_cases(request, DEFAULT_CASES)
    _ensure_runtime_class(cluster)
    namespace = isolated_namespace(cluster, "oracle-sched")
    run = namespace.rsplit("-", 1)[-1]
    scenarios = [generate(i, oracle_seed, run) for i in range(cases)]
    disagreements: list[str] = []
    refused = bound = 0
    started = time.monotonic()
    for start in range(0, cases, BATCH):
        found, n_refused, n_bound = _run_batch(cluster, namespace, scenarios[start:start + BATCH], kube_minor)
        disagreements += found
        refused += n_refused
        bound += n_bound
    judged = cases - refused
    print(f"scheduling oracle: {judged} scenarios judged ({refused} refused by the API server, "
          f"{bound} bound, {judged - bound} unschedulable), seed {oracle_seed}, "
          f"{time.monotonic() - started:.1f}s, {len(disagreements)} disagreements")
    assert judged >= min(cases, DEFAULT_CASES) * 0.9, f"only {judged} of {cases} scenarios were valid"
    assert not disagreements, "\n".join(disagreements[:10])
