"""The opt-out and exemption annotations on a workload's own metadata reach the Pods its
controller creates (issue 35, point 2; rule ``template-opt-outs``), for every workload
kind, on the real kube-controller-manager with Envelope's webhooks in the path.

Each workload carries ``envelope.io/keep-cpu-limit: "true"`` and ``envelope.io/exempt:
memory-request-equals-limit`` on its own metadata only (its pod template has labels and no
annotations) and a container with a CPU limit and a memory request below its limit. A
controller gives its Pods only the template's metadata (e2e/test_oracle_podconstruction.py
proves that on the same controllers), so without the copy the Pod webhook strips the CPU
limit and refuses every Pod (FailedCreate). Here every Pod must exist, carry both
annotations and keep the CPU limit and the memory request as written. A control workload
of each kind without the annotations, in the same namespace, shows the webhook acts on
these Pods: its Pods lose the CPU limit.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import Converging
from oracle import isolated_namespace, parallel, status_message

import harness

pytestmark = pytest.mark.e2e

OPT_OUT = {"envelope.io/keep-cpu-limit": "true",
           "envelope.io/exempt": "memory-request-equals-limit"}
PATHS = {"Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
         "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
         "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
         "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
         "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
         "CronJob": "/apis/batch/v1/namespaces/{ns}/cronjobs",
         "ReplicationController": "/api/v1/namespaces/{ns}/replicationcontrollers"}
API = {"ReplicationController": "v1", "Job": "batch/v1", "CronJob": "batch/v1"}


def workload(kind: str, name: str, opted_out: bool) -> dict[str, Any]:
    memory = {"requests": {"cpu": "100m", "memory": "128Mi"},
              "limits": {"cpu": "1", "memory": "256Mi"}} if opted_out else \
        {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
    spec: dict[str, Any] = {"schedulerName": harness.SCHEDULER_NAME,
                            "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                            "resources": memory}]}
    if kind in ("Job", "CronJob"):
        spec["restartPolicy"] = "Never"
    labels = {"app": name}
    template = {"metadata": {"labels": dict(labels)}, "spec": spec}
    obj: dict[str, Any] = {"apiVersion": API.get(kind, "apps/v1"), "kind": kind,
                           "metadata": {"name": name,
                                        **({"annotations": dict(OPT_OUT)} if opted_out else {})}}
    if kind == "CronJob":
        obj["spec"] = {"schedule": "* * * * *", "concurrencyPolicy": "Forbid",
                       "jobTemplate": {"spec": {"backoffLimit": 0, "template": template}}}
    elif kind == "Job":
        obj["spec"] = {"backoffLimit": 0, "template": template}
    elif kind == "ReplicationController":
        obj["spec"] = {"replicas": 1, "selector": dict(labels), "template": template}
    else:
        obj["spec"] = {"selector": {"matchLabels": dict(labels)}, "template": template}
        if kind != "DaemonSet":
            obj["spec"]["replicas"] = 1
        if kind == "StatefulSet":
            obj["spec"]["serviceName"] = name
    return obj


def _pods(converging: Converging, ns: str, name: str) -> list[dict[str, Any]]:
    status, body = converging.cluster.api("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{name}")
    assert status == 200, body
    return list(body["items"])


def test_workload_opt_outs_reach_the_pods_of_every_kind(converging: Converging) -> None:
    cluster = converging.cluster
    ns = isolated_namespace(cluster, "e2e-optout-reach", webhook=True)
    cases = [(kind, f"{kind.lower()}-{'opt' if opted else 'ctl'}", opted)
             for kind in PATHS for opted in (True, False)]

    def create(case: tuple[str, str, bool]) -> str | None:
        kind, name, opted = case
        status, body = cluster.api("POST", PATHS[kind].format(ns=ns), workload(kind, name, opted))
        return None if status == 201 else f"{kind} {name}: HTTP {status}: {status_message(body)}"

    refused = [r for r in parallel(create, cases) if r]
    assert not refused, refused
    # the stored workloads carry the annotations in their pod templates
    for kind, name, opted in cases:
        status, stored = cluster.api("GET", PATHS[kind].format(ns=ns) + f"/{name}")
        assert status == 200, stored
        template = stored["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" \
            else stored["spec"]["template"]
        annotations = template["metadata"].get("annotations") or {}
        assert annotations == (OPT_OUT if opted else {}), (kind, annotations)
        if kind == "CronJob":  # and its Jobs' own metadata (the Job is judged too)
            job_meta = stored["spec"]["jobTemplate"].get("metadata") or {}
            assert (job_meta.get("annotations") or {}) == (OPT_OUT if opted else {}), job_meta
    # every controller (the CronJob's within a minute: its schedule) makes its Pods
    found: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        found = {name: _pods(converging, ns, name) for _, name, _ in cases}
        if all(found.values()):
            break
        time.sleep(2)
    missing = [name for name, pods in found.items() if not pods]
    assert not missing, f"no Pods for {missing}; events: " + cluster.kubectl(
        "get", "events", "-n", ns, "-o", "custom-columns=OBJ:.involvedObject.name,MSG:.message",
        check=False).stdout[-3000:]
    for kind, name, opted in cases:
        for pod in found[name]:
            resources = pod["spec"]["containers"][0]["resources"]
            annotations = pod["metadata"].get("annotations") or {}
            if opted:
                assert {k: annotations.get(k) for k in OPT_OUT} == OPT_OUT, (kind, annotations)
                assert resources["limits"].get("cpu") == "1", (kind, resources)
                assert resources["requests"]["memory"] == "128Mi", (kind, resources)
            else:  # the control: the Pod webhook strips the limit from these Pods
                assert "cpu" not in resources["limits"], (kind, resources)
    # the Deployment controller took the mutated template as its own: one ReplicaSet each
    # (kubernetes-facts.md: a ReplicaSet whose template a webhook changed is never the new one)
    for name in ("deployment-opt", "deployment-ctl"):
        status, sets = cluster.api("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets"
                                          f"?labelSelector=app%3D{name}")
        names = [s["metadata"]["name"] for s in sets["items"]]
        assert status == 200 and len(names) == 1, (name, names)
    print(f"{len(PATHS)} kinds: {sum(len(found[n]) for _, n, o in cases if o)} opted-out Pods kept "
          f"their CPU limit and exemption; {sum(len(found[n]) for _, n, o in cases if not o)} control "
          f"Pods lost it")
