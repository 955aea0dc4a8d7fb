"""The chart's in-cluster audit (``audit.enabled``): its Deployment, RBAC and the
PolicyReport CRDs it renders when the cluster has none.

Offline: ``helm template`` with the audit on, every object validated against the
Kubernetes 1.34 schemas; RBAC is exactly what ``app/audit/`` lists and writes; the
audit pods are never selected by the webhook's Service or PDB; the rendered arguments
parse with the real CLI.

Real API server (``e2e``): ``helm install`` creates the CRDs (owned by the release),
``envelope audit --write`` runs under the chart's audit ServiceAccount token and
writes its reports (so the RBAC is enough) and can write nothing else, ``helm
upgrade`` keeps the CRDs, ``helm uninstall`` removes them; CRDs another tool
installed are neither taken over nor removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from app.audit import judged_for
from app.cli import _parser
from app.cluster.live import resources_for
from app.core.ruleset import default_ruleset
from tests.helpers.chart import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    STANDARD_LABELS,
    _sa_kubeconfig,
    render,
    render_error,
)

ON = {"audit": {"enabled": True}}
CRD_FILES = CHART / "files" / "crds"
REPORTS = {("wgpolicyk8s.io", "policyreports"), ("wgpolicyk8s.io", "clusterpolicyreports")}


def _group_resource(path: str) -> tuple[str, str]:
    parts = path.strip("/").split("/")
    return ("", parts[-1]) if parts[0] == "api" else (parts[1], parts[-1])


def audit_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    rendered = render({**ON, **(values or {})})
    return [d for d in rendered.docs if d["metadata"]["name"].endswith("-audit")
            or d["kind"] == "CustomResourceDefinition"]


def test_off_by_default() -> None:
    docs = render().docs
    assert not [d for d in docs if d["metadata"]["name"].endswith("-audit")]
    assert not [d for d in docs if d["kind"] == "CustomResourceDefinition"]


def test_objects_match_the_kubernetes_schemas_and_carry_labels() -> None:
    docs = audit_objects()
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                         "Deployment", "CustomResourceDefinition"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        for label in STANDARD_LABELS:
            assert doc["metadata"]["labels"].get(label), (doc["kind"], label)


def test_crds_are_the_vendored_upstream_ones() -> None:
    crds = {d["metadata"]["name"]: d for d in audit_objects()
            if d["kind"] == "CustomResourceDefinition"}
    for plural in ("policyreports", "clusterpolicyreports"):
        upstream = yaml.safe_load((CRD_FILES / f"wgpolicyk8s.io_{plural}.yaml").read_text())
        assert crds[f"{plural}.wgpolicyk8s.io"]["spec"] == upstream["spec"]
    assert not render({**ON, "audit": {"enabled": True, "installCRDs": False}}).of(
        "CustomResourceDefinition")


def test_rbac_reads_what_the_audit_lists_and_writes_only_reports() -> None:
    (role,) = [d for d in audit_objects() if d["kind"] == "ClusterRole"]
    reads: set[tuple[str, str]] = set()
    writes: set[tuple[str, str]] = set()
    for r in role["rules"]:
        pairs = {(g, res) for g in r["apiGroups"] for res in r["resources"]}
        assert "resourceNames" not in r
        if set(r["verbs"]) <= {"get", "list", "watch"}:
            reads |= pairs
        else:
            assert set(r["verbs"]) == {"get", "list", "create", "patch", "delete"}
            writes |= pairs
    rules = default_ruleset()
    # Namespaces: read when the policy's exceptions select namespaces by label.
    wanted = {_group_resource(j.path) for j in judged_for(rules)} | \
             {_group_resource(r.path) for r in resources_for(rules.reads | {"Namespace"})}
    assert reads == wanted
    assert writes == REPORTS


def test_audit_pods_are_not_webhook_pods() -> None:
    rendered = render(ON)
    (deployment,) = [d for d in rendered.of("Deployment") if d["metadata"]["name"].endswith("-audit")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = rendered.one("Service")["spec"]["selector"]
    assert not set(service.items()) <= set(labels.items())
    for pdb in rendered.of("PodDisruptionBudget"):
        assert not set(pdb["spec"]["selector"]["matchLabels"].items()) <= set(labels.items())
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"


def test_arguments_parse_with_the_real_cli() -> None:
    (deployment,) = [d for d in audit_objects() if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["envelope"]
    args = _parser().parse_args(container["args"])
    assert (args.command, args.watch, args.interval, args.debounce) == ("audit", True, 600, 10)
    assert args.config == "/etc/envelope/policy.yaml"


def test_audit_container_follows_our_own_rule() -> None:
    (deployment,) = [d for d in audit_objects() if d["kind"] == "Deployment"]
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert "cpu" not in resources["limits"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    error = render_error({"audit": {"enabled": True, "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}})
    assert "/audit/resources/limits" in error  # the schema refuses a CPU limit
    error = render_error({"audit": {"enabled": True, "resources": {
        "requests": {"memory": "512Mi"}, "limits": {"memory": "1Gi"}}}})
    assert "memory request (512Mi) must equal the memory limit (1Gi)" in error


# ---------------------------------------------------------------- real API server

NO_WEBHOOKS = ["--set", "webhooks.workloads.enabled=false", "--set", "webhooks.quotas.enabled=false",
               "--set", "webhooks.actors.enabled=false"]


def _audit_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(CHART.parent.parent)}
    env.pop("ENVELOPE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "app", "audit", "--kubeconfig", str(kubeconfig),
                           *args], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def _crds(running: Any) -> dict[str, dict[str, Any]]:
    items = running.kubectl_json("get", "crd")["items"]
    return {c["metadata"]["name"]: c for c in items if c["spec"]["group"] == "wgpolicyk8s.io"}


@pytest.mark.e2e
def test_install_audit_upgrade_uninstall(cluster: Any, tmp_path: Path) -> None:
    cluster.create_namespace(NAMESPACE)
    values = ["--set", "audit.enabled=true", *NO_WEBHOOKS]
    cluster.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "image.local=true",
                 *values)
    crds = _crds(cluster)
    assert set(crds) == {"policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io"}
    for crd in crds.values():
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    *(f"crd/{n}" for n in crds))

    ns = cluster.create_namespace("team-old")
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "old", "namespace": ns},
           "spec": {"selector": {"matchLabels": {"app": "old"}}, "template": {
               "metadata": {"labels": {"app": "old"}},
               "spec": {"containers": [{"name": "app", "image": "busybox", "resources": {
                   "requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}}]}}}}
    cluster.apply(bad)

    sa = f"{RELEASE}-audit"
    kubeconfig = _sa_kubeconfig(cluster, NAMESPACE, sa, tmp_path / "audit.kubeconfig")
    proc = _audit_cli(kubeconfig, "--write", "-o", "json")
    assert proc.returncode == 1, proc.stderr  # a fail result; RBAC let it read and write
    assert "reports applied" in proc.stderr
    report = cluster.kubectl_json("get", "policyreports.v1alpha2.wgpolicyk8s.io",
                                  "envelope-audit", "-n", ns)
    assert [(r["rule"], r["result"]) for r in report["results"]] == [
        ("memory-request-equals-limit", "fail")]
    user = f"system:serviceaccount:{NAMESPACE}:{sa}"
    for verb, resource in (("create", "configmaps"), ("patch", "deployments"),
                           ("delete", "pods"), ("get", "secrets")):
        can = cluster.kubectl("auth", "can-i", verb, resource, "-A", f"--as={user}", check=False)
        assert can.stdout.strip() == "no", (verb, resource)

    cluster.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "image.local=true",
                 *values,
                 "--set", "audit.intervalSeconds=300")
    assert set(_crds(cluster)) == set(crds)  # lookup: still ours, still rendered

    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    assert _crds(cluster) == {}
    hooks = cluster.kubectl("get", "mutatingwebhookconfigurations,validatingwebhookconfigurations",
                            "-o", "name").stdout
    assert RELEASE not in hooks

    # Without the CRDs, --write says what to install (and the exit status says it failed).
    proc = _audit_cli(cluster.kubeconfig, "--write")
    assert proc.returncode == 2
    assert "report CRDs (wgpolicyk8s.io/v1alpha2) are not installed" in proc.stderr


@pytest.mark.e2e
def test_crds_of_another_tool_are_left_alone(cluster: Any) -> None:
    files = [str(CRD_FILES / f) for f in sorted(os.listdir(CRD_FILES))]
    cluster.kubectl("apply", *(a for f in files for a in ("-f", f)))
    before = {n: c["metadata"]["uid"] for n, c in _crds(cluster).items()}
    cluster.create_namespace(NAMESPACE)
    cluster.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "image.local=true",
                 "--set", "audit.enabled=true", *NO_WEBHOOKS)
    manifest = cluster.helm("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout
    assert "CustomResourceDefinition" not in manifest
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    assert {n: c["metadata"]["uid"] for n, c in _crds(cluster).items()} == before
    assert json.loads(json.dumps(before))  # both CRDs were there all along
