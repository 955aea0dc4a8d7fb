"""Convergence oracle: the whole control plane is the judge (issue #28).

A control plane of its own (etcd, kube-apiserver, kube-scheduler, kube-controller-manager
at the e2e Kubernetes version; Nodes without kubelets) with the Envelope webhook
registered. Each generated scenario is a namespace set-up (LimitRanges, ResourceQuotas
with and without scopes, a RuntimeClass with overhead and scheduling, tainted and
cordoned Nodes) and a workload of a kind Envelope judges, run three times:

- ``bare``: in a namespace out of the webhook's path (the cluster without Envelope);
- ``webhook``: in a namespace in its path from the start;
- ``predates``: created while its namespace was out of the path, which is then put in it
  (an object written before the webhook was registered, or while it failed open).

Each then goes through the same generated sequence of everyday operations (label,
annotate, scale through ``/scale``, replicas by patch, ``rollout restart``, an image bump,
suspend and a Kueue-style resume that writes a nodeSelector, a Job from a CronJob), and
the three are compared once the controllers have settled:

- every write accepted in ``bare`` is accepted in the others, or refused by an Envelope
  rule on purpose (its message names the rule) — never by the API server because of a
  patch Envelope added;
- each controller reaches the same steady state: the same number of children per
  workload (one ReplicaSet per Deployment revision) and of Pods, nothing rewritten in a
  loop (the objects' resourceVersions stand still);
- no FailedCreate that Envelope caused: in ``webhook``, a template Envelope admitted makes
  Pods Envelope admits (the template verdict and the Pod verdicts agree); in
  ``predates`` (a template Envelope never judged) a Pod it refuses must be refused by a
  named rule;
- a Job (or CronJob) whose ``spec.managedBy`` names another controller (MultiKueue runs
  its Pods in a worker cluster; issue 37, class 3) makes no Pod here: it is never
  refused for where its Pods would go (``pod-fits-node``) — they are sized for the
  worker's nodes, far beyond these.

``--cases N`` runs N scenarios (default 200, seeded by ``--oracle-seed``).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import RUNTIME_CLASS, Converging, oracle_cases
from oracle import parallel, status_message

import harness
from harness import Cluster

DEFAULT_CASES = 200
LABEL = "envelope.test/conv"  # on every workload and its pod template: "<scenario>"
VARIANTS = ("bare", "webhook", "predates")
SCHED = harness.SCHEDULER_NAME
KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet",
         "ReplicationController", "Pod")
PLURAL = {"Deployment": "deployments", "StatefulSet": "statefulsets", "DaemonSet": "daemonsets",
          "Job": "jobs", "CronJob": "cronjobs", "ReplicaSet": "replicasets",
          "ReplicationController": "replicationcontrollers", "Pod": "pods"}
GROUP = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
         "ReplicaSet": "apps/v1", "Job": "batch/v1", "CronJob": "batch/v1",
         "ReplicationController": "v1", "Pod": "v1"}


# --- the cluster ------------------------------------------------------------------------


# --- namespaces -------------------------------------------------------------------------

NAMESPACE_SETUPS: tuple[tuple[str, list[dict[str, Any]]], ...] = (
    ("plain", []),
    ("lr-memory-default-split", [
        {"kind": "LimitRange", "spec": {"limits": [{"type": "Container",
                                                    "default": {"memory": "512Mi"},
                                                    "defaultRequest": {"memory": "256Mi"}}]}}]),
    ("lr-defaults-equal", [
        {"kind": "LimitRange", "spec": {"limits": [{"type": "Container",
                                                    "default": {"memory": "512Mi", "cpu": "1"},
                                                    "defaultRequest": {"memory": "512Mi",
                                                                       "cpu": "500m"}}]}}]),
    ("lr-max-cpu", [
        {"kind": "LimitRange", "spec": {"limits": [{"type": "Container", "max": {"cpu": "8"}}]}}]),
    ("quota-limits-cpu", [
        {"kind": "ResourceQuota", "spec": {"hard": {"limits.cpu": "1000", "requests.memory": "4Ti"}}}]),
    ("quota-memory", [
        {"kind": "ResourceQuota", "spec": {"hard": {"requests.memory": "4Ti", "limits.memory": "4Ti",
                                                    "pods": "1000"}}}]),
    ("quota-scoped", [
        {"kind": "ResourceQuota", "spec": {"hard": {"limits.cpu": "1000"}, "scopes": ["NotBestEffort"]}}]),
)
PATH_OF = {"LimitRange": "limitranges", "ResourceQuota": "resourcequotas"}


def _namespace(cluster: Cluster, name: str, setup: list[dict[str, Any]], *, in_path: bool) -> None:
    labels = {"envelope.test/e2e": "true"}
    if not in_path:
        labels[harness.ISOLATED_NAMESPACE_LABEL] = "true"
    cluster.create_namespace(name, labels=labels)
    for index, obj in enumerate(setup):
        body = {"apiVersion": "v1", "kind": obj["kind"], "metadata": {"name": f"s{index}"},
                "spec": obj["spec"]}
        status, got = cluster.api("POST", f"/api/v1/namespaces/{name}/{PATH_OF[obj['kind']]}", body)
        assert status == 201, got


# --- scenarios --------------------------------------------------------------------------

CPU = ("100m", "250m", "500m", "1", "2")
MEM = ("64Mi", "128Mi", "256Mi", "512Mi", "1Gi")


def _resources(rng: random.Random) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    cpu = rng.choice(("none", "request", "limit", "both", "both"))
    if cpu in ("request", "both"):
        requests["cpu"] = rng.choice(CPU[:3])
    if cpu in ("limit", "both"):
        limits["cpu"] = rng.choice(CPU[2:])
    memory = rng.choice(("none", "request", "limit", "equal", "equal", "split"))
    low, high = sorted(rng.sample(range(len(MEM)), 2))
    if memory == "request":
        requests["memory"] = MEM[high]
    elif memory == "limit":
        limits["memory"] = MEM[high]
    elif memory == "equal":
        requests["memory"] = limits["memory"] = MEM[high]
    elif memory == "split":
        requests["memory"], limits["memory"] = MEM[low], MEM[high]
    if rng.random() < 0.1:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(rng.choice((1, 2)))
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _pod_spec(rng: random.Random, kind: str) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": "registry.k8s.io/pause:3.10", "resources": _resources(rng)}
                  for i in range(rng.choice((1, 1, 2)))]
    spec: dict[str, Any] = {"schedulerName": SCHED, "containers": containers,
                            "terminationGracePeriodSeconds": 0}
    if rng.random() < 0.25:
        spec["initContainers"] = [{"name": "init", "image": "registry.k8s.io/pause:3.10",
                                   "resources": _resources(rng)}]
    if rng.random() < 0.15:
        spec["runtimeClassName"] = RUNTIME_CLASS
    if any("nvidia.com/gpu" in (c["resources"].get("limits") or {}) for c in containers) \
            or rng.random() < 0.1:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if kind in ("Job", "CronJob"):
        spec["restartPolicy"] = rng.choice(("Never", "OnFailure"))
    if kind == "DaemonSet" and rng.random() < 0.2:
        spec["nodeSelector"] = {"envelope.test/pool": rng.choice(("gpu", "none-such"))}
    return spec


@dataclass
class Scenario:
    index: int
    setup: int  # index into NAMESPACE_SETUPS
    kind: str
    obj: dict[str, Any]
    ops: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"w{self.index}"


MANAGED_BY = "kueue.x-k8s.io/multikueue"
WORKER_SIZED = {"requests": {"cpu": "1", "memory": "3Ti"}, "limits": {"memory": "3Ti"}}
"""Pods sized for a worker cluster: no Node of this one takes them."""


def _managed_elsewhere(obj: dict[str, Any]) -> bool:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec.get("managedBy") == MANAGED_BY


def _run_elsewhere(obj: dict[str, Any], index: int, seed: int) -> None:
    """One Job or CronJob in six runs in a worker cluster (its own generator, so the other
    scenarios of a seed stay what they were): ``managedBy`` set, its Pods sized beyond
    every Node here."""
    if obj["kind"] not in ("Job", "CronJob") or random.Random(f"managed-{seed}-{index}").random() >= 1 / 6:
        return
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    spec["managedBy"] = MANAGED_BY
    for container in spec["template"]["spec"]["containers"]:
        container["resources"] = json.loads(json.dumps(WORKER_SIZED))


def _workload(rng: random.Random, kind: str, name: str) -> dict[str, Any]:
    labels = {LABEL: name}
    template = {"metadata": {"labels": dict(labels)}, "spec": _pod_spec(rng, kind)}
    meta = {"name": name, "labels": dict(labels)}
    replicas = rng.choice((1, 1, 2))
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
    if kind == "Job":
        spec: dict[str, Any] = {"template": template, "parallelism": replicas,
                                "completions": rng.choice((None, replicas, 3)), "backoffLimit": 0,
                                "suspend": rng.random() < 0.4}
        if spec["completions"] is None:
            del spec["completions"]
        if rng.random() < 0.2 and "completions" in spec:
            spec["completionMode"] = "Indexed"
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta,
                "spec": {"schedule": "0 0 1 1 *", "suspend": True,
                         "jobTemplate": {"metadata": {"labels": dict(labels)},
                                         "spec": {"template": template, "backoffLimit": 0}}}}
    selector = {"matchLabels": dict(labels)}
    spec = {"selector": selector, "template": template}
    if kind in ("Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"):
        spec["replicas"] = replicas
    if kind == "StatefulSet":
        spec["serviceName"] = name
        spec["podManagementPolicy"] = "Parallel"
    if kind == "ReplicationController":
        spec["selector"] = dict(labels)
    return {"apiVersion": GROUP[kind], "kind": kind, "metadata": meta, "spec": spec}


OPS_BY_KIND: dict[str, tuple[str, ...]] = {
    "Deployment": ("label", "annotate", "scale", "replicas", "restart", "image"),
    "StatefulSet": ("label", "annotate", "scale", "replicas", "restart", "image"),
    "ReplicaSet": ("label", "annotate", "scale", "replicas"),
    "ReplicationController": ("label", "annotate", "scale"),
    "DaemonSet": ("label", "annotate", "restart", "image"),
    "Job": ("label", "annotate", "resume", "suspend", "parallelism"),
    "CronJob": ("label", "annotate", "image", "instantiate"),
    "Pod": ("label", "annotate"),
}


def generate(index: int, seed: int) -> Scenario:
    rng = random.Random(seed * 1_000_003 + index)
    kind = KINDS[index % len(KINDS)] if index < len(KINDS) * 4 else rng.choice(KINDS)
    scn = Scenario(index, rng.randrange(len(NAMESPACE_SETUPS)), kind, {})
    scn.obj = _workload(rng, kind, scn.name)
    _run_elsewhere(scn.obj, index, seed)
    for step in range(rng.choice((1, 2, 3))):
        op = rng.choice(OPS_BY_KIND[kind])
        scn.ops.append((op, step))
    return scn


# --- writes -----------------------------------------------------------------------------


def _base(kind: str, namespace: str) -> str:
    group = GROUP[kind]
    prefix = "/api/v1" if group == "v1" else f"/apis/{group}"
    return f"{prefix}/namespaces/{namespace}/{PLURAL[kind]}"


@dataclass
class Outcome:
    status: int
    message: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def _op(cluster: Cluster, scn: Scenario, namespace: str, op: str, step: int) -> Outcome:
    base = f"{_base(scn.kind, namespace)}/{scn.name}"
    merge = "application/merge-patch+json"
    strategic = "application/strategic-merge-patch+json"
    stamp = f"2026-12-02T00:00:0{step}Z"
    body: Any
    path, content = base, merge
    if op == "label":
        body = {"metadata": {"labels": {f"envelope.test/op{step}": "x"}}}
    elif op == "annotate":
        body = {"metadata": {"annotations": {f"envelope.test/op{step}": "x"}}}
    elif op == "scale":
        path, body = f"{base}/scale", {"spec": {"replicas": 2 + step % 2}}
    elif op == "replicas":
        body = {"spec": {"replicas": 1 + step % 2}}
    elif op == "parallelism":
        body = {"spec": {"parallelism": 1 + step % 2}}
    elif op == "restart":
        body = {"spec": {"template": {"metadata": {"annotations": {
            "kubectl.kubernetes.io/restartedAt": stamp}}}}}
    elif op == "image":
        first = _pod_spec_of(scn)["containers"][0]["name"]
        tpl = {"spec": {"containers": [{"name": first, "image": f"registry.k8s.io/pause:3.{9 + step % 2}"}]}}
        body = {"spec": {"jobTemplate": {"spec": {"template": tpl}}}} if scn.kind == "CronJob" \
            else {"spec": {"template": tpl}}
        content = strategic
    elif op == "suspend":
        body = {"spec": {"suspend": True}}
    elif op == "resume":  # as Kueue admits a Job: unsuspend and place it in one UPDATE
        body = {"spec": {"suspend": False, "template": {"spec": {
            "nodeSelector": {"kubernetes.io/os": "linux"}}}}}
    elif op == "instantiate":  # kubectl create job --from=cronjob/NAME
        return _instantiate(cluster, scn, namespace, step)
    else:  # pragma: no cover
        raise AssertionError(op)
    status, got = cluster.api("PATCH", path, body, content_type=content)
    return Outcome(status, "" if 200 <= status < 300 else status_message(got))


def _instantiate(cluster: Cluster, scn: Scenario, namespace: str, step: int) -> Outcome:
    status, cron = cluster.api("GET", f"{_base('CronJob', namespace)}/{scn.name}")
    if status != 200:
        return Outcome(status, status_message(cron))
    tpl = cron["spec"]["jobTemplate"]
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"{scn.name}-manual-{step}",
                        "labels": dict(tpl["metadata"].get("labels") or {}),
                        "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": scn.name,
                                             "uid": cron["metadata"]["uid"], "controller": True}]},
           "spec": tpl["spec"]}
    status, got = cluster.api("POST", _base("Job", namespace), job)
    return Outcome(status, "" if status == 201 else status_message(got))


def _pod_spec_of(scn: Scenario) -> dict[str, Any]:
    spec = scn.obj["spec"]
    if scn.kind == "Pod":
        return dict(spec)
    if scn.kind == "CronJob":
        return dict(spec["jobTemplate"]["spec"]["template"]["spec"])
    return dict(spec["template"]["spec"])


# --- steady state -----------------------------------------------------------------------

CHILD_KINDS = (("apps/v1", "replicasets"), ("v1", "pods"), ("batch/v1", "jobs"),
               ("apps/v1", "controllerrevisions"))
TOP_KINDS = tuple(sorted({(GROUP[k], PLURAL[k]) for k in KINDS}))


def _list(cluster: Cluster, group: str, plural: str) -> list[dict[str, Any]]:
    prefix = "/api/v1" if group == "v1" else f"/apis/{group}"
    status, body = cluster.api("GET", f"{prefix}/{plural}?labelSelector={LABEL}", timeout=60)
    assert status == 200, body
    return list(body.get("items") or [])


def _snapshot(cluster: Cluster) -> dict[tuple[str, str, str], str]:
    """(kind, namespace, name) -> resourceVersion of every object of the scenarios."""
    kinds = {(g, p) for g, p in TOP_KINDS + CHILD_KINDS}
    ordered = sorted(kinds)
    out: dict[tuple[str, str, str], str] = {}
    for (_, plural), items in zip(ordered, parallel(lambda gp: _list(cluster, *gp), ordered), strict=True):
        for item in items:
            meta = item["metadata"]
            out[(plural, meta["namespace"], meta["name"])] = meta["resourceVersion"]
    return out


State = dict[tuple[str, str, str], str]


def settle(cluster: Cluster, *, quiet: float = 4.0, timeout: float = 240.0) -> State:
    """Wait until no scenario object has changed for ``quiet`` seconds; return that state.
    A loop (a controller and Envelope rewriting the same object) never settles: the
    timeout fails with what kept changing."""
    deadline = time.monotonic() + timeout
    last = _snapshot(cluster)
    still_since = time.monotonic()
    while True:
        time.sleep(1.0)
        now = _snapshot(cluster)
        if now != last:
            changed = sorted({k for k in set(now) | set(last) if now.get(k) != last.get(k)})
            last, still_since = now, time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError(f"the controllers did not settle in {timeout:.0f}s; still changing: "
                                     f"{changed[:20]}")
            continue
        if time.monotonic() - still_since >= quiet:
            return now


def _failed_creates(cluster: Cluster) -> dict[tuple[str, str], list[str]]:
    """(namespace, scenario name) -> FailedCreate event messages (the involved object is a
    workload or child of the scenario: its name starts with the scenario's)."""
    status, body = cluster.api("GET", "/api/v1/events?fieldSelector=reason%3DFailedCreate", timeout=60)
    assert status == 200, body
    out: dict[tuple[str, str], list[str]] = {}
    for event in body.get("items") or []:
        involved = event.get("involvedObject") or {}
        owner = str(involved.get("name", "")).split("-")[0]
        out.setdefault((str(involved.get("namespace")), owner), []).append(str(event.get("message", "")))
    return out


def _counts(state: dict[tuple[str, str, str], str]) -> dict[tuple[str, str], Counter[str]]:
    """(namespace, scenario) -> how many objects of each kind it has (the workload and
    every child: ReplicaSets, Pods, Jobs, ControllerRevisions)."""
    out: dict[tuple[str, str], Counter[str]] = {}
    for plural, namespace, name in state:
        owner = name.split("-")[0]
        out.setdefault((namespace, owner), Counter())[plural] += 1
    return out


# --- the test ---------------------------------------------------------------------------


def _rule_named(message: str) -> bool:
    """An Envelope refusal on purpose: its message ends a finding with ``[rule-id]``."""
    return "denied the request" in message and "[" in message and "]" in message \
        and "Envelope could not evaluate" not in message


def test_convergence_oracle(converging: Converging, oracle_seed: int, request: pytest.FixtureRequest) -> None:
    cluster = converging.cluster
    cases = oracle_cases(request, DEFAULT_CASES)
    scenarios = [generate(i, oracle_seed) for i in range(cases)]
    tag = f"c{oracle_seed}-{int(time.time()) % 100000}"
    ns = {(variant, s): f"conv-{tag}-{variant[0]}{s}" for variant in VARIANTS
          for s in range(len(NAMESPACE_SETUPS))}
    for (variant, s), name in ns.items():
        _namespace(cluster, name, NAMESPACE_SETUPS[s][1], in_path=variant == "webhook")
    time.sleep(2)  # the quota controller fills in the new quotas' status

    def create(item: tuple[str, Scenario]) -> Outcome:
        variant, scn = item
        namespace = ns[(variant, scn.setup)]
        status, got = cluster.api("POST", _base(scn.kind, namespace), scn.obj)
        return Outcome(status, "" if status == 201 else status_message(got))

    work = [(variant, scn) for scn in scenarios for variant in VARIANTS]
    created = dict(zip(((v, s.index) for v, s in work), parallel(create, work), strict=True))
    # The objects of "predates" exist; now the webhook starts to see their namespaces.
    for s in range(len(NAMESPACE_SETUPS)):
        status, got = cluster.api(
            "PATCH", f"/api/v1/namespaces/{ns[('predates', s)]}",
            {"metadata": {"labels": {harness.ISOLATED_NAMESPACE_LABEL: None}}},
            content_type="application/merge-patch+json")
        assert status == 200, got
    settle(cluster)

    problems: list[str] = []
    tally: Counter[str] = Counter()
    history: dict[tuple[str, int], list[str]] = {}  # (variant, scenario) -> "op:HTTP status"

    def judge(variant: str, scn: Scenario, what: str, bare: Outcome, got: Outcome) -> None:
        tally[f"{what} {'accepted' if bare.ok else 'refused'} bare"] += 1
        if bare.ok and not got.ok:
            # A new object (a create, a Job from a CronJob) may be refused by a rule on
            # purpose; an UPDATE of an object written before Envelope saw it, never: what
            # the stored object already has is ratcheted to a warning.
            new_object = what in ("create", "instantiate")
            if _managed_elsewhere(scn.obj) and "[pod-fits-node]" in got.message:
                problems.append(f"#{scn.index} {scn.kind} [{variant}] {what}: managedBy {MANAGED_BY} makes "
                                f"no Pod here, yet refused for where its Pods would go: {got.message[:300]}")
                return
            if _rule_named(got.message) and (variant == "webhook" or new_object):
                tally[f"{what} refused on purpose ({variant})"] += 1
                return
            problems.append(f"#{scn.index} {scn.kind} [{variant}] {what}: accepted without Envelope, "
                            f"HTTP {got.status} with it: {got.message[:300]}")

    tally["managed by another controller"] = sum(_managed_elsewhere(s.obj) for s in scenarios)
    for scn in scenarios:
        for variant in ("webhook", "predates"):
            judge(variant, scn, "create", created[("bare", scn.index)], created[(variant, scn.index)])

    alive = {(v, s.index) for v, s in work if created[(v, s.index)].ok}
    steps = max(len(s.ops) for s in scenarios)
    for step in range(steps):
        batch = [(v, s) for v, s in work if step < len(s.ops) and (v, s.index) in alive]

        def run(item: tuple[str, Scenario], step: int = step) -> Outcome:
            variant, scn = item
            op, n = scn.ops[step]
            return _op(cluster, scn, ns[(variant, scn.setup)], op, n)

        results = dict(zip(((v, s.index) for v, s in batch), parallel(run, batch), strict=True))
        for (v, index), outcome in results.items():
            history.setdefault((v, index), []).append(f"{scenarios[index].ops[step][0]}:{outcome.status}")
        for scn in scenarios:
            if ("bare", scn.index) not in results:
                continue
            op = scn.ops[step][0]
            for variant in ("webhook", "predates"):
                if (variant, scn.index) in results:
                    judge(variant, scn, op, results[("bare", scn.index)], results[(variant, scn.index)])
        settle(cluster)

    state = settle(cluster)
    counts = _counts(state)
    failed = _failed_creates(cluster)
    for scn in scenarios:
        if not all((v, scn.index) in alive for v in VARIANTS):
            continue  # refused on purpose somewhere: nothing to compare
        bare_ns = ns[("bare", scn.setup)]
        bare_counts = counts.get((bare_ns, scn.name), Counter())
        bare_failed = failed.get((bare_ns, scn.name), [])
        for variant in ("webhook", "predates"):
            namespace = ns[(variant, scn.setup)]
            got = counts.get((namespace, scn.name), Counter())
            fails = failed.get((namespace, scn.name), [])
            if fails and not bare_failed:
                on_purpose = variant == "predates" and all(_rule_named(m) for m in fails)
                if on_purpose:
                    tally["pods of a pre-existing template refused on purpose"] += 1
                else:
                    problems.append(f"#{scn.index} {scn.kind} [{variant}]: FailedCreate only with Envelope: "
                                    f"{fails[0][:300]}")
                    continue
            # ControllerRevisions are kept history: compare the objects that run.
            mine = {k: v for k, v in got.items() if k != "controllerrevisions"}
            theirs = {k: v for k, v in bare_counts.items() if k != "controllerrevisions"}
            if bare_failed and mine != theirs and mine.get("pods", 0) > theirs.get("pods", 0):
                # Without Envelope the API server refused the Pods (a quota on
                # limits.memory, say) and with it they were made admissible (memory-limit
                # filled the limit): more Pods is the point, not a divergence. (In
                # "predates" the same FailedCreate happened before the webhook saw the
                # namespace.)
                tally[f"pods admissible only with Envelope ({variant})"] += 1
                continue
            if mine != theirs and not (fails and not bare_failed):
                problems.append(f"#{scn.index} {scn.kind} [{variant}]: steady state "
                                f"{dict(sorted(mine.items()))} != without Envelope "
                                f"{dict(sorted(theirs.items()))}; operations with Envelope "
                                f"{history.get((variant, scn.index))}, without "
                                f"{history.get(('bare', scn.index))}; spec {scn.obj['spec']}")
            tally[f"converged {variant}"] += 1

    print(f"\nconvergence oracle (seed {oracle_seed}, {cases} scenarios x {len(VARIANTS)}): "
          + json.dumps(dict(sorted(tally.items())), indent=1))
    assert not problems, f"{len(problems)} divergences (seed {oracle_seed}):\n" + "\n".join(problems[:40])
