"""What an on-call engineer and a kubectl user see, through the real API server: warnings
that name Envelope and the rule, an object that says what Envelope changed in it, and
the metrics endpoint counting rule results after a scenario."""

from __future__ import annotations

import re
import urllib.request

from builders import container, deployment
from harness import Cluster, Webhook


def scrape(webhook: Webhook) -> str:
    with urllib.request.urlopen(webhook.metrics_url + "/metrics", timeout=10) as response:
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series, labels in any order; 0 when absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_warnings_name_envelope_and_the_rule(cluster: Cluster, webhook: Webhook,
                                             namespace: str) -> None:
    pinned = deployment("pinned", namespace,
                        container(requests={"cpu": "2", "memory": "1Gi"},
                                  limits={"cpu": "2", "memory": "1Gi"}))
    out = cluster.apply(pinned)
    assert ('Warning: envelope[cpu-limits]: pods become Burstable, losing exclusive cores; to keep '
            'them: envelope.io/keep-cpu-limit: "true"') in out.stderr, out.stderr
    refused = deployment("refused", namespace,
                         container(requests={"memory": "1Gi"}, limits={"memory": "2Gi"}))
    out = cluster.apply(refused, check=False)
    assert out.returncode != 0 and "[memory-request-equals-limit]" in out.stderr


def test_a_mutated_object_says_what_changed_and_metrics_count_rule_results(
        cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    before = scrape(webhook)
    cluster.apply(deployment("trainer", namespace,
                             container("app", limits={"cpu": "7", "memory": "29Gi"}),
                             container("sidecar", requests={"memory": "64Mi"})))
    stored = cluster.kubectl_json("get", "deployment", "trainer", "-n", namespace)
    assert stored["metadata"]["annotations"]["envelope.io/mutations"] == \
        "cpu-limits:app;memory-limit:sidecar"
    # metadata only: the pod template, and so the ReplicaSet's hash, is the manifest's
    assert "annotations" not in stored["spec"]["template"]["metadata"]
    cluster.apply(deployment("refused", namespace,
                             container(requests={"memory": "1Gi"}, limits={"memory": "2Gi"})),
                  check=False)
    after = scrape(webhook)

    def grew(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert grew("envelope_rule_results_total", rule="cpu-limits", result="pass") >= 1
    assert grew("envelope_rule_results_total", rule="memory-request-equals-limit", result="fail") >= 1
    assert grew("envelope_patches_total", kind="Deployment") >= 1
    assert grew("envelope_admission_requests_total", endpoint="validate", kind="Deployment",
                operation="CREATE", decision="deny") >= 1
    assert sample(after, "envelope_watch_synced", kind="Node") == 1.0
    assert "process_resident_memory_bytes" in after
