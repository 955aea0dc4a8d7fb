"""docs/metrics.md and /metrics agree: every exported metric is documented, and every
documented metric is exported (after reviews that exercise each of them)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from prometheus_client import generate_latest

from app.core.config import Policy
from app.serve.server import Metrics, create_app
from tests.conftest import RULES, container, workload

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
STANDARD = ("process_", "python_")


def documented() -> set[str]:
    return set(re.findall(r"^\| `(envelope_[a-z_]+)` \|", DOC.read_text(), re.M))


def exported(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            names.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
    return {n for n in names if not n.startswith(STANDARD) and not n.endswith("_created")}


def exercised_metrics() -> str:
    metrics = Metrics()
    informer = SimpleNamespace(resource=SimpleNamespace(kind="Node"), synced=True, relists=2,
                               last_heard=0.0, stale_for=lambda now: 0.0)
    metrics.watches.view = SimpleNamespace(informers=[informer], staleness=60)
    metrics.cert_expiry.set(1.0)
    from app.serve.failurepolicy import PolicyMetrics  # registered by `serve` beside these

    policy_metrics = PolicyMetrics(metrics.registry)
    policy_metrics.lowered.labels("envelope", "workloads.validate.envelope.io").set(0)
    policy_metrics.resets.labels("envelope").inc()
    from app.intree.facts import FactMetrics  # `serve --in-tree-facts`

    fact_metrics = FactMetrics(metrics.registry)
    fact_metrics.rounds.labels("ok").inc()
    fact_metrics.writes.labels("added").inc()
    from app.serve.policyreload import PolicyReloader, ReloadMetrics  # `serve --config`

    ReloadMetrics(PolicyReloader("policy.yaml", RULES, lambda p: None), metrics.registry)
    app = create_app(RULES, Policy(), metrics=metrics)
    obj = workload("Deployment", [container(limits={"cpu": "2", "memory": "1Gi"})],
                   annotations={"envelope.io/exempt": "pod-fits-node"})
    review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "u", "kind": {"group": "apps", "version": "v1",
                                                          "kind": "Deployment"},
                                     "operation": "CREATE", "object": obj}})

    async def post(path: str, body: str, content_type: str = "application/json") -> Any:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post(path, content=body, headers={"content-type": content_type})

    for path in ("/mutate", "/validate"):
        assert asyncio.run(post(path, review)).status_code == 200
    assert asyncio.run(post("/mutate", "{", "text/plain")).status_code == 415
    return generate_latest(metrics.registry).decode()


def test_every_metric_is_documented_and_every_documented_metric_exists() -> None:
    from tests.helpers.quotametrics import exercised_quota_metrics  # the audit's quota gauges

    text = exercised_metrics() + exercised_quota_metrics()
    assert exported(text) == documented()
    assert "process_resident_memory_bytes" in text and "python_gc_objects_collected_total" in text


def test_the_labels_say_what_happened() -> None:
    text = exercised_metrics()
    assert 'envelope_rule_results_total{result="warn",rule="cpu-limits"} 1.0' in text  # + QoS warning
    assert 'envelope_rule_results_total{result="pass",rule="memory-limit"} 1.0' in text
    assert 'envelope_rule_results_total{result="skip",rule="pod-fits-node"} 1.0' in text
    assert 'envelope_patches_total{kind="Deployment"} 1.0' in text
    assert ('envelope_admission_requests_total{decision="malformed",endpoint="mutate",kind="other",'
            'operation=""} 1.0') in text
    assert 'envelope_watch_relists_total{kind="Node"} 2.0' in text
    assert 'envelope_watch_synced{kind="Node"} 1.0' in text
