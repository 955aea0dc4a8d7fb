"""`envelope check --kubeconfig`: manifests from files, their context from the API server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cluster.kube import kube_configuration
from app.cluster.live import LiveView, resources_for
from app.core.config import Policy
from app.core.engine import check_object
from app.core.frontdoor import subject_of
from app.core.ruleset import default_ruleset
from builders import container, deployment
from harness import Cluster

ROOT = Path(__file__).resolve().parent.parent
NODE = "e2e-check-kubeconfig"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", "check", "-o", "json", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.e2e
def test_nodes_and_quotas_come_from_the_cluster(cluster: Cluster, namespace: str,
                                                     tmp_path: Path) -> None:
    created = cluster.kubectl("get", "node", NODE, check=False).returncode != 0
    if created:
        # Ready and without the not-ready taint: a node pods may land on
        cluster.create_node(NODE, {"cpu": "4", "memory": "8Gi", "pods": "110"})
    try:
        _judge_against_the_cluster(cluster, namespace, tmp_path)
    finally:
        if created:  # the cluster is shared: a small Node left behind would refuse the
            cluster.delete_node(NODE)  # bigger pods of every later test


def _judge_against_the_cluster(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu-limits"},
         "spec": {"hard": {"limits.cpu": "100"}}}))
    # far more memory than any node a test creates
    huge = deployment("huge", namespace, container(requests={"memory": "900Ti"},
                                                   limits={"cpu": "1", "memory": "900Ti"}))
    manifest = tmp_path / "huge.yaml"
    manifest.write_text(yaml.safe_dump(huge))

    offline = check(str(manifest))
    report = json.loads(offline.stdout)
    assert offline.returncode == 0, offline.stderr
    assert {"pod-fits-node", "quota-needs-cpu-limits"} <= {
        n["rule"] for n in report["notEvaluated"]}

    live = check(str(manifest), "--kubeconfig", str(cluster.kubeconfig))
    report = json.loads(live.stdout)
    assert live.returncode == 1, live.stderr
    findings = {f["rule"]: f for f in report["objects"][0]["findings"]}
    assert "needs 900Ti memory" in findings["pod-fits-node"]["message"]
    assert findings["pod-fits-node"]["line"] > 1
    assert "quota-needs-cpu-limits" in findings  # the cluster's quota needs the CPU limit
    assert not {"pod-fits-node", "quota-needs-cpu-limits"} & {
        n["rule"] for n in report["notEvaluated"]}




@pytest.mark.e2e
def test_an_unreachable_cluster_is_a_clean_exit_2(tmp_path: Path) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    missing = check(str(manifest), "--kubeconfig", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "cannot use --kubeconfig" in missing.stderr
    assert "Traceback" not in missing.stderr
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "x"}}]}))
    down = check(str(manifest), "--kubeconfig", str(config))
    assert down.returncode == 2 and "cannot list Node (/api/v1/nodes)" in down.stderr
    assert "Traceback" not in down.stderr


# --- check lists what the webhook watches (issue 21: the kinds come from app/k8s/kinds.py and
# the rules' reads, not from a hand-kept list that lacked Deployments, Karpenter
# NodePools and more) -------------------------------------------------------------------

KARPENTER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodepools.karpenter.sh"},
    "spec": {"group": "karpenter.sh", "scope": "Cluster",
             "names": {"kind": "NodePool", "listKind": "NodePoolList", "plural": "nodepools",
                       "singular": "nodepool"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": True}}}]},
}
POOL = "e2e-check-kubeconfig-pool"


def _webhook_findings(cluster: Cluster, obj: dict[str, Any], rule: str) -> list[tuple[str, str]]:
    """What the webhook pair answers for ``obj`` (its live view: list + watch of what the
    rules read), as (severity, message) of ``rule``'s findings."""
    rules = default_ruleset()
    view = LiveView(kube_configuration(str(cluster.kubeconfig)), resources_for(rules.reads),
                    indexes=rules.indexes)
    view.start()
    try:
        deadline = time.monotonic() + 60
        while view.problems():
            assert time.monotonic() < deadline, view.problems()
            time.sleep(0.2)
        found = check_object(rules, subject_of(obj), view, Policy())
    finally:
        view.stop()
    return [(f.severity, f.message) for f in found.findings if f.rule == rule]


