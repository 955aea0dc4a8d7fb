"""Admission oracle: app/namespace_policy.cpu_limit_needs against the API server's
LimitRanger and ResourceQuota admission.

Each case is a fresh namespace (out of the Envelope webhook's path) with 0-2
LimitRanges (``type: Container`` with min/max/default/defaultRequest/
maxLimitRequestRatio, ``type: Pod`` with min/max/maxLimitRequestRatio) and 0-2
ResourceQuotas (``limits.cpu`` and others, with and without ``scopes`` /
``scopeSelector``; ``status.hard`` written as the absent quota controller would),
and one Pod. The Pod as written must be accepted (``dryRun=All``); then the Pod
Envelope would let through — API defaults applied, every CPU limit removed with
app/envelope.move_cpu_limit_to_request — is sent. ``cpu_limit_needs`` non-empty ⇔
the API server refuses it.

A PriorityClass marked ``globalDefault`` exists for the whole run (issue 37, class 1):
the Priority plugin gives it to every Pod that names no class, and the quotas' scopes
(``PriorityClass In/NotIn/Exists/DoesNotExist``, the default class among the values)
then match it. The prediction goes through the model of the plugins before the webhook
(app/k8s/podmodel.py ``admit``), as ``quota-needs-cpu-limits`` does.
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

from app.k8s.defaulting import default_pod
from app.k8s.namespace_policy import cpu_limit_needs, cpu_limit_needs_in_order, limit_range_orders
from app.k8s.podmodel import Admission, admit
from app.rules.envelope import move_cpu_limit_to_request
from harness import Cluster, Webhook

DEFAULT_CASES = 420
PRIORITY_CLASSES = ("oracle-high", "oracle-low")
DEFAULT_CLASS = "oracle-default"
"""The global default during the run: quota scopes name it, Pods get it without naming it."""
CPU = ["100m", "250m", "500m", "1", "2", "4"]


@dataclass
class Case:
    index: int
    limit_ranges: list[dict[str, Any]] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    pod: dict[str, Any] = field(default_factory=dict)
    namespace: str = ""


def _cpu(rng: random.Random, lo: int = 0, hi: int = len(CPU)) -> str:
    return CPU[rng.randrange(lo, hi)]


def _limit_range(rng: random.Random, name: str) -> dict[str, Any]:
    items = []
    if rng.random() < 0.75:
        item: dict[str, Any] = {"type": "Container"}
        lo = rng.randrange(0, 3)
        hi = rng.randrange(lo + 1, len(CPU))
        if rng.random() < 0.4:
            item["min"] = {"cpu": CPU[lo]}
        if rng.random() < 0.5:
            item["max"] = {"cpu": CPU[hi]}
        if rng.random() < 0.4:
            item["default"] = {"cpu": CPU[rng.randrange(lo, hi + 1)]}
        if rng.random() < 0.3:
            item["defaultRequest"] = {"cpu": CPU[lo]}
        if rng.random() < 0.35:
            item["maxLimitRequestRatio"] = {"cpu": rng.choice(["1", "2", "4", "10"])}
        if rng.random() < 0.2:
            item["max"] = {**item.get("max", {}), "memory": "4Gi"}
        items.append(item)
    if rng.random() < 0.5:
        item = {"type": "Pod"}
        if rng.random() < 0.6:
            item["max"] = {"cpu": rng.choice(["1", "2", "4", "8"])}
        if rng.random() < 0.3:
            item["min"] = {"cpu": rng.choice(["100m", "250m"])}
        if rng.random() < 0.4:
            item["maxLimitRequestRatio"] = {"cpu": rng.choice(["1", "2", "5"])}
        items.append(item)
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name}, "spec": {"limits": items}}


def _quota(rng: random.Random, name: str) -> dict[str, Any]:
    hard: dict[str, str] = {}
    if rng.random() < 0.75:
        hard["limits.cpu"] = rng.choice(["1", "2", "4", "100"])
    if rng.random() < 0.3:
        hard["requests.cpu"] = rng.choice(["2", "100"])
    if not hard or rng.random() < 0.1:
        hard["pods"] = "10"
    spec: dict[str, Any] = {"hard": hard}
    kind = rng.randrange(8)
    if kind == 1:
        spec["scopes"] = [rng.choice(["NotBestEffort", "Terminating", "NotTerminating"])]
    elif kind == 2:
        spec["scopes"] = ["NotTerminating", "NotBestEffort"]
    elif kind == 3:
        op = rng.choice(["In", "NotIn", "Exists", "DoesNotExist"])
        expr: dict[str, Any] = {"scopeName": "PriorityClass", "operator": op}
        if op in ("In", "NotIn"):
            expr["values"] = rng.sample((*PRIORITY_CLASSES, DEFAULT_CLASS), rng.randint(1, 2))
        spec["scopeSelector"] = {"matchExpressions": [expr]}
    elif kind == 4:
        spec["scopeSelector"] = {"matchExpressions": [{"scopeName": "CrossNamespacePodAffinity",
                                                       "operator": "Exists"}]}
    elif kind == 5:
        spec["scopes"] = ["BestEffort"]
        spec["hard"] = {"pods": "5"}
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": spec}


def _container(rng: random.Random, name: str) -> dict[str, Any]:
    req: dict[str, str] = {}
    lim: dict[str, str] = {}
    roll = rng.random()
    if roll < 0.6:
        lim["cpu"] = _cpu(rng, 1)
        if rng.random() < 0.5:
            req["cpu"] = _cpu(rng, 0, CPU.index(lim["cpu"]) + 1)
    elif roll < 0.85:
        req["cpu"] = _cpu(rng)
    if rng.random() < 0.6:
        req["memory"] = lim["memory"] = rng.choice(["64Mi", "256Mi", "1Gi"])
    res: dict[str, Any] = {}
    if req:
        res["requests"] = req
    if lim:
        res["limits"] = lim
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": res}


def _pod(rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [_container(rng, f"c{i}") for i in range(rng.randint(1, 2))]}
    if rng.random() < 0.2:
        sidecar = _container(rng, "side")
        if rng.random() < 0.5:
            sidecar["restartPolicy"] = "Always"
        spec["initContainers"] = [sidecar]
    if rng.random() < 0.3:
        spec["activeDeadlineSeconds"] = rng.choice([30, 60])
    if rng.random() < 0.4:
        spec["priorityClassName"] = rng.choice(PRIORITY_CLASSES)
    if rng.random() < 0.15:
        term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "b"}}}
        if rng.random() < 0.6:
            term["namespaces"] = ["other"]
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    if rng.random() < 0.15:
        spec["resources"] = {"limits": {"cpu": rng.choice(["4", "8"]), "memory": "4Gi"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def generate(index: int, seed: int) -> Case:
    rng = random.Random(f"admission-{seed}-{index}")
    case = Case(index=index)
    case.limit_ranges = [_limit_range(rng, f"lr{i}") for i in range(rng.choice([0, 1, 1, 2]))]
    case.quotas = [_quota(rng, f"q{i}") for i in range(rng.choice([0, 1, 1, 2]))]
    case.pod = _pod(rng)
    return case


def stripped(pod: dict[str, Any], limit_ranges: list[dict[str, Any]]) -> dict[str, Any]:
    """The Pod Envelope lets through: as the webhook sees it (API defaults and, before
    v1.37's pod-level defaults, LimitRanger's: app/defaulting.default_pod), every CPU
    limit removed by app/envelope.move_cpu_limit_to_request, the pod-level one too (its
    defaulted request stays)."""
    out = default_pod(pod, limit_ranges)
    spec = out["spec"]
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            move_cpu_limit_to_request(container.setdefault("resources", {}))
            if container["resources"].get("limits") == {}:
                del container["resources"]["limits"]
    pod_level = spec.get("resources")
    if isinstance(pod_level, dict) and isinstance(pod_level.get("limits"), dict):
        pod_level["limits"].pop("cpu", None)
        if not pod_level["limits"]:
            del pod_level["limits"]
    return out


def _ensure_priority_classes(cluster: Cluster) -> None:
    for i, name in enumerate(PRIORITY_CLASSES):
        status, _ = cluster.api("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        if status == 404:
            status, body = cluster.api("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": 1000 - i})
            assert status == 201, body


def _setup(cluster: Cluster, case: Case, *, webhook: bool = False) -> str | None:
    """Namespace, LimitRanges, quotas (with status.hard); None or why it is invalid."""
    case.namespace = isolated_namespace(cluster, f"oracle-adm-{case.index}", webhook=webhook)
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


def admitted(pod: dict[str, Any], limit_ranges: list[dict[str, Any]],
             classes: list[dict[str, Any]]) -> dict[str, Any]:
    """The stripped Pod's spec as the quota admission sees it: through the Priority
    plugin (the model's ``admit``; LimitRanger's defaults are ``cpu_limit_needs``')."""
    return admit(stripped(pod, limit_ranges)["spec"], Admission(priority_classes=classes),
                 limit_ranger=False)[0]


def test_admission_oracle(cluster: Cluster, oracle_seed: int, request: pytest.FixtureRequest) -> None:
    with global_default_priority_class(cluster, DEFAULT_CLASS):
        _admission_oracle(cluster, oracle_seed, request)


def _admission_oracle(cluster: Cluster, oracle_seed: int, request: pytest.FixtureRequest) -> None:
    cases = [generate(i, oracle_seed) for i in range(oracle_cases(request, DEFAULT_CASES))]
    _ensure_priority_classes(cluster)
    classes = priority_classes(cluster)
    started = time.monotonic()
    setups = parallel(lambda c: _setup(cluster, c), cases)
    invalid = {c.index: why for c, why in zip(cases, setups, strict=True) if why}
    time.sleep(1.0)  # the admission plugins' informers see the new LimitRanges and quotas
    live = [c for c in cases if c.index not in invalid]

    def judge(case: Case) -> tuple[int, str, int, str]:
        status, body = create(cluster, case.namespace, "pods", case.pod, dry_run=True)
        if status != 201:
            return status, status_message(body), 0, ""
        s2, b2 = create(cluster, case.namespace, "pods", stripped(case.pod, case.limit_ranges), dry_run=True)
        return status, "", s2, status_message(b2) if s2 != 201 else ""

    disagreements, original_refused, refused, kept, ambiguous, defaulted = [], 0, 0, 0, 0, 0
    refusals: dict[str, int] = {}
    for case, (s1, m1, s2, m2) in zip(live, parallel(judge, live), strict=True):
        if s1 != 201:
            original_refused += 1
            reason = m1.split(": ", 1)[-1][:60]
            refusals[reason] = refusals.get(reason, 0) + 1
            continue
        spec = admitted(case.pod, case.limit_ranges, classes)
        defaulted += "priorityClassName" not in case.pod["spec"] and any(
            e.get("scopeName") == "PriorityClass" for q in case.quotas
            for e in q["spec"].get("scopeSelector", {}).get("matchExpressions", []))
        needs = cpu_limit_needs(spec, case.limit_ranges, case.quotas)
        refused += s2 != 201
        kept += bool(needs)
        outcomes = {bool(cpu_limit_needs_in_order(spec, order, case.quotas))
                    for order in limit_range_orders(case.limit_ranges)[0]}
        if len(outcomes) > 1:
            # LimitRanger's order is undefined and decides this case: either outcome
            # is the API server's (docs/fidelity.md); cpu_limit_needs says "needed".
            ambiguous += 1
            continue
        if bool(needs) != (s2 != 201):
            disagreements.append(
                f"case {case.index}: cpu_limit_needs={[str(n) for n in needs]}; API server: "
                f"{'refused ' + m2 if s2 != 201 else 'accepted'} the stripped pod\n"
                f"  limitranges={[lr['spec'] for lr in case.limit_ranges]}\n"
                f"  quotas={[q['spec'] for q in case.quotas]}\n  pod={case.pod['spec']}\n"
                f"  stripped={stripped(case.pod, case.limit_ranges)['spec']}")
    judged = len(live) - original_refused - ambiguous
    print(f"admission oracle: {judged} cases judged ({len(invalid)} invalid namespaces, "
          f"{original_refused} pods refused as written, {ambiguous} decided by LimitRange order), "
          f"{refused} stripped pods refused, {defaulted} judged with the default PriorityClass "
          f"under a PriorityClass-scoped quota, "
          f"{kept} predicted, seed {oracle_seed}, {time.monotonic() - started:.1f}s, "
          f"{len(disagreements)} disagreements")
    for reason, n in sorted(refusals.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {n} pods refused as written: {reason}")
    for index, why in list(invalid.items())[:5]:
        print(f"case {index} invalid: {why}")
    assert not disagreements, "\n".join(disagreements[:10])
    assert judged >= min(200, len(cases) // 3), f"only {judged} cases judged"
    assert 0 < refused < judged, "the generator must produce both outcomes"


WEBHOOK_CASES = 100
CPU_RULES = {"cpu-limits", "quota-needs-cpu-limits", "limitrange-needs-cpu-limits", "env-envelope-cpu"}


def _has_cpu_limit(container: dict[str, Any]) -> bool:
    return "cpu" in (container.get("resources", {}).get("limits") or {})


def test_pods_through_the_webhook_are_never_refused_for_lost_cpu_limits(
        cluster: Cluster, webhook: Webhook, oracle_seed: int, request: pytest.FixtureRequest) -> None:
    """The Pod path (docs/fidelity.md, deliberate difference): the same generated
    namespaces and Pods, with the Envelope webhook in the path (guards in their default
    warn mode). A Pod the API server accepts without Envelope must be accepted with
    it: Envelope strips CPU limits only where the namespace lets Pods live without
    them, judging the Pod after LimitRanger's defaults (``limit_range_defaults=False``).
    Both outcomes must occur: some Pods stripped, some keeping their limits."""
    # Fewer than ~60 leave too few valid Pods to see both paths (9 of 25 on v1.35.4).
    cases = [generate(i, oracle_seed + 1)
             for i in range(oracle_cases(request, WEBHOOK_CASES, minimum=WEBHOOK_CASES))]
    _ensure_priority_classes(cluster)
    plain = [Case(c.index, c.limit_ranges, c.quotas, c.pod) for c in cases]
    setups = parallel(lambda c: _setup(cluster, c), plain)
    setups_hooked = parallel(lambda c: _setup(cluster, c, webhook=True), cases)
    live = [(p, h) for p, h, a, b in zip(plain, cases, setups, setups_hooked, strict=True) if not a and not b]
    time.sleep(2.0)  # the webhook's cluster view and the admission plugins see the new objects

    def judge(pair: tuple[Case, Case]) -> tuple[int, int, Any]:
        without, hooked = pair
        s1, _ = create(cluster, without.namespace, "pods", without.pod, dry_run=True)
        s2, b2 = create(cluster, hooked.namespace, "pods", hooked.pod, dry_run=True)
        return s1, s2, b2

    refused, stripped, kept, judged = [], 0, 0, 0
    other: dict[str, int] = {}
    for (without, _), (s1, s2, b2) in zip(live, parallel(judge, live), strict=True):
        if s1 != 201:
            continue
        judged += 1
        if s2 != 201:
            message = status_message(b2)
            rule = message.rsplit("[", 1)[-1].rstrip("]") if "admission webhook" in message else ""
            if rule and rule not in CPU_RULES:
                # Envelope's own verdict on something else (see docs/fidelity.md).
                other[rule] = other.get(rule, 0) + 1
                continue
            refused.append(f"case {without.index}: {message}\n  pod={without.pod['spec']}\n"
                           f"  limitranges={[lr['spec'] for lr in without.limit_ranges]}\n"
                           f"  quotas={[q['spec'] for q in without.quotas]}")
            continue
        had = any(_has_cpu_limit(c) for c in without.pod["spec"]["containers"])
        has = any(_has_cpu_limit(c) for c in b2["spec"]["containers"])
        if had:
            stripped += not has
            kept += has
    print(f"admission through the webhook: {judged} pods accepted without Envelope, {len(refused)} refused "
          f"for CPU limits; of those with CPU limits, {stripped} stripped and {kept} kept; "
          f"denied by other rules: {other}; seed {oracle_seed + 1}")
    assert not refused, "\n".join(refused[:10])
    assert stripped and kept, "both paths must be exercised"
