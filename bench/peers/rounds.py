"""One set-up per peer round, shared by bench/apiserver.py and bench/peers/same_answer.py.

Labels:
- ``map``: the MutatingAdmissionPolicy + binding (in the API server, no webhook);
- ``kyverno-cpol`` / ``kyverno-mpol``: Kyverno with the classic ClusterPolicy / the CEL
  MutatingPolicy (a fresh Kyverno process per round, so CPU and RSS are the round's);
- ``envelope`` / ``envelope-mc``: Envelope with the chart's configurations, without and
  with the mutating webhook's matchConditions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import peers
import policies
import yaml
from objects import timed_deployment

import harness

PEER_ROUNDS = ("map", "kyverno-cpol", "kyverno-mpol", "envelope", "envelope-mc")


def _envelope_configurations(cluster: harness.Cluster, webhook: harness.Webhook, *, match: bool) -> str:
    docs = [d for d in yaml.safe_load_all(harness.webhook_configurations(cluster, webhook.url,
                                                                          webhook.ca_file)) if d]
    if not match:
        for d in docs:
            for hook in d.get("webhooks") or []:
                hook.pop("matchConditions", None)
    elif not any("matchConditions" in h for d in docs for h in d.get("webhooks") or []):
        raise RuntimeError("the chart rendered no matchConditions for the mutating webhook")
    return yaml.safe_dump_all(docs)


class PeerRound:
    """Start a peer, wait until it mutates a probe, and stop it again."""

    def __init__(self, label: str, cluster: harness.Cluster, workdir: Path) -> None:
        if label not in PEER_ROUNDS:
            raise ValueError(f"unknown peer round {label!r}")
        self.label = label
        self.cluster = cluster
        self.workdir = workdir
        self.process: harness.ManagedProcess | None = None
        self.objects: list[dict[str, Any]] = []

    def start(self, probe_namespace: str) -> harness.ManagedProcess | None:
        cluster, label = self.cluster, self.label
        if label == "map":
            self.objects = policies.mutating_admission_policy()
            peers.apply_objects(cluster, self.objects)
        elif label.startswith("kyverno"):
            kyverno = peers.start_kyverno(cluster, self.workdir / label, peers.kyverno_dir())
            self.process = kyverno.process
            policy = (policies.kyverno_cluster_policy() if label == "kyverno-cpol"
                      else policies.kyverno_mutating_policy())
            self.objects = [policy]
            peers.apply_objects(cluster, self.objects)
        else:
            # --idle-timeout above the API server's 90 s (see bench/floor.py IDLE_SECONDS).
            webhook = harness.start_webhook(self.workdir / label, kubeconfig=cluster.kubeconfig,
                                            extra_args=["--log-level", "warning", "--idle-timeout", "120"])
            self.process = webhook.process
            harness.wait_until("envelope /readyz", lambda: harness.https_get(
                f"{webhook.url}/readyz", harness.tls_context(webhook.ca_file), timeout=2)[0] == 200,
                webhook.process, 60)
            cluster.apply(_envelope_configurations(cluster, webhook, match=label == "envelope-mc"))
        peers.wait_mutates(cluster, probe_namespace, timed_deployment(), label, self.process)
        return self.process

    def stop(self) -> None:
        if self.label.startswith("envelope"):
            harness.unregister_webhook(self.cluster)
        else:
            peers.delete_objects(self.cluster, self.objects)
        if self.label.startswith("kyverno"):
            peers.delete_kyverno_webhooks(self.cluster)
        if self.process is not None:
            self.process.stop()
        if self.label.startswith("kyverno"):
            peers.delete_kyverno_webhooks(self.cluster)  # in case it re-registered while stopping
        time.sleep(2)  # the API server drops configurations asynchronously
