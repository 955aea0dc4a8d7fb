"""ReplicationControllers reach both workload webhooks through the real API server
(issue 21: the rules judged them in `check` and `audit`, but the chart's webhook rules,
written by hand, never sent them; they are now generated from app/k8s/kinds.py and the
rules)."""

from __future__ import annotations

from typing import Any

from builders import SEED, container, pod_template
from harness import Cluster, CommandError, Webhook


def replication_controller(name: str, ns: str, *containers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ReplicationController",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "selector": {"app": name},
                     "template": pod_template(*containers, labels={"app": name})}}


def test_a_replicationcontroller_is_mutated_and_validated(cluster: Cluster, webhook: Webhook,
                                                           namespace: str) -> None:
    cluster.apply(replication_controller("web", namespace, container(**SEED)))
    stored = cluster.kubectl_json("get", "replicationcontroller", "web", "-n", namespace)
    resources = stored["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert "cpu" not in resources["limits"], resources  # cpu-limits (mutating webhook)
    assert resources["requests"]["cpu"] == "7" and resources["limits"]["memory"] == "29Gi"

    unequal = container(requests={"memory": "1Gi"}, limits={"memory": "2Gi"})
    try:
        cluster.apply(replication_controller("unequal", namespace, unequal))
    except CommandError as exc:
        assert "memory-request-equals-limit" in str(exc), exc  # the validating webhook
    else:
        raise AssertionError("a ReplicationController with memory request 1Gi != limit 2Gi "
                             "was admitted: the validating webhook never saw it")
