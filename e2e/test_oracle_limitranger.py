"""LimitRanger defaulting oracle: app/defaulting.default_pod(pod, limit_ranges) against the Pod the API
server stores (issue 28, class 3).

Each case is a fresh namespace out of the Envelope webhook's path with 0-2 LimitRanges
(``type: Container`` with cpu/memory default, defaultRequest, min, max) and one Pod (one
or two containers, maybe an init container, cpu and memory requests and limits in any
combination, maybe pod-level resources). The Pod is created with ``dryRun=All``; the
resources the API server answers with — decoding's defaults, LimitRanger's, and the
pod-level defaults (``PrepareForCreate`` at v1.37) — must equal ``default_pod``'s, value
for value. With two LimitRanges the order LimitRanger applies them in is the lister's
(undefined): a case whose two orders give different Pods accepts either.
"""

from __future__ import annotations

import random
import time
from decimal import Decimal
from typing import Any

import pytest
from conftest import oracle_cases
from oracle import create, isolated_namespace, parallel, status_message

from app.k8s.defaulting import LIMIT_RANGER_ANNOTATION, default_pod, limit_ranger_pod
from app.k8s.quantity import parse_quantity
from harness import Cluster

DEFAULT_CASES = 280
CPU = ["100m", "250m", "500m", "1", "2"]
MEMORY = ["128Mi", "256Mi", "512Mi", "1Gi", "2Gi"]


def _pick(rng: random.Random, values: list[str]) -> str:
    return values[rng.randrange(len(values))]


def _limit_range(rng: random.Random, name: str) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "Container"}
    for resource, values in (("cpu", CPU), ("memory", MEMORY)):
        lo = rng.randrange(0, 2)
        hi = rng.randrange(3, len(values))
        for field, p in (("min", 0.2), ("max", 0.3), ("default", 0.5), ("defaultRequest", 0.5)):
            if rng.random() < p:
                low, high = (lo, lo) if field == "min" else (hi, hi) if field == "max" else (lo, hi)
                item.setdefault(field, {})[resource] = values[rng.randrange(low, high + 1)]
    # keep the LimitRange valid: defaultRequest <= default (the API server refuses it otherwise)
    for resource in ("cpu", "memory"):
        d, r = item.get("default", {}).get(resource), item.get("defaultRequest", {}).get(resource)
        if d and r and parse_quantity(r) > parse_quantity(d):
            item["defaultRequest"][resource] = d
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name},
            "spec": {"limits": [item]}}


def _resources(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for resource, values in (("cpu", CPU), ("memory", MEMORY)):
        shape = rng.choice(["none", "none", "request", "limit", "both", "equal"])
        if shape == "none":
            continue
        a, b = sorted(rng.sample(range(len(values)), 2))
        if shape in ("request", "both", "equal"):
            out.setdefault("requests", {})[resource] = values[a if shape == "both" else b]
        if shape in ("limit", "both", "equal"):
            out.setdefault("limits", {})[resource] = values[b]
    return out


def _pod(rng: random.Random) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": "registry.example/app:1", "resources": _resources(rng)}
                  for i in range(rng.choice([1, 1, 2]))]
    spec: dict[str, Any] = {"containers": containers}
    if rng.random() < 0.2:
        spec["initContainers"] = [{"name": "init", "image": "registry.example/app:1",
                                   "resources": _resources(rng)}]
    if rng.random() < 0.3:
        pod_level: dict[str, Any] = {}
        for resource, values in (("cpu", CPU), ("memory", MEMORY)):
            if rng.random() < 0.6:
                top = values[-1] if resource == "memory" else "4"
                section = rng.choice(["limits", "requests", "limits"])
                pod_level.setdefault(section, {})[resource] = top
        if pod_level:
            spec["resources"] = pod_level
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def _values(spec: dict[str, Any]) -> dict[str, Decimal]:
    """Every resource value of a pod spec, by where it is, as numbers."""
    out: dict[str, Decimal] = {}
    blocks = [(f"{key}[{i}]", c.get("resources") or {})
              for key in ("containers", "initContainers")
              for i, c in enumerate(spec.get(key) or [])]
    blocks.append(("pod", spec.get("resources") or {}))
    for where, resources in blocks:
        for section in ("requests", "limits"):
            for name, value in (resources.get(section) or {}).items():
                out[f"{where}.{section}.{name}"] = parse_quantity(value)
    return out


def _judge(cluster: Cluster, index: int, seed: int, minor: int) -> tuple[str, str]:
    rng = random.Random(f"defaulting-{seed}-{index}")
    lrs = [_limit_range(rng, f"lr{i}") for i in range(rng.choice([0, 1, 1, 2]))]
    pod = _pod(rng)
    namespace = isolated_namespace(cluster, f"oracle-def-{index}")
    for lr in lrs:
        status, body = create(cluster, namespace, "limitranges", lr)
        if status != 201:
            return "invalid", f"LimitRange refused: {status_message(body)}"
    time.sleep(0.5)  # LimitRanger's informer sees the new LimitRanges
    status, body = create(cluster, namespace, "pods", pod, dry_run=True)
    if status != 201:
        return "refused", status_message(body)[:80]
    stored = _values(body["spec"])
    orders = [lrs] if len(lrs) < 2 else [lrs, lrs[::-1]]
    predicted = [_values(default_pod(pod, order, minor=minor)["spec"]) for order in orders]
    # what LimitRanger says it set, as `envelope check` writes it on a Pod (issue 37)
    note = (body["metadata"].get("annotations") or {}).get(LIMIT_RANGER_ANNOTATION)
    notes = [(limit_ranger_pod(pod, order).get("metadata", {}).get("annotations") or {}).get(
        LIMIT_RANGER_ANNOTATION) for order in orders]
    if note not in notes:
        return "disagree", (f"case {index}: limitranges={[lr['spec']['limits'] for lr in lrs]}\n"
                            f"  pod={pod['spec']}\n  annotation={note!r}\n  predicted={notes[0]!r}")
    if stored in predicted:
        return "agree", ""
    return "disagree", (f"case {index}: limitranges={[lr['spec']['limits'] for lr in lrs]}\n"
                        f"  pod={pod['spec']}\n  stored={stored}\n  predicted={predicted[0]}")


def test_limitranger_defaulting_oracle(cluster: Cluster, oracle_seed: int,
                                       request: pytest.FixtureRequest, kube_minor: int) -> None:
    cases = range(oracle_cases(request, DEFAULT_CASES))
    started = time.monotonic()
    results = parallel(lambda i: _judge(cluster, i, oracle_seed, kube_minor), cases)
    counts: dict[str, int] = {}
    for verdict, _ in results:
        counts[verdict] = counts.get(verdict, 0) + 1
    disagreements = [why for verdict, why in results if verdict == "disagree"]
    print(f"limitranger defaulting oracle: {len(results)} cases, {counts}, seed {oracle_seed}, "
          f"{time.monotonic() - started:.1f}s")
    for verdict, why in results:
        if verdict in ("refused", "invalid"):
            print(f"  {verdict}: {why}")
            break
    assert not disagreements, "\n".join(disagreements[:8])
    assert counts.get("agree", 0) >= min(200, len(results) * 2 // 3), counts
