"""Objects nested deeper than orjson reads, stored by a real kube-apiserver, in the
live view.

A custom resource with ``x-kubernetes-preserve-unknown-fields`` may nest up to the
API server's own limit (10,000 levels; 11,000 is refused): a tenant who may create
WorkerPools stored one 1,100 levels deep, and every LIST of WorkerPools then failed
to decode in Envelope (orjson reads 1,024). The informer re-listed for ever, the view
went stale, readiness failed on every replica and every rule that reads WorkerPools
answered per the failure mode. Now ``app.cluster.kube.loads`` reads such a document
by a loop.
"""

from __future__ import annotations

import time

import harness
from app.cluster.kube import KubeClient, kube_configuration
from app.cluster.live import RESOURCES, LiveView
from app.core.config import Policy
from app.core.engine import check_object
from app.core.ruleset import default_ruleset
from app.rules.base import Subject
from harness import Cluster, Webhook

WORKERPOOLS = "/apis/ate.dev/v1alpha1/namespaces/{}/workerpools"


def _pool(name: str, namespace: str, depth: int = 0) -> bytes:
    extra = ',"extra":' + '{"a":' * depth + '"x"' + "}" * depth if depth else ""
    return (f'{{"apiVersion":"ate.dev/v1alpha1","kind":"WorkerPool","metadata":{{"name":"{name}",'
            f'"namespace":"{namespace}","labels":{{"workload":"agent"}}}},"spec":{{"replicas":1,'
            f'"ateomImage":"registry.example/ateom@sha256:00","sandboxClass":"microvm",'
            f'"template":{{"resources":{{"limits":{{"cpu":"2","memory":"1Gi"}}}}}}{extra}}}}}'
            ).encode()


def _create(cluster: Cluster, namespace: str, body: bytes) -> None:
    """POST as admin; the API server's answer echoes the object, too deep for the
    harness's json.loads, so only the status is read."""
    client = KubeClient(kube_configuration(str(cluster.kubeconfig)))
    response = client.pool.request("POST", client.host + WORKERPOOLS.format(namespace), body=body,
                                   headers={**client._headers(), "Content-Type": "application/json"})
    assert response.status == 201, response.data[:300]


def _depth(value: object) -> int:
    n = 0
    while isinstance(value, dict) and "a" in value:
        value, n = value["a"], n + 1
    return n


def _isolated(cluster: Cluster) -> str:
    """A namespace the session's webhook leaves alone: this test is about the view, and
    Envelope refuses (or, per failureMode, allows) such a write, see the test below."""
    name = harness.unique_name("e2e-deep-objects", max_length=50)
    cluster.create_namespace(name, labels={harness.ISOLATED_NAMESPACE_LABEL: "true"})
    return name


def test_a_workerpool_deeper_than_orjson_reads_does_not_stall_the_view(cluster: Cluster) -> None:
    namespace = _isolated(cluster)
    for name, depth in (("vm", 0), ("deep", 1100)):
        _create(cluster, namespace, _pool(name, namespace, depth))
    view = LiveView(kube_configuration(str(cluster.kubeconfig)),
                    tuple(r for r in RESOURCES if r.kind == "WorkerPool"), staleness=20)
    view.start()
    try:
        deadline = time.monotonic() + 60
        while view.problems() or len(view.list("WorkerPool", namespace)) < 2:
            assert time.monotonic() < deadline, f"not synced: {view.problems()}"
            time.sleep(0.2)
        deep = view.get("WorkerPool", "deep", namespace)
        assert deep is not None and _depth(deep["spec"]["extra"]) == 1100
        # And through the watch: a second one, deeper still, arrives as an event.
        _create(cluster, namespace, _pool("deeper", namespace, 5000))
        while view.get("WorkerPool", "deeper", namespace) is None:
            assert time.monotonic() < deadline + 30, f"watch event not applied: {view.problems()}"
            time.sleep(0.2)
        assert view.problems() == []
        # The rules that read the pools still judge an ActorTemplate placed on them.
        template = {"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
                    "metadata": {"name": "agent", "namespace": namespace},
                    "spec": {"sandboxClass": "microvm", "snapshotsConfig": {"location": "gs://s"},
                             "containers": [{"name": "main", "image": "registry.example/a@sha256:00"}],
                             "resources": {"limits": {"cpu": "1", "memory": "512Mi"}},
                             "workerSelector": {"matchLabels": {"workload": "agent"}}}}
        subject = Subject("ate.dev", "v1alpha1", "ActorTemplate", "CREATE", namespace, "agent", template)
        result = check_object(default_ruleset(), subject, view, Policy())
        assert result.internal_errors == []
        assert not result.errors, [f.message for f in result.errors]
    finally:
        for informer in view.informers:
            informer.stop()


def test_with_envelope_in_the_path_a_too_deep_write_is_refused_saying_why(
        cluster: Cluster, namespace: str, webhook: Webhook) -> None:
    """The API server sends the review of a WorkerPool 1,100 levels deep; Envelope cannot
    decode past 1,024, answers with the review's uid, and (failureMode deny) refuses it
    with a message the user can act on — not "rejected our request for an unknown reason"."""
    client = KubeClient(kube_configuration(str(cluster.kubeconfig)))
    response = client.pool.request("POST", client.host + WORKERPOOLS.format(namespace),
                                   body=_pool("deep", namespace, 1100),
                                   headers={**client._headers(), "Content-Type": "application/json"})
    text = response.data.decode(errors="replace")
    assert response.status == 400, text[:500]
    assert "nests deeper than 1,024 levels" in text and "unknown reason" not in text, text[:500]
