"""Deployments for the side-by-side runs: the timed objects and the generated set the
same-answer check sends through every peer and Envelope.

Left out of both: string envelopes in env (``RESOURCE_LIMITS="cpu=7,memory=29Gi"``),
which Envelope rewrites and the peers cannot (see ``policies.py``).
"""

from __future__ import annotations

import copy
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from webhook import deployment  # noqa: E402

from app.cluster.view import StaticView  # noqa: E402
from app.core.config import Policy  # noqa: E402
from app.core.engine import check_object  # noqa: E402
from app.core.frontdoor import subject_of  # noqa: E402
from app.core.ruleset import default_ruleset  # noqa: E402

STRING_ENVELOPES = ("RESOURCE_LIMITS",)


def timed_deployment() -> dict[str, Any]:
    """bench/webhook.py's 3-container Deployment (CPU limits to strip) without the
    limits string envelope: every peer can do all of what Envelope does to it."""
    obj = deployment()
    for c in obj["spec"]["template"]["spec"]["containers"]:
        c["env"] = [e for e in c["env"] if e["name"] not in STRING_ENVELOPES]
    return obj


def burstable_deployment() -> dict[str, Any]:
    """:func:`timed_deployment` with the log-shipper's memory limit left out (its memory
    request stays): a Burstable pod, so no container has exclusive cores to lose and
    Envelope gives no warning — the write is in the in-tree policy's domain (the timed
    Deployment, a Guaranteed pod whose every container has CPU and memory limits, is
    not: app/intree/compile.py ``_domain``). Envelope's answer: the three CPU limits
    removed, the three CPU requests written, the log-shipper's memory limit set to its
    request, the mutations annotation."""
    obj = timed_deployment()
    shipper = obj["spec"]["template"]["spec"]["containers"][2]
    if shipper["name"] != "log-shipper":
        raise RuntimeError(f"bench/webhook.py's third container is {shipper['name']}, not log-shipper")
    del shipper["resources"]["limits"]["memory"]
    return obj


def stored_form(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as Envelope would store it (a second pass changes nothing)."""
    rules = default_ruleset()
    result = check_object(rules, subject_of(obj), StaticView(), Policy())
    if result.errors:
        raise RuntimeError(f"Envelope refuses the object: {result.findings}")
    again = check_object(rules, subject_of(result.obj), StaticView(), Policy())
    if again.patch or again.errors:
        raise RuntimeError(f"the stored form still changes: {again.patch} {again.findings}")
    return result.obj


def compliant_deployment() -> dict[str, Any]:
    return stored_form(timed_deployment())


CPU = ["1", "2", "500m", "250m", "7", "1500m"]
MEMORY = ["64Mi", "128Mi", "1Gi", "512Mi"]


def _resources(rng: random.Random) -> dict[str, Any] | None:
    cpu, mem, req = rng.choice(CPU), rng.choice(MEMORY), rng.choice(["100m", "250m"])
    return rng.choice([
        None,
        {"limits": {"cpu": cpu}},
        {"limits": {"cpu": cpu, "memory": mem}},
        {"limits": {"cpu": cpu, "memory": mem}, "requests": {"memory": mem}},
        {"limits": {"cpu": cpu, "memory": mem}, "requests": {"cpu": req, "memory": mem}},
        {"limits": {"memory": mem}, "requests": {"memory": mem}},
        {"requests": {"memory": mem}},
        {"requests": {"cpu": req, "memory": mem}},
        {"limits": {"memory": mem}},
        {"limits": {"cpu": cpu, "ephemeral-storage": "1Gi"}, "requests": {"memory": mem}},
    ])


def _container(rng: random.Random, name: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10"}
    resources = _resources(rng)
    if resources is not None:
        c["resources"] = resources
    return c


def generated_deployments(count: int, seed: str = "peers") -> list[dict[str, Any]]:
    """Deployments with CPU limits or not, with and without CPU requests, memory
    requests without limits, init containers, pod-level resources and the opt-out
    annotation (on the object or the template), each one Envelope admits."""
    rng = random.Random(seed)
    out = []
    labels = {"app": "same-answer"}
    for i in range(count):
        spec: dict[str, Any] = {"containers": [_container(rng, f"c{j}") for j in range(rng.randint(1, 3))]}
        if rng.random() < 0.3:
            spec["initContainers"] = [_container(rng, f"init{j}") for j in range(rng.randint(1, 2))]
        if rng.random() < 0.15:
            # No pod-level CPU limit: Envelope now writes the pod-level CPU request as the
            # containers' summed requests, which the peers' policies do not (they write the
            # limit, as Envelope did until main's pod-level change): a known difference.
            spec["resources"] = rng.choice([{"limits": {"memory": "256Gi"}, "requests": {"memory": "256Gi"}},
                                            {"requests": {"memory": "256Gi"}}])
        meta: dict[str, Any] = {"name": f"same-{i}", "labels": labels}
        template_meta: dict[str, Any] = {"labels": labels}
        where = rng.randrange(8)
        if where == 0:
            meta["annotations"] = {"envelope.io/keep-cpu-limit": "true"}
        elif where == 1:
            template_meta["annotations"] = {"envelope.io/keep-cpu-limit": " TRUE "}
        elif where == 2:
            meta["annotations"] = {"envelope.io/keep-cpu-limit": "false"}
        out.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                    "spec": {"selector": {"matchLabels": labels},
                             "template": {"metadata": template_meta, "spec": spec}}})
    return out


#: Envelope's own record of what it changed (``app`` writes it with every patch): not part
#: of the job the peers are asked to do, so not compared.
BOOKKEEPING = ("envelope.io/mutations",)


def comparable(stored: dict[str, Any], *, bookkeeping: bool = False) -> dict[str, Any]:
    """What a write decided: the spec and the labels and annotations it stored (less
    Envelope's bookkeeping annotation, unless ``bookkeeping``: Envelope against Envelope)."""
    meta = stored.get("metadata", {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if bookkeeping or k not in BOOKKEEPING}
    return {"labels": meta.get("labels"), "annotations": annotations or None,
            "spec": copy.deepcopy(stored.get("spec"))}
