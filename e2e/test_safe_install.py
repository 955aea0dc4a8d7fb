"""An install that cannot lock the cluster (the chart's webhooks.safeInstall, the
default), on the real API server with the real helm: (a) the chart installed with pods
that never become ready — `helm install --wait` fails, and a Deployment in a user
namespace is still created; (b) once an Envelope replica answers through the
configuration's own URL and caBundle it raises each webhook to the failurePolicy the
chart recorded, and the first refused `kubectl apply` comes within 30 s; (c) `helm
uninstall` leaves no webhook configuration."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path

import harness
from builders import container, deployment
from harness import Cluster

RELEASE = "safe-e2e"
NAME = f"{RELEASE}-envelope"  # the chart's configuration name for that release


RELEASE_NS = "envelope-safe-e2e"


def install(cluster: Cluster, url: str, ca_file: Path) -> str:
    """``helm install --wait`` of the whole chart in URL mode. Its pods can never become
    ready here (no kubelet), exactly like an image that cannot be pulled."""
    selector = json.dumps([{"key": harness.ISOLATED_NAMESPACE_LABEL, "operator": "Exists"},
                           {"key": "envelope.test/safe", "operator": "Exists"}])
    out = cluster.helm(
        "install", RELEASE, str(harness.CHART_DIR), "--set", "image.local=true", "--namespace", RELEASE_NS,
        "--create-namespace", "--wait", "--timeout", "20s",
        "--set", f"webhooks.url={url}", "--set", "certificates.mode=provided",
        "--set", "certificates.provided.secretName=unused-in-url-mode",
        "--set", f"certificates.provided.caBundle={base64.b64encode(ca_file.read_bytes()).decode()}",
        "--set-json", f"webhooks.namespaceSelectorExpressions={selector}",
        check=False, timeout=120)
    assert out.returncode != 0, "helm install --wait cannot succeed without running pods"
    return out.stderr


def policies(cluster: Cluster) -> dict[str, str]:
    out = {}
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for hook in cluster.kubectl_json("get", kind, NAME)["webhooks"]:
            out[hook["name"]] = hook["failurePolicy"]
    return out


def bad(name: str, ns: str) -> dict[str, object]:
    return deployment(name, ns, container(requests={"memory": "1Gi"}, limits={"memory": "2Gi"}))


def test_nothing_serving_locks_nothing_and_enforcement_begins_once_ready(
        cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    cluster.kubectl("label", "namespace", namespace, f"{harness.ISOLATED_NAMESPACE_LABEL}=true",
                    "envelope.test/safe=true")
    ca_file, cert_file, key_file = harness.make_serving_cert(tmp_path, name="safe")
    port = harness.free_port()
    failed = install(cluster, f"https://127.0.0.1:{port}", ca_file)
    assert "context deadline exceeded" in failed or "not ready" in failed, failed
    try:
        assert set(policies(cluster).values()) == {"Ignore"}
        # (a) nothing answers (an image that cannot start, a policy that stops startup):
        # the workload is admitted, as it would be without Envelope.
        time.sleep(2)  # the API server loads webhook configurations asynchronously
        assert cluster.apply(bad("before", namespace), check=False).returncode == 0

        # (b) a replica starts with the chart's arguments: once ready and reachable through
        # the configuration, it raises the webhooks, and the same write is refused.
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
               "PYTHONPATH": str(harness.REPO_ROOT)}
        server = harness.start_process(
            [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--cert-file", str(cert_file), "--key-file", str(key_file), "--metrics-port", "0",
             f"--mutating-webhook-configuration={NAME}",
             f"--validating-webhook-configuration={NAME}"],
            tmp_path / "serve.log", name="safe-webhook", env=env, cwd=harness.REPO_ROOT)
        try:
            started = time.monotonic()
            harness.wait_until("failure policies raised", lambda: policies(cluster) == {
                "workloads.mutate.envelope.io": "Ignore", "workloads.validate.envelope.io": "Fail",
                "quotas.validate.envelope.io": "Fail", "actors.validate.envelope.io": "Fail"},
                server, timeout=60, interval=1)
            refused = None
            while time.monotonic() - started < 60:
                out = cluster.apply(bad(f"after-{int(time.monotonic())}", namespace), check=False)
                if out.returncode != 0 and "memory request 1Gi differs from limit 2Gi" in out.stderr:
                    refused = time.monotonic() - started
                    break
                time.sleep(1)
            assert refused is not None and refused < 30, refused
        finally:
            server.stop(timeout=10)
        # Gone again: the raised policy stays (Fail refuses), as the chart intends once
        # Envelope has served; deleting the configurations always recovers.
        out = cluster.apply(bad("gone", namespace), check=False)
        assert out.returncode != 0 and "failed calling webhook" in out.stderr, out.stderr
        # (c) helm uninstall leaves no webhook configuration behind.
        cluster.helm("uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", "--timeout", "60s")
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            gone = cluster.kubectl("get", kind, NAME, check=False)
            assert gone.returncode != 0 and "NotFound" in gone.stderr
        assert cluster.apply(bad("after-uninstall", namespace), check=False).returncode == 0
    finally:
        cluster.helm("uninstall", RELEASE, "--namespace", RELEASE_NS, check=False)
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                        NAME, "--ignore-not-found", check=False)
