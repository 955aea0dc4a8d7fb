"""UPDATEs of objects that predate Envelope, and children a controller compares with
their parent (issue 28, classes 2 and 1), on the real API server.

The objects are created in a namespace out of the webhook's path (as before Envelope
was installed, or while it was unreachable: the mutating webhook fails open); the
namespace then enters the path and the everyday writes follow. Without the fix,
``kubectl label job/...`` and a Kueue-style resume fail with "field is immutable" (the
webhook stripped the CPU limit from the Job's template on the UPDATE), and a label of a
Deployment rewrote its template (a rollout nobody asked for).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from oracle import isolated_namespace, status_message

import harness
from harness import Cluster, Webhook

MERGE = "application/merge-patch+json"
GPU_NODE = "e2e-predating-gpu"
LIMITED = {"requests": {"cpu": "500m", "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "64Mi"}}
ENV = [{"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=64Mi"}]


def _template(labels: dict[str, str], restart: str = "Always") -> dict[str, Any]:
    return {"metadata": {"labels": labels},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                     "resources": copy.deepcopy(LIMITED), "env": list(ENV)}]}}


def _job(name: str, suspend: bool) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"suspend": suspend, "template": _template({}, "Never")}}


def _deployment(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": _template({"app": name})}}


def _replicaset(name: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    rs: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
                          "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                                   "template": _template({"app": name})}}
    if owner is not None:
        rs["metadata"]["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    return rs


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return result


def _enter_webhook_path(cluster: Cluster, namespace: str) -> None:
    status, body = cluster.api("PATCH", f"/api/v1/namespaces/{namespace}",
                               {"metadata": {"labels": {harness.ISOLATED_NAMESPACE_LABEL: None}}},
                               content_type=MERGE)
    assert status == 200, body
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                      "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]}}
    deadline = time.monotonic() + 30
    while True:
        status, body = cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
        if status == 201 and "cpu" not in body["spec"]["containers"][0]["resources"]["limits"]:
            return
        assert time.monotonic() < deadline, f"the webhook never saw {namespace}: {status} {body}"
        time.sleep(0.5)


def test_everyday_updates_of_objects_created_before_envelope(cluster: Cluster, webhook: Webhook) -> None:
    ns = isolated_namespace(cluster, "e2e-predating")
    created: dict[str, dict[str, Any]] = {}
    for plural, obj in (("jobs", _job("running", False)), ("jobs", _job("queued", True)),
                        ("jobs", _job("resized", True)), ("deployments", _deployment("web"))):
        group = "batch" if plural == "jobs" else "apps"
        status, body = cluster.api("POST", f"/apis/{group}/v1/namespaces/{ns}/{plural}", obj)
        assert status == 201, body
        assert "cpu" in _container(body)["resources"]["limits"]  # stored as written
        created[body["metadata"]["name"]] = body
    _enter_webhook_path(cluster, ns)
    jobs, deployments = f"/apis/batch/v1/namespaces/{ns}/jobs", f"/apis/apps/v1/namespaces/{ns}/deployments"

    # kubectl label job/running: refused with "field is immutable" before the fix
    cluster.kubectl("label", "-n", ns, "job/running", "team=a")
    # a Kueue-style admission: one UPDATE resumes the Job and writes its node selector
    # (a node of that flavour exists: pod-fits-node judges the new placement)
    cluster.create_node(GPU_NODE, {"cpu": "8", "memory": "32Gi", "pods": "110"}, labels={"pool": "gpu"})
    try:
        status, body = cluster.api("PATCH", f"{jobs}/queued", {"spec": {
            "suspend": False, "template": {"spec": {"nodeSelector": {"pool": "gpu"}}}}},
            content_type=MERGE)
    finally:
        cluster.delete_node(GPU_NODE)
    assert status == 200, status_message(body)
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert "cpu" in _container(body)["resources"]["limits"]  # no patch: left as stored
    # a suspended Job that never started may change its container resources (1.36+,
    # MutablePodResourcesForSuspendedJobs): Envelope strips the CPU limit there, and only
    # there (env is immutable). On 1.35 the gate is off and the API server refuses it.
    status, version = cluster.api("GET", "/version")
    assert status == 200, version
    status, body = cluster.api("PATCH", f"{jobs}/resized", {"spec": {"template": {"spec": {
        "containers": [{"name": "app", "resources": {"limits": {"cpu": "3"}}}]}}}},
        content_type="application/strategic-merge-patch+json")
    if int(version["minor"].rstrip("+")) < 36:
        assert status == 422 and "field is immutable" in status_message(body), body
    else:
        assert status == 200, status_message(body)
        assert "cpu" not in _container(body)["resources"]["limits"]
        assert _container(body)["env"] == ENV

    # label, annotate, scale and rollout restart of the Deployment: no template change
    cluster.kubectl("label", "-n", ns, "deployment/web", "team=a")
    cluster.kubectl("annotate", "-n", ns, "deployment/web", "note=hello")
    status, body = cluster.api("PATCH", f"{deployments}/web", {"spec": {"replicas": 3}}, content_type=MERGE)
    assert status == 200, status_message(body)
    assert body["spec"]["template"] == created["web"]["spec"]["template"]
    cluster.kubectl("rollout", "restart", "-n", ns, "deployment/web")
    status, body = cluster.api("GET", f"{deployments}/web")
    assert "cpu" in _container(body)["resources"]["limits"]
    assert _container(body)["env"] == ENV


def test_a_replicaset_of_a_deployment_is_stored_as_its_controller_wrote_it(
        cluster: Cluster, webhook: Webhook) -> None:
    """The Deployment controller creates its ReplicaSet with the Deployment's template and
    finds it again by comparing templates: stripped, it would never match (a loop)."""
    ns = isolated_namespace(cluster, "e2e-owned")
    status, deployment = cluster.api("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", _deployment("web"))
    assert status == 201, deployment
    _enter_webhook_path(cluster, ns)
    replicasets = f"/apis/apps/v1/namespaces/{ns}/replicasets"
    status, owned = cluster.api("POST", replicasets, _replicaset("web", deployment))
    assert status == 201, status_message(owned)
    assert _container(owned) == _container(deployment)
    status, alone = cluster.api("POST", replicasets, _replicaset("alone", None))
    assert status == 201, status_message(alone)
    assert "cpu" not in _container(alone)["resources"]["limits"]
