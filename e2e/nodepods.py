"""Pods for the real node (e2e/harness/node.py): busybox pods bound to it, created through
the API server (and Envelope's webhook, in a namespace it judges), and their cgroups read
on the host. Shared by e2e/test_node_*.py and bench/node_premise.py."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import Cluster, HarnessError, warning_texts
from harness.node import BUSYBOX_IMAGE, Node

BUSY = "while :; do :; done"
"""One busy loop: a CPU-bound process that never sleeps."""


def busy_loops(n: int) -> str:
    """``n`` busy loops in parallel (the container's main process waits on them)."""
    return " ".join(["(" + BUSY + ") &"] * n) + " wait"


def box(name: str, script: str, *, requests: Mapping[str, str] | None = None,
        limits: Mapping[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A busybox container running ``sh -c script``."""
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    return {"name": name, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script], "resources": resources, **extra}


def pod(name: str, namespace: str, node: Node | None, *containers: dict[str, Any],
        **spec: Any) -> dict[str, Any]:
    """A Pod bound to ``node`` by ``spec.nodeName`` (no scheduler), host network (the node's
    CNI is loopback only), never restarted, killed at once on delete."""
    body: dict[str, Any] = {"hostNetwork": True, "restartPolicy": "Never",
                            "terminationGracePeriodSeconds": 0, "containers": list(containers), **spec}
    if node is not None:
        body["nodeName"] = node.name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": body}


_PATHS = {"Pod": "/api/v1/namespaces/{ns}/pods", "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments"}


def post(cluster: Cluster, manifest: Mapping[str, Any]) -> tuple[int, dict[str, Any], list[str]]:
    """POST a Pod or Deployment; the HTTP status, the body and the API server's warnings."""
    ns = manifest["metadata"]["namespace"]
    req = urllib.request.Request(cluster.api_url + _PATHS[manifest["kind"]].format(ns=ns),
                                 data=json.dumps(manifest).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, context=cluster.admin_ssl_context(), timeout=30) as resp:
            return resp.status, json.loads(resp.read()), warning_texts(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), warning_texts(err.headers)


def create(cluster: Cluster, manifest: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """POST the object; return what the API server stored and the warnings it answered."""
    status, body, warnings = post(cluster, manifest)
    if status != 201:
        raise AssertionError(f"creating {manifest['kind']} {manifest['metadata']['namespace']}/"
                             f"{manifest['metadata']['name']}: HTTP {status}: {body.get('message', body)}")
    return body, warnings


def get(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status, body = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    if status != 200:
        raise HarnessError(f"GET pod {namespace}/{name}: HTTP {status}: {body}")
    got: dict[str, Any] = body
    return got


def container_state(pod_obj: Mapping[str, Any], container: str) -> dict[str, Any]:
    for status in (pod_obj.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return dict(status)
    return {}


def wait_running(node: Node, namespace: str, name: str, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until every container of the Pod runs; return the Pod."""
    found: dict[str, Any] = {}

    def running() -> bool:
        found.update(get(node.cluster, namespace, name))
        statuses = (found.get("status") or {}).get("containerStatuses") or []
        return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)

    node.wait(f"pod {namespace}/{name} running", running, timeout)
    return found


def wait_for(node: Node, what: str, namespace: str, name: str, check: Any,
             timeout: float = 120.0) -> dict[str, Any]:
    """Wait until ``check(pod)`` holds; return the Pod."""
    found: dict[str, Any] = {}

    def ok() -> bool:
        found.clear()
        found.update(get(node.cluster, namespace, name))
        return bool(check(found))

    node.wait(what, ok, timeout)
    return found


def read(path: Path) -> str:
    return path.read_text().strip()


def read_int(path: Path) -> int:
    return int(read(path))


def cpu_stat(path: Path) -> dict[str, int]:
    """cgroup v1 ``cpu.stat``: nr_periods, nr_throttled, throttled_time."""
    return {k: int(v) for k, v in (line.split() for line in read(path / "cpu.stat").splitlines())}


def usage_over(paths: Sequence[Path], seconds: float) -> list[int]:
    """CPU time (ns, cpuacct.usage) each cgroup used over ``seconds`` of wall time."""
    before = [read_int(p / "cpuacct.usage") for p in paths]
    time.sleep(seconds)
    return [read_int(p / "cpuacct.usage") - b for p, b in zip(paths, before, strict=True)]


def delete(cluster: Cluster, namespace: str, name: str) -> None:
    cluster.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0")
