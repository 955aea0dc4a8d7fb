"""`envelope check --kubeconfig`: manifests from files, their context from the API server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
