"""``envelope audit`` against the real kube-apiserver.

Objects are created in a namespace labelled ``envelope.test/isolated`` (the session
webhook, when another test registered it, leaves such namespaces alone): they are
written as if Envelope were not installed. The audit must then find them with the
right rule and message, write PolicyReports that the API server accepts under the
upstream CRD (vendored in charts/envelope/files/crds), and drop a result once the
object is fixed or deleted — both one-shot (``--write``) and continuously
(``--watch``: on change, debounced).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.audit import JUDGED, Audit, judge, policy_reports
from app.cluster.view import StaticView
from app.core.config import load_policy
from app.core.ruleset import default_ruleset
from harness import (
    ISOLATED_NAMESPACE_LABEL,
    REPO_ROOT,
    Cluster,
    free_port,
    install_crds,
    start_process,
    unique_name,
    wait_until,
)

REPORT_CRDS = REPO_ROOT / "charts" / "envelope" / "files" / "crds"


@pytest.fixture(scope="module")
def report_crds(cluster: Cluster) -> list[str]:
    return install_crds(cluster, REPORT_CRDS)


@pytest.fixture
def untouched(cluster: Cluster, request: pytest.FixtureRequest) -> str:
    """A namespace no Envelope webhook judges: as if Envelope were not installed."""
    name = unique_name(f"audit-{request.node.name}", max_length=50)
    cluster.create_namespace(name, labels={ISOLATED_NAMESPACE_LABEL: "true"})
    return name


def deployment(name: str, namespace: str, requests: dict[str, str],
               limits: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                         "resources": {"requests": requests,
                                                       "limits": limits}}]}}}}


def envelope(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("ENVELOPE_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "app", "audit", "--kubeconfig",
                           str(cluster.kubeconfig), *args], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=120, check=False)
    if check and proc.returncode not in (0, 1):
        raise AssertionError(f"envelope audit {args}: {proc.returncode}\n{proc.stderr}")
    return proc


def report(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return cluster.kubectl_json("get", "policyreports.v1alpha2.wgpolicyk8s.io", "envelope-audit",
                                "-n", namespace)


def results(rep: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(r["resources"][0]["name"], r["rule"], r["result"]) for r in rep.get("results") or []}


def seed(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("split", namespace, {"cpu": "100m", "memory": "64Mi"},
                             {"memory": "128Mi"}))
    cluster.apply(deployment("capped", namespace, {"cpu": "100m", "memory": "64Mi"},
                             {"cpu": "1", "memory": "64Mi"}))
    cluster.apply(deployment("fine", namespace, {"cpu": "100m", "memory": "64Mi"},
                             {"memory": "64Mi"}))


def fix_split(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("split", namespace, {"cpu": "100m", "memory": "128Mi"},
                             {"memory": "128Mi"}))


def test_audit_reports_what_existed_before_envelope(cluster: Cluster, report_crds: list[str],
                                                    untouched: str) -> None:
    seed(cluster, untouched)
    # Created as written: nothing mutated them.
    capped = cluster.kubectl_json("get", "deployment", "capped", "-n", untouched)
    assert capped["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1"

    text = envelope(cluster)
    assert text.returncode == 1, text.stdout  # there is a fail
    assert (f"fail  Deployment {untouched}/split memory-request-equals-limit: "
            in text.stdout), text.stdout

    out = json.loads(envelope(cluster, "-o", "json").stdout)
    mine = {(r["name"], r["rule"], r["result"]): r for r in out["results"]
            if r["namespace"] == untouched}
    assert set(mine) == {("split", "memory-request-equals-limit", "fail"),
                         ("capped", "cpu-limits", "warn")}
    split = mine[("split", "memory-request-equals-limit", "fail")]
    assert "memory request 64Mi differs from limit 128Mi" in split["message"]
    patch = json.loads(mine[("capped", "cpu-limits", "warn")]["properties"]["patch"])
    assert {"op": "remove", "path": "/spec/template/spec/containers/0/resources/limits/cpu"} in patch

    # The reports as the API server stores them: accepted under the upstream CRD.
    written = envelope(cluster, "--write", "-o", "policyreport")
    assert "reports applied" in written.stderr
    rep = report(cluster, untouched)
    assert rep["apiVersion"] == "wgpolicyk8s.io/v1alpha2"
    assert results(rep) == {("split", "memory-request-equals-limit", "fail"),
                            ("capped", "cpu-limits", "warn")}
    assert rep["summary"]["fail"] == 1 and rep["summary"]["warn"] == 1
    assert rep["summary"]["pass"] > 0
    # kubectl apply of the printed reports (the upstream CRD validates them again).
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=written.stdout)

    fix_split(cluster, untouched)
    cluster.kubectl("delete", "deployment", "capped", "-n", untouched)
    envelope(cluster, "--write")
    rep = report(cluster, untouched)
    assert results(rep) == set()
    assert rep["summary"]["fail"] == 0 and rep["summary"]["pass"] > 0


def test_cluster_report_accepted_by_the_api_server(cluster: Cluster,
                                                   report_crds: list[str]) -> None:
    """A ClusterPolicyReport for a KAI Queue (cluster scope) as the audit makes it:
    built offline (the session webhook would refuse creating a bad Queue) and applied
    for real."""
    rules = default_ruleset()
    queue = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
             "metadata": {"name": unique_name("q"), "uid": "0"},
             "spec": {"resources": {"gpu": {"quota": -5, "limit": -1, "overQuotaWeight": 1}}}}
    found = Audit(started=time.time())
    judge(rules, StaticView([queue], rules.indexes), load_policy(None, {}, rules), queue,
          next(j for j in JUDGED if j.kind == "Queue"), found)
    (cluster_report,) = policy_reports(found)
    assert cluster_report["kind"] == "ClusterPolicyReport" and cluster_report["results"]
    cluster_report["metadata"]["name"] = unique_name("envelope-audit-e2e")
    cluster.apply(cluster_report, "--dry-run=server")
    broken = json.loads(json.dumps(cluster_report))
    broken["results"][0]["result"] = "refused"
    refused = cluster.apply(broken, "--dry-run=server", check=False)
    assert refused.returncode != 0 and "result" in refused.stderr


def test_continuous_audit_follows_changes(cluster: Cluster, report_crds: list[str],
                                          untouched: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    proc = start_process([sys.executable, "-m", "app", "audit", "--watch",
                          "--kubeconfig", str(cluster.kubeconfig), "--interval", "600",
                          "--debounce", "1", "--metrics-host", "127.0.0.1",
                          "--metrics-port", str(port)],
                         tmp_path / "audit.log", name="audit", env=env, cwd=REPO_ROOT)
    try:
        # On start: the namespace exists but has nothing judged yet.
        seed(cluster, untouched)
        wait_until("the audit to report the seeded objects",
                   lambda: results(report(cluster, untouched)) == {
                       ("split", "memory-request-equals-limit", "fail"),
                       ("capped", "cpu-limits", "warn")}, proc, 60, interval=0.5)

        def metric() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()

        line = (f'envelope_audit_violations{{namespace="{untouched}",result="fail",'
                f'rule="memory-request-equals-limit"}} 1.0')
        wait_until("the violations gauge", lambda: line in metric(), proc, 30, interval=0.5)
        assert "envelope_audit_last_success_timestamp_seconds" in metric()

        fix_split(cluster, untouched)  # a change, not the 10-minute interval, re-audits
        wait_until("the fixed object to leave the report",
                   lambda: results(report(cluster, untouched)) == {
                       ("capped", "cpu-limits", "warn")}, proc, 60, interval=0.5)
        wait_until("the series to leave", lambda: line.rsplit(" ", 1)[0] not in metric(),
                   proc, 30, interval=0.5)
    finally:
        proc.stop(timeout=10)
