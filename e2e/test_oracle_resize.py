"""Resize oracle (issue 27, item 2): in-place resizes (``pods/resize``, GA 1.35) on the
real API server, without Envelope and with it.

Each case is a generated Pod (one or two containers, sometimes a sidecar or a plain init
container, sometimes pod-level resources), created and bound to a Node object
(``pods/binding``; no kubelet) twice: in a namespace in the webhook's path and in one
out of it. Half of the cases create the first Pod *before* its namespace enters the
webhook's path (a Pod that predates Envelope: CPU limits and all); the others create
it through Envelope (stripped, memory limits filled), and the Pod without Envelope is
then created with the resources Envelope stored, so both start alike (a Pod as
written with a memory request alone may raise it past where Envelope's equal limit
lets it: that is the create's policy, not the resize's). Then the same
strategic-merge patch is sent to both Pods' ``resize`` subresource. Asserted:

- every resize the API server accepts without Envelope is accepted with it, unless a
  policy rule of Envelope refuses it on purpose (its rule id in the message, one of
  ``ON_PURPOSE``);
- no answer of Envelope makes the API server refuse (a refusal that is not the
  webhook's, where the Pod without Envelope was resized);
- after an accepted resize with Envelope: every CPU limit the Pod had is still there,
  none was added, and a container's memory request equals its limit where both are set.

``--cases N`` for long runs (default 120), ``--oracle-seed``. Prints the tally.
"""

from __future__ import annotations

import copy
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from conftest import oracle_cases
from oracle import isolated_namespace, parallel, status_message

import harness
from app.k8s.quantity import parse_quantity
from harness import Cluster, Webhook

DEFAULT_CASES = 120
ON_PURPOSE = {"memory-request-equals-limit"}
"""Rules that refuse a resize by policy (docs/fidelity.md, "In-place resize")."""
CPU = ["100m", "250m", "500m", "1", "2", "3"]
MEMORY = ["64Mi", "128Mi", "256Mi", "512Mi", "1Gi"]
NODE = "oracle-resize-node"
SMP = "application/strategic-merge-patch+json"


@dataclass
class Case:
    index: int
    pod: dict[str, Any]
    patch: dict[str, Any]
    predates: bool
    """The Pod with Envelope was created before its namespace entered the webhook's path."""
    outcomes: dict[str, Any] = field(default_factory=dict)


def _resources(rng: random.Random) -> dict[str, Any]:
    req: dict[str, str] = {}
    lim: dict[str, str] = {}
    roll = rng.random()
    if roll < 0.5:
        lim["cpu"] = rng.choice(CPU[1:])
        if rng.random() < 0.6:
            req["cpu"] = CPU[rng.randrange(0, CPU.index(lim["cpu"]) + 1)]
    elif roll < 0.9:
        req["cpu"] = rng.choice(CPU)
    roll = rng.random()
    if roll < 0.6:
        req["memory"] = lim["memory"] = rng.choice(MEMORY)
    elif roll < 0.85:  # a request alone: what memory-limit fills, when the QoS class allows
        req["memory"] = rng.choice(MEMORY)
    out: dict[str, Any] = {}
    if req:
        out["requests"] = req
    if lim:
        out["limits"] = lim
    return out


def _container(rng: random.Random, name: str) -> dict[str, Any]:
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": _resources(rng)}


