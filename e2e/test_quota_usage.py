"""Quota changes against what KAI Queues hold now, through the real API server: Queue
status is written through the ``/status`` subresource (as KAI's queue controller does),
and the webhook's warnings carry the numbers (app/rules/quotas/usage.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

import harness
from harness import REPO_ROOT, Cluster, Webhook, free_port, install_crds, start_process, wait_until

KRM = "kai.resources/v1alpha1"
KAI = "scheduling.run.ai/v2"
ROOT = Path(__file__).resolve().parent.parent


def kai_queue(name: str, quota: float, limit: float, parent: str = "",
              owner: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {
        "gpu": {"quota": quota, "limit": limit, "overQuotaWeight": 1},
        "cpu": {"quota": 0, "limit": -1, "overQuotaWeight": 1},
        "memory": {"quota": 0, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": KAI, "kind": "Queue", "metadata": meta, "spec": spec}


def write_status(cluster: Cluster, name: str, status: dict[str, Any]) -> None:
    """As KAI's queue controller does: a merge patch of the status subresource."""
    cluster.kubectl("patch", "queues.scheduling.run.ai", name, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": status}))


def gpus(cards: str) -> dict[str, Any]:
    return {"allocated": {"nvidia.com/gpu": cards, "cpu": "2", "memory": "8Gi"},
            "requested": {"nvidia.com/gpu": cards, "cpu": "2", "memory": "8Gi"}}


def warned_eventually(cluster: Cluster, obj: dict[str, Any], text: str,
                      timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """A server-side dry run until its warnings hold ``text`` (the webhook's watch
    delivers other objects' status within a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.apply(obj, "--dry-run=server", check=False)
        if out.returncode == 0 and text in out.stderr:
            return out
        assert time.monotonic() < deadline, out.stdout + out.stderr
        time.sleep(0.5)


def test_a_queue_limit_cut_below_its_status_warns(cluster: Cluster, webhook: Webhook) -> None:
    name = harness.unique_name("qu", max_length=20)
    cluster.apply(kai_queue(name, 2, 8))
    stored = cluster.kubectl_json("get", "queues.scheduling.run.ai", name)
    assert "status" not in stored or not stored["status"].get("allocated")

    # no status yet: a cut is "not evaluated", never read as zero
    out = cluster.apply(kai_queue(name, 2, 6))
    assert "usage not evaluated: no status.allocated from KAI" in out.stderr, out.stderr

    write_status(cluster, name, gpus("6"))
    assert cluster.kubectl_json("get", "queues.scheduling.run.ai", name)["status"]["allocated"][
        "nvidia.com/gpu"] == "6"
    # the API server keeps status out of a spec write: the webhook reads it from the
    # stored object (oldObject), with no wait for its watch
    out = cluster.apply(kai_queue(name, 2, 4))
    assert out.returncode == 0
    assert (f"Warning: envelope[kai-usage-limit]: {name}: gpu limit 4 cards < 6 cards allocated; "
            f"nothing evicted, applies as jobs finish") in out.stderr, out.stderr
    stored = cluster.kubectl_json("get", "queues.scheduling.run.ai", name)
    assert stored["spec"]["resources"]["gpu"]["limit"] == 4  # warned, not refused
    assert stored["status"]["allocated"]["nvidia.com/gpu"] == "6"  # nothing evicted

    # the guarantee against allocatedNonPreemptible, 0.1 + 0.2 exactly 0.3
    write_status(cluster, name, {**gpus("6"), "allocatedNonPreemptible": {"nvidia.com/gpu": "300m"}})
    out = cluster.apply(kai_queue(name, 0.3, 4))
    assert "kai-usage-guarantee" not in out.stderr and "non-preemptible" not in out.stderr, out.stderr
    out = cluster.apply(kai_queue(name, 0.25, 4))
    assert "gpu quota 0.25 cards < 0.3 cards non-preemptible" in out.stderr, out.stderr


def test_dra_gpus_kai_keys_by_device_class_count(cluster: Cluster, webhook: Webhook) -> None:
    """Issue 37 class 4: KAI writes a DRA GPU claim's devices under the DeviceClass name
    (KAI-Scheduler pkg/common/resources/dra.go DRAGPUResourceListFromClaims); the stored
    status keeps that key and a cut below six such cards warns."""
    name = harness.unique_name("qd", max_length=20)
    cluster.apply(kai_queue(name, 2, 8))
    write_status(cluster, name, {"allocated": {"gpu.nvidia.com": "6", "cpu": "2"},
                                 "requested": {"gpu.nvidia.com": "6", "cpu": "2"}})
    stored = cluster.kubectl_json("get", "queues.scheduling.run.ai", name)
    assert stored["status"]["allocated"]["gpu.nvidia.com"] == "6"
    out = cluster.apply(kai_queue(name, 2, 4))
    assert out.returncode == 0
    assert (f"Warning: envelope[kai-usage-limit]: {name}: gpu limit 4 cards < 6 cards allocated; "
            f"nothing evicted, applies as jobs finish") in out.stderr, out.stderr


def test_a_parent_cut_below_what_its_children_hold(cluster: Cluster, webhook: Webhook) -> None:
    tag = harness.unique_name("qp", max_length=14)
    parent = f"{tag}-inf"
    cluster.apply(kai_queue(parent, 2, 10))
    for child, cards in ((f"{tag}-a", "0.1"), (f"{tag}-b", "0.2")):
        cluster.apply(kai_queue(child, 0, 4, parent))
        write_status(cluster, child, gpus(cards))
    # 0.1 + 0.2 cards fit a limit of 0.3: nothing from the children's rule
    out = cluster.apply(kai_queue(parent, 0, 0.3), "--dry-run=server")
    assert "kai-usage" not in out.stderr, out.stderr  # its children's statuses judged it
    out = warned_eventually(cluster, kai_queue(parent, 0, 0.25), "held by child queues")
    assert (f"envelope[kai-usage-children]: {parent}: gpu limit 0.25 cards < 0.3 cards held by "
            f"child queues; nothing evicted, applies as jobs finish") in out.stderr, out.stderr
    assert "usage not evaluated" not in out.stderr, out.stderr


def test_a_department_cut_below_its_krm_queue(cluster: Cluster, webhook: Webhook,
                                              tmp_path: Path) -> None:
    tag = harness.unique_name("qd", max_length=12)
    pool, dept = f"{tag}-h100", f"{tag}-vision"
    cluster.apply({"apiVersion": KRM, "kind": "NodePool", "metadata": {"name": pool},
                   "spec": {"labelKey": "envelope.test/kai-pool", "labelValue": tag}})

    def department(limit: float) -> dict[str, Any]:
        return {"apiVersion": KRM, "kind": "Department", "metadata": {"name": dept},
                "spec": {"queues": [{"name": f"{dept}-q", "nodepool": pool, "resources": {
                    "gpu": {"deserved": 0, "limit": limit, "overQuotaWeight": 1},
                    "cpu": {"deserved": 0, "limit": -1, "overQuotaWeight": 1},
                    "memory": {"deserved": 0, "limit": -1, "overQuotaWeight": 1}}}]}}

    deadline = time.monotonic() + 15
    while cluster.apply(department(8), check=False).returncode != 0:  # the pool reaches the watch
        assert time.monotonic() < deadline
        time.sleep(0.5)
    uid = cluster.kubectl_json("get", "departments.kai.resources", dept)["metadata"]["uid"]
    # the Queue KRM generates for the department's entry, with KAI's status
    owner = {"apiVersion": KRM, "kind": "Department", "name": dept, "uid": uid}
    cluster.apply(kai_queue(f"{dept}-q", 0, 8, owner=owner))
    write_status(cluster, f"{dept}-q", gpus("7.5"))
    out = warned_eventually(cluster, department(5), "7.5 cards allocated")
    assert (f"envelope[kai-usage-limit]: {dept}-q: gpu limit 5 cards < 7.5 cards allocated; nothing evicted, "
            f"applies as jobs finish") in out.stderr, out.stderr

    # envelope check --kubeconfig: the file over the cluster, judged on the cluster's usage
    manifest = tmp_path / "department.yaml"
    manifest.write_text(yaml.safe_dump(department(5)))
    done = subprocess.run([sys.executable, "-m", "app", "check", "-o", "json", str(manifest),
                           "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    report = json.loads(done.stdout)
    messages = [f["message"] for o in report["objects"] for f in o["findings"]
                if f["rule"] == "kai-usage-limit"]
    assert messages and "7.5 cards" in messages[0], done.stdout + done.stderr


def test_the_audit_exports_the_tree_with_what_it_holds(cluster: Cluster, webhook: Webhook,
                                                       tmp_path: Path) -> None:
    """`envelope audit --watch` (the chart's audit Deployment): the quota gauges follow a
    Queue status written through /status, with no spec change."""
    install_crds(cluster, REPO_ROOT / "charts" / "envelope" / "files" / "crds")
    tag = harness.unique_name("qm", max_length=12)
    pool, dept = f"{tag}-a100", f"{tag}-nlp"
    cluster.apply({"apiVersion": KRM, "kind": "NodePool", "metadata": {"name": pool},
                   "spec": {"labelKey": "envelope.test/kai-pool", "labelValue": tag}})
    department = {"apiVersion": KRM, "kind": "Department", "metadata": {"name": dept},
                  "spec": {"queues": [{"name": f"{dept}-q", "nodepool": pool, "resources": {
                      "gpu": {"deserved": 0, "limit": 6, "overQuotaWeight": 1}}}]}}
    deadline = time.monotonic() + 15
    while cluster.apply(department, check=False).returncode != 0:  # the pool reaches the watch
        assert time.monotonic() < deadline
        time.sleep(0.5)
    uid = cluster.kubectl_json("get", "departments.kai.resources", dept)["metadata"]["uid"]
    cluster.apply(kai_queue(f"{dept}-q", 0, 6, owner={
        "apiVersion": KRM, "kind": "Department", "name": dept, "uid": uid}))  # as KRM does
    write_status(cluster, f"{dept}-q", gpus("1.5"))

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    proc = start_process([sys.executable, "-m", "app", "audit", "--watch",
                          "--kubeconfig", str(cluster.kubeconfig), "--interval", "600",
                          "--debounce", "1", "--metrics-host", "127.0.0.1",
                          "--metrics-port", str(port)],
                         tmp_path / "audit.log", name="audit", env=env, cwd=REPO_ROOT)

    def metric() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    labels = f'department="{dept}",pool="{pool}",project="",resource="gpu"'
    try:
        wait_until("the allocated gauge", lambda: f"envelope_quota_allocated{{{labels}}} 1.5"
                   in metric(), proc, 60, interval=0.5)
        text = metric()
        assert f"envelope_quota_limit{{{labels}}} 6.0" in text
        assert f'envelope_quota_pool_capacity{{pool="{pool}",resource="gpu"}} 0.0' in text
        # KAI's next reconcile: only the status moves, and the gauge follows
        write_status(cluster, f"{dept}-q", gpus("4"))
        wait_until("the gauge to follow the status",
                   lambda: f"envelope_quota_allocated{{{labels}}} 4.0" in metric(), proc, 60,
                   interval=0.5)
    finally:
        proc.stop(timeout=10)
