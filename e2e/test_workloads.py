"""Workload envelopes through a real kube-apiserver, real kubectl, and the webhook
running as a real process (see conftest.py for the fixtures)."""

from __future__ import annotations

import json
from typing import Any

from e2e.builders import SEED, container, deployment, pod_template
from harness import Cluster, Webhook


def pod(name: str, ns: str, *containers: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": list(containers)},
    }


def cronjob(name: str, ns: str, *containers: dict[str, Any]) -> dict[str, Any]:
    template = pod_template(*containers)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}},
    }


def stored_resources(cluster: Cluster, kind: str, name: str, ns: str) -> dict[str, Any]:
    obj = cluster.kubectl_json("get", kind, name, "-n", ns)
    spec = obj["spec"]
    if kind == "cronjob":
        spec = spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind != "pod":
        spec = spec["template"]["spec"]
    resources: dict[str, Any] = spec["containers"][0]["resources"]
    return resources


def test_apply_strips_cpu_limits_and_keeps_the_request(
    cluster: Cluster, webhook: Webhook, namespace: str
) -> None:
    cases = [
        ("deployment", deployment("web", namespace, container(**SEED))),
        ("pod", pod("web", namespace, container(**SEED))),
        ("cronjob", cronjob("web", namespace, container(**SEED))),
    ]
    for kind, manifest in cases:
        cluster.apply(manifest)
        resources = stored_resources(cluster, kind, "web", namespace)
        assert "cpu" not in resources["limits"], (kind, resources)
        assert resources["limits"]["memory"] == "29Gi", (kind, resources)
        assert resources["requests"]["cpu"] == "7", (kind, resources)
        if kind == "pod":  # Pods default the memory request from the limit
            assert resources["requests"]["memory"] == "29Gi"


def test_limitrange_default_is_removed_by_reinvocation(
    cluster: Cluster, webhook: Webhook, namespace: str
) -> None:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "defaults", "namespace": namespace},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "2"}}]},
        }
    )
    manifest = pod(
        "big", namespace, container(requests={"cpu": "7", "memory": "1Gi"}, limits={"memory": "1Gi"})
    )
    cluster.apply(manifest)  # without the webhook: "must be less than or equal to cpu limit"
    resources = stored_resources(cluster, "pod", "big", namespace)
    assert "cpu" not in resources.get("limits", {})
    assert resources["requests"]["cpu"] == "7"


def test_dry_run_denied_and_mutated_objects_store_nothing(
    cluster: Cluster, webhook: Webhook, namespace: str
) -> None:
    bad = deployment("bad", namespace, container(requests={"memory": "1Gi"}, limits={"memory": "2Gi"}))
    out = cluster.apply(bad, "--dry-run=server", check=False)
    assert out.returncode != 0
    assert "memory request 1Gi differs from limit 2Gi" in out.stderr
    assert cluster.kubectl("get", "deployment", "bad", "-n", namespace, check=False).returncode != 0

    good = deployment("good", namespace, container(**SEED))
    out = cluster.apply(good, "--dry-run=server", "-o", "json")
    printed = json.loads(out.stdout)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert printed["limits"] == {"memory": "29Gi"} and printed["requests"]["cpu"] == "7"
    assert cluster.kubectl("get", "deployment", "good", "-n", namespace, check=False).returncode != 0


def test_denials_and_warnings_reach_kubectl(cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    bad = pod("api", namespace, container("api", requests={"memory": "1Gi"}, limits={"memory": "2Gi"}))
    out = cluster.apply(bad, check=False)
    assert out.returncode != 0
    assert 'denied the request: container "api": memory request 1Gi differs from limit 2Gi' in out.stderr
    # Guaranteed with whole cores -> Burstable: a warning names the opt-out
    guaranteed = deployment(
        "pinned",
        namespace,
        container(requests={"cpu": "2", "memory": "1Gi"}, limits={"cpu": "2", "memory": "1Gi"}),
    )
    out = cluster.apply(guaranteed)
    assert "Warning:" in out.stderr and "envelope.io/keep-cpu-limit" in out.stderr
    opted = deployment(
        "opted",
        namespace,
        container(requests={"cpu": "2", "memory": "1Gi"}, limits={"cpu": "2", "memory": "1Gi"}),
    )
    opted["spec"]["template"]["metadata"]["annotations"] = {"envelope.io/keep-cpu-limit": "true"}
    cluster.apply(opted)
    assert stored_resources(cluster, "deployment", "opted", namespace)["limits"]["cpu"] == "2"


def test_string_envelopes_in_env_lose_cpu(cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    env = [
        {"name": "RESOURCE_LIMITS", "value": "cpu=7, memory=29Gi,ephemeral-storage=26Gi"},
        {"name": "RESOURCE_REQUESTS", "value": "cpu=7,memory=29Gi"},
    ]
    cluster.apply(deployment("trainer", namespace, container(env=env, **SEED)))
    stored = cluster.kubectl_json("get", "deployment", "trainer", "-n", namespace)
    values = [e["value"] for e in stored["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert values == ["memory=29Gi,ephemeral-storage=26Gi", "cpu=7,memory=29Gi"]


def test_check_offline_judges_a_namespace_less_pod_as_the_webhook_does(
    cluster: Cluster, webhook: Webhook, namespace: str, tmp_path: Any
) -> None:
    """Issue 37 class 9, the kubernetes.io LimitRange tutorial's shape: a LimitRange and a
    Pod with only a memory request, written without a namespace and applied with
    ``kubectl apply -n``. LimitRanger gives the Pod its default limit before the webhook
    runs, so the webhook refuses it; ``envelope check -n`` says the same, word for word
    (it passed offline before: no namespace, no LimitRange, and the limit filled first)."""
    import subprocess
    import sys
    from pathlib import Path

    limit_range = ("apiVersion: v1\nkind: LimitRange\nmetadata:\n  name: mem-limit-range\nspec:\n"
                   "  limits:\n  - default: {memory: 512Mi}\n    defaultRequest: {memory: 256Mi}\n"
                   "    type: Container\n")
    only_request = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: only-request\nspec:\n"
                    "  containers:\n  - name: app\n    image: registry.example/app:1\n"
                    "    resources:\n      requests: {memory: 256Mi}\n")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=limit_range)
    refused = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=only_request, check=False)
    assert refused.returncode != 0, refused.stdout
    files = Path(tmp_path) / "tutorial.yaml"
    files.write_text(limit_range + "---\n" + only_request)
    offline = subprocess.run([sys.executable, "-m", "app", "check", "-n", namespace, "-o", "json",
                              str(files)], capture_output=True, text=True, timeout=120,
                             cwd=Path(__file__).resolve().parent.parent)
    assert offline.returncode == 1, offline.stdout + offline.stderr
    [pod] = [o for o in json.loads(offline.stdout)["objects"] if o["kind"] == "Pod"]
    [message] = [f["message"] for f in pod["findings"] if f["rule"] == "memory-request-equals-limit"]
    assert message in refused.stderr, (message, refused.stderr)