def _check_findings(manifest: Path, cluster: Cluster, rule: str) -> list[tuple[str, str]]:
    live = check(str(manifest), "--kubeconfig", str(cluster.kubeconfig))
    assert live.returncode in (0, 1), live.stderr
    report = json.loads(live.stdout)
    return [(f["severity"], f["message"]) for f in report["objects"][0]["findings"]
            if f["rule"] == rule]


@pytest.mark.e2e
def test_a_deployment_in_the_cluster_counts_in_namespace_memory(cluster: Cluster, namespace: str,
                                                                 tmp_path: Path) -> None:
    memory = {"memory": "400Mi"}
    cluster.apply(deployment("resident", namespace, container(requests=memory, limits=memory),
                             replicas=2))
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "memory"},
         "spec": {"hard": {"requests.memory": "1Gi"}}}))
    incoming = deployment("incoming", namespace, container(requests=memory, limits=memory))
    manifest = tmp_path / "incoming.yaml"
    manifest.write_text(yaml.safe_dump(incoming))

    found = _check_findings(manifest, cluster, "namespace-memory-composition")
    # 2 x 400Mi in the cluster + 400Mi from the file = 1200Mi > 1Gi (alone it fits).
    assert [s for s, _ in found] == ["warning"], found
    assert "resident 2 x 400Mi" in found[0][1] and "quota memory requests.memory 1Gi" in found[0][1]
    assert found == _webhook_findings(cluster, incoming, "namespace-memory-composition")


@pytest.fixture
def karpenter_pool(cluster: Cluster) -> Iterator[None]:
    """A Karpenter NodePool with no limits (it can create a node as large as any pod
    needs), removed afterwards: the cluster is shared, and the pool would turn later
    tests' pod-fits-node refusals into warnings."""
    installed = cluster.kubectl("get", "crd", KARPENTER_CRD["metadata"]["name"],
                                check=False).returncode == 0
    if not installed:
        cluster.apply(KARPENTER_CRD)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/nodepools.karpenter.sh", timeout=70)
    cluster.apply({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                   "metadata": {"name": POOL},
                   "spec": {"template": {"spec": {"requirements": []}}}})
    try:
        yield
    finally:
        cluster.kubectl("delete", "nodepools.karpenter.sh", POOL, "--wait=false", check=False)
        if not installed:
            cluster.kubectl("delete", "crd", KARPENTER_CRD["metadata"]["name"], "--wait=true",
                            check=False, timeout=90)


@pytest.mark.e2e
def test_pod_fits_node_warns_like_the_webhook_when_karpenter_can_create_the_node(
        cluster: Cluster, namespace: str, karpenter_pool: None, tmp_path: Path) -> None:
    created = cluster.kubectl("get", "node", NODE, check=False).returncode != 0
    if created:
        cluster.create_node(NODE, {"cpu": "4", "memory": "8Gi", "pods": "110"})
    try:
        huge = deployment("huge", namespace, container(requests={"memory": "900Ti"},
                                                       limits={"memory": "900Ti"}))
        manifest = tmp_path / "huge.yaml"
        manifest.write_text(yaml.safe_dump(huge))

        found = _check_findings(manifest, cluster, "pod-fits-node")
        # No node has 900Ti (the check saw one with 8Gi and would refuse) but the
        # cluster's Karpenter NodePool can create one: the webhook warns (the pods wait
        # for the autoscaler), and so must check.
        assert [s for s, _ in found] == ["warning"], found
        assert "would fit a node that" in found[0][1] and "waits for the autoscaler" in found[0][1]
        assert found == _webhook_findings(cluster, huge, "pod-fits-node")
    finally:
        if created:
            cluster.delete_node(NODE)

