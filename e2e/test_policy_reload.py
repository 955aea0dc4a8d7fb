"""The policy file reloaded under load on the real API server (issue 35, point 3): a
steady stream of dry-run Deployment creates goes through the API server to a webhook
started with ``--config`` on a ConfigMap-shaped volume; the file is changed (a rule's
mode enforce -> warn and an exception added), then replaced by a bad file, then put
back. No admission fails; every review that starts after ``/metrics`` shows the new
generation is answered by the new policy; the bad file changes nothing; ``/readyz``
names the generation serving.

Own webhook process and configurations, scoped to a namespace labelled
``envelope.test/isolated`` (which the session webhook leaves alone)."""

from __future__ import annotations

import base64
import hashlib
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness
from harness import Cluster
from tests.helpers.configmap import ConfigMapVolume

CONFIG = "envelope-policy-reload-e2e"
RULE = "memory-request-equals-limit"
ENFORCED = f"rules:\n  {RULE}: enforce\n"
BAD = f"rules:\n  {RULE}: enforcing\n"
TOTAL = 200


def warned(ns: str) -> str:
    return (f"rules:\n  {RULE}: warn\nexceptions:\n  - rules: [cpu-limits]\n"
            f"    namespaces: [{ns}]\n    reason: e2e live policy\n")


def configurations(webhook: harness.Webhook) -> list[dict[str, Any]]:
    client = {"caBundle": base64.b64encode(webhook.ca_file.read_bytes()).decode()}
    common = {"admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
              "timeoutSeconds": 10,
              "namespaceSelector": {"matchLabels": {harness.ISOLATED_NAMESPACE_LABEL: "true"}},
              "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                         "resources": ["deployments"], "operations": ["CREATE"]}]}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": CONFIG},
         "webhooks": [{"name": "mutate.reload.envelope.test",
                       "clientConfig": {**client, "url": f"{webhook.url}/mutate"}, **common}]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": CONFIG},
         "webhooks": [{"name": "validate.reload.envelope.test",
                       "clientConfig": {**client, "url": f"{webhook.url}/validate"}, **common}]},
    ]


def deployment(ns: str, i: int) -> dict[str, Any]:
    labels = {"app": "reload"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"reload-{i}", "namespace": ns},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "app", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"memory": "512Mi"},
                                  "limits": {"cpu": "2", "memory": "1Gi"}}}]}}}}


def answer(status: int, body: Any) -> str:
    """``old``: denied by the rule (enforce, no exception); ``new``: admitted with the
    CPU limit kept (warn, and the namespace's exception from cpu-limits); ``mixed``: the
    mutating and validating calls of one admission straddled the swap; else a failure."""
    if status == 403 and isinstance(body, dict) and RULE in str(body.get("message", "")):
        return "old"
    if status == 201 and isinstance(body, dict):
        limits = body["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {})
        return "new" if limits.get("cpu") == "2" else "mixed"
    return f"failed: {status} {str(body)[:300]}"


def generation(webhook: harness.Webhook) -> tuple[int, int]:
    """(envelope_policy_generation, envelope_policy_reload_failures_total) from /metrics."""
    with urllib.request.urlopen(f"{webhook.metrics_url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith(("envelope_policy_generation ",
                                  "envelope_policy_reload_failures_total "))}
    return (int(values["envelope_policy_generation"]),
            int(values["envelope_policy_reload_failures_total"]))


@pytest.fixture
def reloading(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[harness.Webhook, str, ConfigMapVolume]]:
    (tmp_path / "policy").mkdir()
    volume = ConfigMapVolume(tmp_path / "policy", ENFORCED)
    webhook = harness.start_webhook(tmp_path / "webhook", extra_args=[
        "--cluster-view", "none", "--config", str(volume.path),
        "--policy-reload-interval", "0.5"])
    ns = harness.unique_name("e2e-reload", max_length=40)
    try:
        cluster.create_namespace(ns, labels={harness.ISOLATED_NAMESPACE_LABEL: "true"})
        for obj in configurations(webhook):
            cluster.apply(obj)
        yield webhook, ns, volume
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                        CONFIG, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false",
                        check=False)
        webhook.stop()