def _pod(rng: random.Random, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [_container(rng, f"c{i}") for i in range(rng.randint(1, 2))],
                            "terminationGracePeriodSeconds": 0}
    if rng.random() < 0.2:
        init = _container(rng, "side")
        if rng.random() < 0.6:
            init["restartPolicy"] = "Always"
        spec["initContainers"] = [init]
    if rng.random() < 0.1:
        spec["resources"] = {"requests": {"cpu": "8", "memory": "8Gi"},
                             "limits": {"cpu": rng.choice(["10", "12"]), "memory": "8Gi"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _resize_of(rng: random.Random, name: str) -> dict[str, Any]:
    """A change of one container's resources as ``kubectl patch --subresource resize``
    sends it: values set, sometimes one removed (``null``, which the API server refuses)."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.45:
        requests["cpu"] = rng.choice(CPU)
    elif roll < 0.75:
        limits["cpu"] = rng.choice(CPU[1:])
        if rng.random() < 0.7:
            requests["cpu"] = CPU[rng.randrange(0, CPU.index(limits["cpu"]) + 1)]
    elif roll < 0.8:
        limits["cpu"] = None
    roll = rng.random()
    if roll < 0.4:
        requests["memory"] = limits["memory"] = rng.choice(MEMORY)
    elif roll < 0.55:
        requests["memory"], limits["memory"] = rng.sample(MEMORY, 2)
    elif roll < 0.8:
        requests["memory"] = rng.choice(MEMORY)
    elif roll < 0.85:
        limits["memory"] = None
    if not requests and not limits:
        requests["cpu"] = rng.choice(CPU)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": name, "resources": resources}


def generate(index: int, seed: int) -> Case:
    rng = random.Random(f"resize-{seed}-{index}")
    pod = _pod(rng, f"r{index}")
    names = [c["name"] for c in pod["spec"]["containers"]]
    if "initContainers" in pod["spec"] and rng.random() < 0.4:
        patch = {"spec": {"initContainers": [_resize_of(rng, "side")]}}
    else:
        patch = {"spec": {"containers": [_resize_of(rng, rng.choice(names))]}}
    if "resources" in pod["spec"] and rng.random() < 0.5:
        patch["spec"]["resources"] = {"limits": {"cpu": rng.choice(["10", "12", "14"])}}
    return Case(index, pod, patch, predates=rng.random() < 0.5)


def _create_bound(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> tuple[int, Any]:
    """POST the Pod and bind it to the Node (what the scheduler would do)."""
    name = pod["metadata"]["name"]
    status, body = cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    if status != 201:
        return status, body
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}
    s2, b2 = cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", binding)
    assert s2 == 201, f"binding {namespace}/{name}: {s2} {b2}"
    return cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")


def _as_stored(case: Case, created: tuple[int, Any]) -> dict[str, Any]:
    """The case's Pod with the resources Envelope's Pod was stored with (the Pod as
    written when Envelope was not in the path, or its create was refused)."""
    status, body = created
    if case.predates or status != 200:
        return case.pod
    pod = copy.deepcopy(case.pod)
    for key in ("containers", "initContainers"):
        for mine, theirs in zip(pod["spec"].get(key) or [], body["spec"].get(key) or [], strict=True):
            mine["resources"] = theirs.get("resources", {})
    if "resources" in body["spec"]:
        pod["spec"]["resources"] = body["spec"]["resources"]
    return pod


def _cpu_limited(pod: dict[str, Any]) -> set[str]:
    spec = pod["spec"]
    found = {f"{key}/{c['name']}" for key in ("containers", "initContainers")
             for c in spec.get(key) or [] if "cpu" in (c.get("resources", {}).get("limits") or {})}
    if "cpu" in ((spec.get("resources") or {}).get("limits") or {}):
        found.add("pod")
    return found


def _memory_split(pod: dict[str, Any]) -> list[str]:
    out = []
    for key in ("containers", "initContainers"):
        for c in pod["spec"].get(key) or []:
            res = c.get("resources") or {}
            req, lim = (res.get("requests") or {}).get("memory"), (res.get("limits") or {}).get("memory")
            if req is not None and lim is not None and parse_quantity(req) != parse_quantity(lim):
                out.append(f"{c['name']}: {req} != {lim}")
    return out


def _webhook_rules(message: str) -> list[str]:
    """The rule ids of an Envelope denial (``... [rule-id]``), empty for the API server's own."""
    if "admission webhook" not in message or "envelope.io" not in message:
        return []
    return re.findall(r"\[([a-z0-9-]+)\]", message)


def _in_webhook_path(cluster: Cluster, namespace: str) -> bool:
    """A dry-run Pod with a CPU limit comes back stripped: the webhook sees the namespace."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                      "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]}}
    status, body = cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
    return status == 201 and "cpu" not in body["spec"]["containers"][0]["resources"].get("limits", {})


def test_resize_oracle(cluster: Cluster, webhook: Webhook, oracle_seed: int,
                       request: pytest.FixtureRequest) -> None:
    cases = [generate(i, oracle_seed) for i in range(oracle_cases(request, DEFAULT_CASES))]
    started = time.monotonic()
    if cluster.api("GET", f"/api/v1/nodes/{NODE}")[0] == 404:
        cluster.create_node(NODE, {"cpu": "64", "memory": "256Gi", "pods": "500"})
    plain = isolated_namespace(cluster, "oracle-resize-plain")
    before = isolated_namespace(cluster, "oracle-resize-before")  # enters the path below
    hooked = isolated_namespace(cluster, "oracle-resize-hooked", webhook=True)
    where = {c.index: before if c.predates else hooked for c in cases}

    created_before = parallel(lambda c: _create_bound(cluster, before, c.pod),
                              [c for c in cases if c.predates])
    status, body = cluster.api("PATCH", f"/api/v1/namespaces/{before}",
                               {"metadata": {"labels": {harness.ISOLATED_NAMESPACE_LABEL: None}}},
                               content_type="application/merge-patch+json")
    assert status == 200, body
    deadline = time.monotonic() + 30
    while not _in_webhook_path(cluster, before) or not _in_webhook_path(cluster, hooked):
        assert time.monotonic() < deadline, "the webhook never saw the oracle's namespaces"
        time.sleep(0.5)
    created_hooked = parallel(lambda c: _create_bound(cluster, hooked, c.pod),
                              [c for c in cases if not c.predates])
    it_before, it_hooked = iter(created_before), iter(created_hooked)
    with_envelope = [next(it_before) if c.predates else next(it_hooked) for c in cases]
    # Without Envelope, the same Pod as stored with it: a Pod made through Envelope has
    # no CPU limit and memory limits equal to requests, and a resize starts from there.
    created_plain = parallel(lambda pair: _create_bound(cluster, plain, _as_stored(*pair)),
                             list(zip(cases, with_envelope, strict=True)))
    stored: dict[int, tuple[Any, Any]] = {}
    invalid: list[str] = []
    for case, (s1, b1), (s2, b2) in zip(cases, created_plain, with_envelope, strict=True):
        if s1 != 200 or s2 != 200:  # the admission oracle's business, not this one's
            invalid.append(f"case {case.index}: {status_message(b1 if s1 != 200 else b2)[:120]}")
            continue
        stored[case.index] = (b1, b2)
    cases = [c for c in cases if c.index in stored]
    time.sleep(1.0)  # the webhook's view holds the Node

    def resize(case: Case) -> tuple[int, Any, int, Any]:
        name = case.pod["metadata"]["name"]
        s1, b1 = cluster.api("PATCH", f"/api/v1/namespaces/{plain}/pods/{name}/resize",
                             case.patch, content_type=SMP)
        s2, b2 = cluster.api("PATCH", f"/api/v1/namespaces/{where[case.index]}/pods/{name}/resize",
                             case.patch, content_type=SMP)
        return s1, b1, s2, b2

    tally = {"accepted both": 0, "refused both": 0, "refused on purpose": 0,
             "accepted only with Envelope": 0, "cpu limits added and stripped": 0,
             "predating pods": sum(c.predates for c in cases)}
    purpose: dict[str, int] = {}
    refusals: dict[str, int] = {}
    problems: list[str] = []
    for case, (s1, b1, s2, b2) in zip(cases, parallel(resize, cases), strict=True):
        plain_pod, hooked_pod = stored[case.index]
        where_text = (f"case {case.index} ({'predates' if case.predates else 'through Envelope'}): "
                      f"pod={case.pod['spec']}\n  with Envelope={hooked_pod['spec']}\n"
                      f"  patch={case.patch}")
        if s1 != 200:
            reason = re.sub(r"\d+", "N", status_message(b1).split(": ", 2)[-1])[:70]
            refusals[reason] = refusals.get(reason, 0) + 1
        if s1 == 200 and s2 != 200:
            message = status_message(b2)
            rules = _webhook_rules(message)
            if rules and set(rules) <= ON_PURPOSE:
                tally["refused on purpose"] += 1
                for r in rules:
                    purpose[r] = purpose.get(r, 0) + 1
                continue
            problems.append(f"{where_text}\n  accepted without Envelope, refused with it: {message}")
            continue
        if s2 != 200:
            tally["refused both"] += 1
            continue
        tally["accepted both" if s1 == 200 else "accepted only with Envelope"] += 1
        had, has = _cpu_limited(hooked_pod), _cpu_limited(b2)
        if had - has:
            problems.append(f"{where_text}\n  lost CPU limits {sorted(had - has)}")
        if has - had:
            problems.append(f"{where_text}\n  kept CPU limits the resize added: {sorted(has - had)}")
        if s1 == 200 and _cpu_limited(b1) - _cpu_limited(plain_pod) and not has - had:
            tally["cpu limits added and stripped"] += 1
        split = _memory_split(b2)
        if split and not _memory_split(hooked_pod):
            problems.append(f"{where_text}\n  memory request != limit after the resize: {split}")
    print(f"resize oracle: {len(cases)} resizes ({len(invalid)} pods refused at create), "
          f"seed {oracle_seed}, "
          f"{time.monotonic() - started:.1f}s: {tally}; refused on purpose by {purpose}; "
          f"{len(problems)} disagreements")
    for reason, n in sorted(refusals.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {n} refused without Envelope: {reason}")
    for why in invalid[:3]:
        print(f"  {why}")
    assert not problems, "\n".join(problems[:8])
    assert len(invalid) <= len(cases) // 10, "the generator makes too many invalid pods"
    assert tally["accepted both"] >= len(cases) // 4, "too few resizes accepted to judge"
    assert tally["refused both"] and tally["refused on purpose"], "the generator must refuse some"
    assert tally["cpu limits added and stripped"], "no resize added a CPU limit"
