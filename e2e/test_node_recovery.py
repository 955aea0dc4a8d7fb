"""Node states kube-scheduler waits out are not refusals (issue 36 item 4), on the real
node: its kubelet stopped, the node lifecycle controller marks the Node NotReady (Ready
Unknown) and taints it ``node.kubernetes.io/unreachable:NoSchedule``; a Deployment written
then is admitted by Envelope (a warning naming the state), stays Pending while the node is
down, and runs once the kubelet is back. A Deployment no node could take even recovered is
still refused. The rule: app/k8s/scheduling.py ``LIFECYCLE_TAINT_KEYS``."""

from __future__ import annotations

from typing import Any

import nodepods as p
import pytest
from conftest import NodeEnv

pytestmark = pytest.mark.e2e


def _deployment(name: str, ns: str, cpu: str, replicas: int = 2) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "16Mi"}
    template = p.pod(name, ns, None, p.box("app", "while :; do sleep 1; done", requests=res, limits=res),
                     restartPolicy="Always")  # default-scheduler: pod-fits-node judges its filters
    template["metadata"] = {"labels": {"app": name}}
    del template["apiVersion"], template["kind"]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}}


def _pods(env: NodeEnv, ns: str, app: str) -> list[dict[str, Any]]:
    status, body = env.cluster.api("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")
    assert status == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items


def test_a_deployment_written_while_every_node_is_not_ready_is_admitted_and_runs_once_it_recovers(
        node_env: NodeEnv) -> None:
    env, node = node_env, node_env.node
    ns = env.namespace("recovery")
    node.stop_kubelet()
    try:
        def unreachable() -> bool:
            taints = {(t["key"], t["effect"]) for t in node.node_object()["spec"].get("taints") or []}
            return node.ready() == "Unknown" and ("node.kubernetes.io/unreachable", "NoSchedule") in taints

        node.wait("the node lifecycle controller to mark the node unreachable", unreachable, 90)

        status, body, warnings = p.post(env.cluster, _deployment("web", ns, "100m"))
        assert status == 201, body
        assert "envelope[pod-fits-node]: the pods wait, Pending, for 1 node(s) to recover from unreachable" \
            in warnings, warnings
        # What no node takes even recovered (the node has os.cpu_count() cores) is refused.
        status, body, _ = p.post(env.cluster, _deployment("huge", ns, "512"))
        assert status == 403 and "pod-fits-node" in body.get("message", ""), body

        def pending() -> bool:
            pods = _pods(env, ns, "web")
            return len(pods) == 2 and all(not x["spec"].get("nodeName") for x in pods)

        node.wait("the Deployment's pods created and Pending", pending, 60)
    finally:
        node.start_kubelet()

    def running() -> bool:
        pods = _pods(env, ns, "web")
        return len(pods) == 2 and all(x.get("status", {}).get("phase") == "Running"
                                      and x["spec"].get("nodeName") == node.name for x in pods)

    node.wait("the pods scheduled to the recovered node and running", running, 120)
    env.cluster.api("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/web")
    for x in _pods(env, ns, "web"):
        p.delete(env.cluster, ns, x["metadata"]["name"])
