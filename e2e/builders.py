"""Workload objects and waiting, shared by the e2e scenarios."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from harness import Cluster


def container(
    name: str = "app",
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": resources, **extra}


def pod_template(*containers: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"labels": labels or {"app": "web"}}, "spec": {"containers": list(containers)}}


def deployment(name: str, ns: str, *containers: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(*containers, labels={"app": name}),
        },
    }


SEED = {"limits": {"cpu": "7", "memory": "29Gi"}}


def rss_mib(pid: int) -> float:
    """A process's resident memory now (the memory-bound tests, issue 38)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def eventually(check: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


# --- KAI quota trees (e2e/test_quotas.py, e2e/test_quotaview.py) ------------------------

KAI = "kai.resources/v1alpha1"


def resources(gpu: tuple[float, float]) -> dict[str, Any]:
    return {"gpu": {"deserved": gpu[0], "limit": gpu[1], "overQuotaWeight": 1},
            "cpu": {"deserved": 0, "limit": -1, "overQuotaWeight": 1},
            "memory": {"deserved": 0, "limit": -1, "overQuotaWeight": 1}}


def nodepool(name: str, label: str) -> dict[str, Any]:
    return {"apiVersion": KAI, "kind": "NodePool", "metadata": {"name": name},
            "spec": {"labelKey": "envelope.test/kai-pool", "labelValue": label}}


def department(name: str, pool: str, gpu: float) -> dict[str, Any]:
    return {"apiVersion": KAI, "kind": "Department", "metadata": {"name": name},
            "spec": {"queues": [{"name": f"{name}-{pool}", "nodepool": pool,
                                 "resources": resources((gpu, -1))}]}}


def project(name: str, parent: str, pool: str, gpu: float) -> dict[str, Any]:
    return {"apiVersion": KAI, "kind": "Project", "metadata": {"name": name},
            "spec": {"parent": parent, "defaultNodePools": [pool],
                     "queues": [{"name": f"{name}-{pool}", "nodepool": pool,
                                 "resources": resources((gpu, gpu * 2))}]}}


def gpu_node(cluster: Cluster, name: str, label: str, cards: int) -> None:
    cluster.kubectl("create", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": name, "labels": {"envelope.test/kai-pool": label}}}))
    status = {"status": {"capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(cards)},
                         "allocatable": {"cpu": "64", "memory": "512Gi",
                                         "nvidia.com/gpu": str(cards)}}}
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge",
                    "-p", json.dumps(status))
