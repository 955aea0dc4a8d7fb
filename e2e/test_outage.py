"""What the API server does when the webhook is down, and that a restart recovers
without re-applying anything. Uses its own webhook process and configurations,
scoped to namespaces labelled ``envelope.test/isolated`` (which the session
webhook leaves alone)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import harness
from harness import Cluster

CONFIG = "envelope-outage-e2e"
LABEL = "envelope.test/isolated"


def configuration(webhook: harness.Webhook, policy: str) -> dict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [{
            "name": "mutate.outage.envelope.test",
            "clientConfig": {"url": f"{webhook.url}/mutate",
                             "caBundle": base64.b64encode(webhook.ca_file.read_bytes()).decode()},
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": policy,
            "timeoutSeconds": 3, "reinvocationPolicy": "IfNeeded",
            "namespaceSelector": {"matchLabels": {LABEL: "true"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                       "operations": ["CREATE"]}]}],
    }


@pytest.fixture
def isolated(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[harness.Webhook, str]]:
    webhook = harness.start_webhook(tmp_path, extra_args=["--cluster-view", "none"])
    ns = harness.unique_name("e2e-outage", max_length=40)
    cluster.create_namespace(ns, labels={LABEL: "true"})
    try:
        yield webhook, ns
    finally:
        webhook.stop()
        cluster.kubectl("delete", "mutatingwebhookconfiguration", CONFIG, "--ignore-not-found",
                        check=False)


def pod_json(ns: str, name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                       "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                                "resources": {"limits": {"cpu": "2", "memory": "64Mi"}}}]}})


def create(cluster: Cluster, ns: str, name: str) -> tuple[int, str, dict]:
    out = cluster.kubectl("create", "-f", "-", "-o", "json", input=pod_json(ns, name), check=False)
    return out.returncode, out.stderr, json.loads(out.stdout) if out.returncode == 0 else {}


def cpu_limit(obj: dict) -> str | None:
    return obj["spec"]["containers"][0]["resources"].get("limits", {}).get("cpu")


def until_served(cluster: Cluster, ns: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                              input=pod_json(ns, "probe"), check=False)
        if out.returncode == 0 and cpu_limit(json.loads(out.stdout)) is None:
            return
        assert time.monotonic() < deadline, f"webhook never reached: {out.stderr}"
        time.sleep(0.5)


def test_fail_refuses_ignore_passes_and_restart_recovers(cluster: Cluster, isolated, tmp_path: Path) -> None:
    webhook, ns = isolated
    cluster.apply(configuration(webhook, "Fail"))
    until_served(cluster, ns)

    webhook.process.stop(timeout=10)
    code, err, _ = create(cluster, ns, "while-down")
    assert code != 0
    assert 'failed calling webhook "mutate.outage.envelope.test"' in err
    assert "connection refused" in err

    cluster.apply(configuration(webhook, "Ignore"))
    deadline = time.monotonic() + 30
    while True:  # the API server picks up the new policy asynchronously
        code, err, stored = create(cluster, ns, "ignored")
        if code == 0:
            break
        assert time.monotonic() < deadline, err
        time.sleep(0.5)
    assert cpu_limit(stored) == "2"  # passed unmodified

    # Restart on the same port and certificate: nothing is re-applied.
    restarted = harness.start_process(webhook.process.cmd, tmp_path / "restarted.log", name="webhook",
                                      env=None, cwd=harness.REPO_ROOT)
    try:
        until_served(cluster, ns)
        code, err, stored = create(cluster, ns, "after-restart")
        assert code == 0, err
        assert cpu_limit(stored) is None
    finally:
        restarted.stop(timeout=10)
