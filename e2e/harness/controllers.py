"""kube-controller-manager against the harness API server: the controllers that act on
what Envelope writes (Deployments make ReplicaSets make Pods, Jobs, DaemonSets,
StatefulSets, CronJobs, the garbage collector, quota status, ResourceClaims from
templates), with no kubelet.

Without kubelets every Node's Lease goes stale, so the node lifecycle controller (and the
taint-eviction controller it feeds) would taint the test's Node objects
``node.kubernetes.io/unreachable:NoExecute`` and evict Pods: they are not started. The
service-account token controller needs a signing key the API server's ServiceAccount
admission plugin would use, and that plugin is off in the harness: not started either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import HarnessError
from .cluster import Cluster, wait_until
from .ports import free_port
from .processes import Component, start_process

#: What the convergence oracles need (names as cmd/kube-controller-manager/names at
#: v1.35-v1.37). Never the node lifecycle, taint-eviction or service-account-token ones.
CONVERGENCE_CONTROLLERS: tuple[str, ...] = (
    "deployment-controller",
    "replicaset-controller",
    "replicationcontroller-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "garbage-collector-controller",
    "resourcequota-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "resourceclaim-controller",
)
NEVER = ("node-lifecycle-controller", "taint-eviction-controller", "serviceaccount-token-controller")


@dataclass
class ControllerManager(Component):
    """kube-controller-manager running against a harness API server."""

    controllers: tuple[str, ...] = ()


def start_controller_manager(cluster: Cluster, workdir: Path,
                             controllers: Sequence[str] = CONVERGENCE_CONTROLLERS,
                             *, timeout: float = 90.0, kubelets: bool = False) -> ControllerManager:
    """Start kube-controller-manager (the API server's own Kubernetes version) running
    ``controllers`` only, with the admin kubeconfig, no leader election and a high client
    QPS; return once it answers /healthz and its ResourceQuota controller has filled in the
    status of a probe quota (so its informers have synced and it writes).

    ``kubelets``: the cluster's Nodes have real kubelets (e2e/harness/node.py), so the node
    lifecycle controller may run; it notices a stopped kubelet within 12 s (its Lease is
    renewed every 2.5 s there, harness.node.NODE_LEASE_SECONDS) instead of the default 50."""
    bad = sorted(set(controllers) & set(NEVER) - ({"node-lifecycle-controller"} if kubelets else set()))
    if bad:
        raise HarnessError(f"{', '.join(bad)} cannot run without kubelets (see e2e/harness/controllers.py)")
    binary = cluster.bin_dir / "kube-controller-manager"
    if not binary.exists():
        raise HarnessError(f"{binary} is missing: run e2e/controlplane/build.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd: list[str | Path] = [
        binary,
        f"--kubeconfig={cluster.kubeconfig}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'kcm-certs'}",
        "--leader-elect=false",
        "--use-service-account-credentials=false",
        f"--controllers={','.join(controllers)}",
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
        # Quota status within a second of a change, not the default 5 minutes' resync.
        "--resource-quota-sync-period=10s",
        "--concurrent-deployment-syncs=10",
        "--concurrent-replicaset-syncs=10",
        "-v=1",
    ]
    if kubelets:
        cmd += ["--node-monitor-period=1s", "--node-monitor-grace-period=12s",
                "--node-startup-grace-period=30s"]
    proc = start_process(cmd, workdir / "kube-controller-manager.log", name="kube-controller-manager")
    probe_ns = "envelope-e2e-kcm-probe"
    try:
        status, _ = cluster.api("GET", f"/api/v1/namespaces/{probe_ns}")
        if status == 404:
            cluster.create_namespace(probe_ns)
        quota = {"apiVersion": "v1", "kind": "ResourceQuota",
                 "metadata": {"name": "probe", "namespace": probe_ns},
                 "spec": {"hard": {"pods": "1000"}}}
        status, body = cluster.api("POST", f"/api/v1/namespaces/{probe_ns}/resourcequotas", quota)
        if status not in (201, 409):
            raise HarnessError(f"creating the controller-manager probe quota: HTTP {status}: {body}")

        def synced() -> bool:
            _, got = cluster.api("GET", f"/api/v1/namespaces/{probe_ns}/resourcequotas/probe")
            return bool(((got or {}).get("status") or {}).get("hard"))

        wait_until("kube-controller-manager to fill in a probe quota's status", synced, proc, timeout)
    except BaseException:
        proc.stop(timeout=5)
        raise
    return ControllerManager(process=proc, controllers=tuple(controllers), port=port)
