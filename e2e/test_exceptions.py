"""Delegated exceptions on the real API server (issue 35, point 3): the chart's
EnvelopeException CRD and ClusterRoles (templates/exceptions.yaml, rendered by helm with
``exceptions.enabled=true``), aggregated into the built-in ``admin`` and ``view`` roles by
kube-controller-manager's clusterrole-aggregation controller, and the webhook
(``python -m app serve``, live cluster view) with a policy that delegates
``memory-request-equals-limit`` only. Two users, each acting through the API server's
impersonation (RBAC judges them, not the admin's certificate):

- ``ns-admin``, bound to ``admin`` in namespace A only: a Deployment refused for its memory
  request is admitted once they create an exception for it in A (the webhook learns it
  from its watch), with a warning naming the exception, and ``envelope audit``'s
  PolicyReport has it as a skip naming the exception; refused again once it is deleted;
  an exception naming a rule the platform does not delegate is refused by the webhook with
  the rule and the allowed ones; one in namespace B is forbidden by RBAC;
- ``ns-viewer``, bound to ``view`` in A: may read exceptions, may not create one (RBAC 403).

A control plane of its own (etcd, kube-apiserver, kube-controller-manager with the
aggregation controller): aggregation edits the cluster's built-in roles, which the session
API server's other tests must not see."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import harness
from harness import Cluster

pytestmark = pytest.mark.e2e

RULE = "memory-request-equals-limit"
POLICY = f"delegatedExceptions:\n  allowedRules: [{RULE}]\n  namespaces: ['*']\n"
SCOPE = "envelope.test/exceptions"
ADMIN, VIEWER = "ns-admin", "ns-viewer"


@dataclass
class Env:
    cluster: Cluster
    a: str
    b: str
    policy: Path


def _configurations(webhook: harness.Webhook) -> list[dict[str, Any]]:
    client = {"caBundle": base64.b64encode(webhook.ca_file.read_bytes()).decode()}
    common = {"admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
              "timeoutSeconds": 10, "namespaceSelector": {"matchLabels": {SCOPE: "true"}}}
    deployments = {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"],
                   "operations": ["CREATE", "UPDATE"]}
    exceptions = {"apiGroups": ["envelope.io"], "apiVersions": ["v1alpha1"],
                  "resources": ["envelopeexceptions"], "operations": ["CREATE", "UPDATE"]}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "envelope-exceptions-e2e"},
         "webhooks": [{"name": "mutate.exceptions.envelope.test", "rules": [deployments],
                       "clientConfig": {**client, "url": f"{webhook.url}/mutate"}, **common}]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "envelope-exceptions-e2e"},
         "webhooks": [{"name": "validate.exceptions.envelope.test",
                       "rules": [deployments, exceptions],
                       "clientConfig": {**client, "url": f"{webhook.url}/validate"}, **common}]},
    ]


def _binding(namespace: str, user: str, role: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}


@pytest.fixture(scope="module")
def env(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    work = tmp_path_factory.mktemp("exceptions")
    cluster = harness.start_control_plane(work / "cp", controlplane_bin_dir)
    procs: list[Any] = []
    try:
        procs.append(harness.start_controller_manager(
            cluster, work / "kcm", ("clusterrole-aggregation-controller", "resourcequota-controller")))
        rendered = cluster.helm("template", "exc", str(harness.CHART_DIR), "--set", "image.local=true",
                                "--set", "exceptions.enabled=true",
                                "--show-only", "templates/exceptions.yaml").stdout
        cluster.apply(rendered)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/envelopeexceptions.envelope.io", timeout=70)
        a, b = "team-a", "team-b"
        for ns in (a, b):
            cluster.create_namespace(ns, labels={SCOPE: "true"})
        for obj in (_binding(a, ADMIN, "admin"), _binding(b, ADMIN, "view"),
                    _binding(a, VIEWER, "view")):
            cluster.apply(obj)
        (work / "policy.yaml").write_text(POLICY)
        webhook = harness.start_webhook(work / "webhook", kubeconfig=cluster.kubeconfig,
                                        extra_args=["--config", str(work / "policy.yaml"),
                                                    "--cluster-view", "live", "--staleness", "5"])
        procs.append(webhook)
        for obj in _configurations(webhook):
            cluster.apply(obj)
        yield Env(cluster, a, b, work / "policy.yaml")
    finally:
        for proc in reversed(procs):
            proc.stop()
        cluster.stop()


def _as(env: Env, user: str, *args: str, input: str | None = None) -> tuple[int, str]:
    done = env.cluster.kubectl(f"--as={user}", *args, input=input, check=False)
    return done.returncode, done.stdout + done.stderr


def _deployment(namespace: str, name: str = "grafana") -> str:
    labels = {"app": name}
    return json.dumps({"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": name, "namespace": namespace},
                       "spec": {"selector": {"matchLabels": labels}, "template": {
                           "metadata": {"labels": labels},
                           "spec": {"containers": [{
                               "name": "grafana", "image": "grafana/grafana:12.1.0",
                               "resources": {"requests": {"memory": "100Mi"},
                                             "limits": {"memory": "200Mi"}}}]}}}})


def _exception(namespace: str, rules: list[str], name: str = "grafana-memory") -> str:
    return yaml.safe_dump({"apiVersion": "envelope.io/v1alpha1", "kind": "EnvelopeException",
                           "metadata": {"name": name, "namespace": namespace},
                           "spec": {"rules": rules, "match": {"kinds": ["Deployment"],
                                                              "names": ["grafana"]},
                                    "reason": "vendor chart"}})


def _until(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)


def test_a_namespace_admin_excepts_within_what_the_platform_allows(env: Env) -> None:
    a, b = env.a, env.b
    # The aggregation controller gave admin the write and view the read.
    _until("admin may create EnvelopeExceptions (aggregation)",
           lambda: _as(env, ADMIN, "auth", "can-i", "create", "envelopeexceptions.envelope.io",
                       "-n", a)[1].strip() == "yes")
    _until("view may list EnvelopeExceptions (aggregation)",
           lambda: _as(env, VIEWER, "auth", "can-i", "list", "envelopeexceptions.envelope.io",
                       "-n", a)[1].strip() == "yes")

    # Before: the namespace admin's Deployment is refused by the webhook.
    code, out = _until("the webhook answers through the API server", lambda: (
        lambda r: r if RULE in r[1] else None)(_as(env, ADMIN, "create", "--dry-run=server", "-f", "-",
                                                   input=_deployment(a))))
    assert code != 0 and "denied the request" in out, out

    # The viewer may read exceptions but not create one: RBAC, before any webhook.
    code, out = _as(env, VIEWER, "create", "-f", "-", input=_exception(a, [RULE]))
    assert code != 0 and "forbidden" in out and f'User "{VIEWER}" cannot create resource ' \
        f'"envelopeexceptions"' in out, out
    assert _as(env, VIEWER, "get", "envelopeexceptions", "-n", a)[0] == 0

    # A rule the platform does not delegate: refused by the webhook, saying which and what is.
    code, out = _as(env, ADMIN, "create", "-f", "-", input=_exception(a, [RULE, "pod-fits-node"]))
    assert code != 0 and "denied the request" in out, out
    assert "pod-fits-node is not a rule the platform lets namespaces except from" in out, out
    assert f"allowedRules allows 1 ({RULE})" in out and "[exception-allowed]" in out, out

    # The chart's CRD schema: a match that names nothing is refused by the API server.
    broad = yaml.safe_load(_exception(a, [RULE], name="everything"))
    broad["spec"]["match"] = {"kinds": ["Deployment"]}
    code, out = _as(env, ADMIN, "create", "-f", "-", input=yaml.safe_dump(broad))
    assert code != 0 and "match needs names or selector" in out, out

    # Another namespace, where the admin is only a viewer: RBAC forbids it.
    code, out = _as(env, ADMIN, "create", "-f", "-", input=_exception(b, [RULE]))
    assert code != 0 and f'User "{ADMIN}" cannot create resource "envelopeexceptions"' in out, out
    assert f'in the namespace "{b}"' in out, out

    # Within what the platform allows: created, and learnt by the webhook from its watch.
    code, out = _as(env, ADMIN, "create", "-f", "-", input=_exception(a, [RULE]))
    assert code == 0, out
    code, out = _until("the webhook honours the exception", lambda: (
        lambda r: r if r[0] == 0 else None)(_as(env, ADMIN, "create", "-f", "-",
                                                input=_deployment(a))), timeout=30)
    assert f"envelope[{RULE}]: not judged: excused by EnvelopeException {a}/grafana-memory: " \
           f"vendor chart" in out, out
    stored = env.cluster.kubectl_json("get", "deployment", "grafana", "-n", a)
    assert stored["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] == \
        {"memory": "100Mi"}
    # The audit reads the cluster's exceptions too: the stored Deployment's finding is a
    # skip naming the exception in its PolicyReport, not a failure.
    audit = subprocess.run([sys.executable, "-m", "app", "audit", "--kubeconfig",
                            str(env.cluster.kubeconfig), "--config", str(env.policy),
                            "-o", "policyreport"], capture_output=True, text=True,
                           cwd=harness.REPO_ROOT, timeout=120, check=False,
                           env={**os.environ, "PYTHONPATH": str(harness.REPO_ROOT)})
    assert audit.returncode in (0, 1), audit.stderr
    found = {(r["resources"][0]["name"], r["rule"]): r for doc in yaml.safe_load_all(audit.stdout)
             if doc and doc.get("kind") == "PolicyReport" and doc["metadata"]["namespace"] == a
             for r in doc.get("results") or []}
    assert found[("grafana", RULE)]["result"] == "skip", found
    assert found[("grafana", RULE)]["message"] == \
        f"exempt: EnvelopeException {a}/grafana-memory: vendor chart"

    # It covers what it names, nothing else.
    code, out = _as(env, ADMIN, "create", "--dry-run=server", "-f", "-",
                    input=_deployment(a, "loki"))
    assert code != 0 and RULE in out, out

    # Deleted: the webhook refuses again.
    assert _as(env, ADMIN, "delete", "deployment", "grafana", "-n", a)[0] == 0
    assert _as(env, ADMIN, "delete", "envelopeexception", "grafana-memory", "-n", a)[0] == 0
    _until("the webhook forgets the deleted exception", lambda: (
        lambda r: r[0] != 0 and RULE in r[1])(_as(env, ADMIN, "create", "--dry-run=server", "-f",
                                                  "-", input=_deployment(a))), timeout=30)
