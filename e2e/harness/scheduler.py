"""kube-scheduler with one profile, ``envelope-oracle``, binding Pods that name it to
the Node objects the tests create (no kubelet, as KWOK)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import ISOLATED_NAMESPACE_LABEL, HarnessError, unique_name
from .cluster import Cluster, wait_until
from .ports import free_port
from .processes import Component, start_process

SCHEDULER_NAME = "envelope-oracle"
"""The only profile of the harness's kube-scheduler: it schedules the Pods whose
``spec.schedulerName`` is this, and leaves every other test's Pods alone."""


@dataclass
class Scheduler(Component):
    """kube-scheduler running against the harness API server (profile SCHEDULER_NAME)."""

    scheduler_name: str = SCHEDULER_NAME


def pod_schedule_outcome(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """``("bound", node)`` once a Pod has a node, ``("unschedulable", message)``
    once kube-scheduler has marked it PodScheduled=False/Unschedulable, else None."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return ("bound", str(node))
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return ("unschedulable", str(cond.get("message", "")))
    return None


def start_scheduler(cluster: Cluster, workdir: Path, *, timeout: float = 60.0,
                    default_profile: bool = False) -> Scheduler:
    """Start kube-scheduler with a kubeconfig for the harness API server and wait
    until it has bound a probe Pod to a probe Node (both deleted again), so the
    caller knows its informers run and it binds.

    One profile, ``schedulerName: envelope-oracle``; no leader election; a high
    client QPS so hundreds of scenarios are not throttled. ``default_profile``: also
    ``default-scheduler`` (Pods that name no scheduler), on a control plane of its own
    (the node's, e2e/conftest.py ``node_env``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = workdir / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        "clientConnection:\n"
        f"  kubeconfig: {cluster.kubeconfig}\n"
        "  qps: 500\n"
        "  burst: 1000\n"
        "leaderElection:\n"
        "  leaderElect: false\n"
        "profiles:\n"
        f"- schedulerName: {SCHEDULER_NAME}\n"
        + ("- schedulerName: default-scheduler\n" if default_profile else "")
    )
    cmd: list[str | Path] = [
        cluster.bin_dir / "kube-scheduler",
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'scheduler-certs'}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "-v=1",
    ]
    proc = start_process(cmd, workdir / "kube-scheduler.log", name="kube-scheduler")
    probe_ns = "envelope-e2e-scheduler-probe"
    node_name = unique_name("scheduler-probe-node")
    pod_name = "probe"
    try:
        status, _ = cluster.api("GET", f"/api/v1/namespaces/{probe_ns}")
        if status == 404:
            cluster.create_namespace(probe_ns, labels={ISOLATED_NAMESPACE_LABEL: "true"})
        cluster.create_node(node_name, {"cpu": "1", "memory": "1Gi", "pods": "10"},
                            labels={"envelope.test/scheduler-probe": node_name})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": probe_ns},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "nodeSelector": {"envelope.test/scheduler-probe": node_name},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        cluster.force_delete_pod(probe_ns, pod_name)
        status, body = cluster.api("POST", f"/api/v1/namespaces/{probe_ns}/pods", pod)
        if status != 201:
            raise HarnessError(f"creating the scheduler probe pod: HTTP {status}: {body}")

        def bound() -> bool:
            _, got = cluster.api("GET", f"/api/v1/namespaces/{probe_ns}/pods/{pod_name}")
            return pod_schedule_outcome(got or {}) == ("bound", node_name)

        wait_until("kube-scheduler to bind a probe pod", bound, proc, timeout)
        cluster.force_delete_pod(probe_ns, pod_name)
        cluster.delete_node(node_name)
    except BaseException:
        proc.stop(timeout=5)
        raise
    return Scheduler(process=proc, scheduler_name=SCHEDULER_NAME, port=port)


