"""One set-up per peer round, shared by bench/apiserver.py and bench/peers/same_answer.py.

Labels:
- ``map``: the MutatingAdmissionPolicy + binding (in the API server, no webhook);
- ``kyverno-cpol`` / ``kyverno-mpol``: Kyverno with the classic ClusterPolicy / the CEL
  MutatingPolicy (a fresh Kyverno process per round, so CPU and RSS are the round's);
- ``envelope`` / ``envelope-mc``: Envelope with the chart's configurations, without and
  with the mutating webhook's matchConditions;
- ``intree-map`` / ``envelope-intree``: what the chart's ``inTree.enabled`` runs
  (``bench/peers/intree.py``): the compiled MutatingAdmissionPolicy alone, and with
  Envelope's webhooks (the mutating one with the reduced condition). Their namespaces
  get the fact label from one run of the namespace-fact keeper (:meth:`PeerRound.prepare`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import intree
import peers
import policies
import yaml
from objects import burstable_deployment, timed_deployment

import harness

PEER_ROUNDS = ("map", "kyverno-cpol", "kyverno-mpol", "envelope", "envelope-mc", *intree.INTREE_ROUNDS)


def _chart_configurations(cluster: harness.Cluster, url: str, ca_file: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(harness.webhook_configurations(cluster, url, ca_file)) if d]


def _envelope_configurations(cluster: harness.Cluster, webhook: harness.Webhook, *, match: bool) -> str:
    docs = _chart_configurations(cluster, webhook.url, webhook.ca_file)
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
        self.webhooks = False

    @property
    def in_tree(self) -> bool:
        return self.label in intree.INTREE_ROUNDS

    def prepare(self, namespaces: Sequence[str]) -> None:
        """Before writes in ``namespaces`` (made since the round started): for the
        in-tree rounds, their namespace fact, written by one keeper round (every namespace
        without a LimitRange or ResourceQuota gets it, as a keeper beside the chart would
        give it), and a wait until the API server's policy answers there."""
        if not self.in_tree:
            return
        intree.label_namespaces(self.cluster.kubeconfig)
        for ns in namespaces:
            peers.wait_in_tree(self.cluster, ns, burstable_deployment(), self.label, self.process)

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
        elif label == "intree-map":
            # no webhook: the chart's configurations only for their namespaceSelector
            ca_file = harness.make_serving_cert(self.workdir / label, ("127.0.0.1",), name="unused")[0]
            setup = intree.InTreeSetup(label, _chart_configurations(cluster, "https://127.0.0.1:1", ca_file))
            self.objects = setup.manifests
            peers.apply_objects(cluster, self.objects)
        else:
            webhook = self._start_envelope()
            if label == "envelope-intree":
                docs = _chart_configurations(cluster, webhook.url, webhook.ca_file)
                setup = intree.InTreeSetup(label, docs)
                self.objects = setup.manifests
                peers.apply_objects(cluster, self.objects)
                peers.apply_objects(cluster, setup.webhooks)
            else:
                cluster.apply(_envelope_configurations(cluster, webhook, match=label == "envelope-mc"))
            self.webhooks = True
        if self.in_tree:
            # the probe is in the policy's domain (the timed Deployment is not: objects.py)
            self.prepare([probe_namespace])
        else:
            peers.wait_mutates(cluster, probe_namespace, timed_deployment(), label, self.process)
        return self.process

    def _start_envelope(self) -> harness.Webhook:
        # --idle-timeout above the API server's 90 s (see bench/floor.py IDLE_SECONDS).
        webhook = harness.start_webhook(self.workdir / self.label, kubeconfig=self.cluster.kubeconfig,
                                        extra_args=["--log-level", "warning", "--idle-timeout", "120"])
        self.process = webhook.process
        harness.wait_until("envelope /readyz", lambda: harness.https_get(
            f"{webhook.url}/readyz", harness.tls_context(webhook.ca_file), timeout=2)[0] == 200,
            webhook.process, 60)
        return webhook

    def stop(self) -> None:
        if self.webhooks:
            harness.unregister_webhook(self.cluster)
        peers.delete_objects(self.cluster, self.objects)
        if self.label.startswith("kyverno"):
            peers.delete_kyverno_webhooks(self.cluster)
        if self.process is not None:
            self.process.stop()
        if self.label.startswith("kyverno"):
            peers.delete_kyverno_webhooks(self.cluster)  # in case it re-registered while stopping
        time.sleep(2)  # the API server drops configurations asynchronously
