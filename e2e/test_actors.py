"""ate.dev ActorTemplates and WorkerPools through the real API server (our CRDs in
e2e/crds/), refused or warned by the webhook as a kubectl user sees it."""

from __future__ import annotations

from typing import Any

from harness import Cluster, Webhook


def template(name: str, ns: str, limits: dict[str, str] | None = None, sandbox: str = "microvm",
             requests: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"sandboxClass": sandbox, "resources": resources,
                     "snapshotsConfig": {"location": "gs://snapshots/agents"},
                     "containers": [{"name": "agent", "image": "registry.example/agent@sha256:" + "a" * 64}]}}


def pool(name: str, ns: str, limits: dict[str, str], sandbox: str = "microvm") -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 2, "sandboxClass": sandbox,
                     "ateomImage": "registry.example/ateom@sha256:" + "b" * 64,
                     "template": {"resources": {"limits": limits}}}}


def test_actor_envelopes_are_judged_at_apply(cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    cluster.apply(pool("workers", namespace, {"cpu": "4", "memory": "8Gi"}))

    out = cluster.apply(template("tiny", namespace, {"cpu": "1", "memory": "255Mi"}), check=False)
    assert out.returncode != 0
    assert "below the floor of 256Mi (128Mi VMM reserve + 128Mi guest minimum)" in out.stderr

    out = cluster.apply(template("sized", namespace, {"cpu": "1", "memory": "1Gi"},
                                 requests={"memory": "1Gi"}), "--dry-run=server", check=False)
    assert out.returncode != 0 and "actors are sized by spec.resources.limits only" in out.stderr

    out = cluster.apply(template("huge", namespace, {"cpu": "2", "memory": "16Gi"}), check=False)
    assert out.returncode != 0 and "needs" in out.stderr and "8Gi" in out.stderr

    cluster.apply(template("ok", namespace, {"cpu": "2", "memory": "1Gi"}))
    # the same size written differently is no change; a real change is refused
    cluster.apply(template("ok", namespace, {"cpu": "2000m", "memory": "1024Mi"}))
    out = cluster.apply(template("ok", namespace, {"cpu": "2", "memory": "2Gi"}), check=False)
    assert out.returncode != 0 and "ActorTemplate spec is immutable" in out.stderr

    # shrinking the pool below the template it hosts warns, naming the template
    out = cluster.apply(pool("workers", namespace, {"cpu": "4", "memory": "512Mi"}))
    assert "Warning:" in out.stderr and "ActorTemplate ok" in out.stderr
