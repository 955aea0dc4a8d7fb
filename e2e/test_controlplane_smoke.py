"""Smoke test of the e2e control plane itself (no webhook involved)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import harness
from harness import Cluster

pytestmark = pytest.mark.e2e


def _k8s_version(cluster: Cluster) -> str:
    source = cluster.bin_dir.parent.name  # <cache>/<k8s-vX.Y.Z_etcd-..._helm-...>/bin -> the pinned version
    match = re.match(r"(?:k8s|kubernetes)-(v\d+\.\d+\.\d+(?:-(?:alpha|beta|rc)\.\d+)?)_", source)
    return match.group(1) if match else ""


def test_server_version(cluster: Cluster) -> None:
    info = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    server = info["serverVersion"]
    # A supported minor (docs/upstream.md): 1.37 by default, 1.35 in make e2e-second; or
    # the next one before its GA (1.38, make e2e-next). kubectl is always the API
    # server's own version.
    assert (server["major"], server["minor"]) in {("1", "35"), ("1", "36"), ("1", "37"), ("1", "38")}, server
    assert info["clientVersion"]["gitVersion"] == server["gitVersion"], info["clientVersion"]
    pinned = _k8s_version(cluster)
    if pinned:
        assert server["gitVersion"] == pinned
    status, body = cluster.get_raw("/version")
    assert status == 200
    assert json.loads(body)["gitVersion"] == server["gitVersion"]


def test_resourcequota_admission_is_active(cluster: Cluster, namespace: str) -> None:
    # No quota controller runs: create_resource_quota fills in status.hard, which
    # is all the ResourceQuota admission plugin looks at.
    quota = cluster.create_resource_quota(namespace, "cpu-limits", {"limits.cpu": "4"})
    assert quota["status"]["used"] == {"limits.cpu": "0"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "no-limit", "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
    }
    result = cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False)
    assert result.returncode != 0
    assert "must specify limits.cpu" in result.stderr, result.stderr

    pod["metadata"]["name"] = "with-limit"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "3"}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    used = cluster.kubectl_json("get", "resourcequota", "cpu-limits", "-n", namespace)
    assert used["status"]["used"]["limits.cpu"] == "3"  # charged by admission
    pod["metadata"]["name"] = "over-quota"
    over = cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False)
    assert over.returncode != 0
    assert "exceeded quota" in over.stderr, over.stderr


def test_namespace_and_pod(cluster: Cluster, namespace: str) -> None:
    ns = cluster.kubectl_json("get", "namespace", namespace)
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == namespace

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "smoke", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"cpu": "7", "memory": "64Mi"}},
                }
            ]
        },
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    got = cluster.kubectl_json("get", "pod", "smoke", "-n", namespace)
    resources = got["spec"]["containers"][0]["resources"]
    # Defaulting on a Pod: requests default to limits.
    assert resources["requests"]["cpu"] == "7"
    assert got["status"]["phase"] == "Pending"  # no scheduler/kubelet


def test_limitrange_defaulting_is_active(cluster: Cluster) -> None:
    # Outside the webhook's reach (it strips CPU limits): the control plane alone.
    namespace = harness.unique_name("e2e-limitrange-plain", max_length=40)
    cluster.create_namespace(namespace, labels={harness.ISOLATED_NAMESPACE_LABEL: "true"})
    limit_range = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "cpu-default", "namespace": namespace},
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "2"}}]},
    }
    cluster.apply(limit_range)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "defaulted", "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
    }
    created = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(pod)).stdout)
    assert created["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"


def test_failed_kubectl_raises_with_output(cluster: Cluster) -> None:
    result = cluster.kubectl("get", "namespace", "does-not-exist", check=False)
    assert result.returncode != 0
    assert "NotFound" in result.stderr or "not found" in result.stderr


def test_helm_version(cluster: Cluster, tmp_path: Path) -> None:
    out = cluster.helm("version", "--short").stdout.strip()
    assert out.startswith("v3."), out
    # Offline rendering assumes the Kubernetes version set by build.sh's ldflags
    # (helm's default would be v1.20).
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    rendered = cluster.helm("template", "probe", str(chart)).stdout
    assert 'kube: "v1.34.0"' in rendered, rendered