def test_policy_reload_under_load_fails_no_admission(cluster: Cluster, reloading) -> None:
    webhook, ns, volume = reloading
    path = f"/apis/apps/v1/namespaces/{ns}/deployments?dryRun=All"
    # The API server loads webhook configurations asynchronously: wait for the first
    # answer of the policy read at start.
    deadline = time.monotonic() + 60
    while answer(*cluster.api("POST", path, deployment(ns, 0))) != "old":
        assert time.monotonic() < deadline, "the webhook never answered through the API server"
        time.sleep(0.5)
    assert generation(webhook) == (1, 0)

    answers: list[tuple[float, float, str]] = []  # (started, ended, answer)
    done, stop = threading.Event(), threading.Event()

    def stream() -> None:
        """One admission at a time until told to stop (after at least TOTAL, and 40
        after the last switch)."""
        try:
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                got = answer(*cluster.api("POST", path, deployment(ns, i)))
                answers.append((started, time.monotonic(), got))
                i += 1
        finally:
            done.set()

    def after(count: int) -> None:
        while len(answers) < count and not done.is_set():
            time.sleep(0.01)

    def switch(text: str, want: int) -> tuple[float, float]:
        """Write ``text`` as the kubelet would; (written, seen): when, and when /metrics
        first showed generation ``want``."""
        written = time.monotonic()
        volume.update(text)
        while generation(webhook)[0] < want:
            assert time.monotonic() - written < 30, "the new policy never loaded"
            time.sleep(0.05)
        return written, time.monotonic()

    runner = threading.Thread(target=stream, name="admissions")
    runner.start()
    try:
        after(40)
        to_new = switch(warned(ns), 2)
        after(len(answers) + 40)
        bad_written = time.monotonic()
        volume.update(BAD)
        while generation(webhook)[1] < 1:
            assert time.monotonic() - bad_written < 30, "the bad file was never read"
            time.sleep(0.05)
        after(len(answers) + 40)
        to_old = switch(ENFORCED, 3)
        after(len(answers) + 40)
        after(TOTAL)
    finally:
        stop.set()
        runner.join(300)
    assert not runner.is_alive()
    assert len(answers) >= TOTAL

    failed = [a for a in answers if a[2] not in ("old", "new", "mixed")]
    assert failed == [], failed[:5]
    assert generation(webhook) == (3, 1)

    def phase(lo: float, hi: float) -> list[str]:
        """Reviews sent after ``lo`` and answered before ``hi`` (one answered after a
        write may have met the new policy: the reloader may poll at once)."""
        return [got for started, ended, got in answers if lo < started and ended < hi]

    # Answered before the first write: all old. Every review sent after /metrics said
    # the new generation serves: the new policy, also while the bad file was there.
    assert set(phase(0, to_new[0])) == {"old"}
    assert set(phase(to_new[1], to_old[0])) == {"new"}
    assert set(phase(to_old[1], float("inf"))) == {"old"}
    # Between the write and the generation showing: the old policy, then the new; only
    # one admission can straddle the swap (the stream sends one at a time).
    for (lo, hi), first, then in ((to_new, "old", "new"), (to_old, "new", "old")):
        window = [got for started, ended, got in answers if ended > lo and started < hi]
        order = {first: 0, "mixed": 1, then: 2}
        ranks = [order[g] for g in window]
        assert ranks == sorted(ranks), window
        assert window.count("mixed") <= 1, window
    status, body = harness.https_get(f"{webhook.url}/readyz",
                                    harness.tls_context(webhook.ca_file), timeout=5)
    digest = hashlib.sha256(ENFORCED.encode()).hexdigest()[:12]
    assert (status, body) == (200, f"ok (policy generation 3 sha256 {digest})")
    log = webhook.log_path.read_text()
    refused = [line for line in log.splitlines() if "policy reload refused" in line]
    assert len(refused) == 1, refused
    assert str(volume.path) in refused[0] and f"rules.{RULE}" in refused[0]
    lag = {name: len([a for a in answers if a[0] >= w[0] and a[0] < w[1]])
           for name, w in (("to new", to_new), ("back", to_old))}
    print(f"\n{len(answers)} admissions, 0 failed; reviews started between the write and the new "
          f"generation showing: {lag}; switch latency "
          f"{to_new[1] - to_new[0]:.2f} s / {to_old[1] - to_old[0]:.2f} s")
