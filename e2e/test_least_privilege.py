"""What the chart's ServiceAccount may do, judged by the real 1.37 API server (issue 38,
class 6): installed with helm (self certificates, safeInstall, inTree with the namespace
fact), then acting as the ServiceAccount with a token the API server issued for it:

- RBAC grants it exactly the writes Envelope makes (a SelfSubjectRulesReview compared
  with a plain ServiceAccount's, in the release namespace and in another one): any
  other write verb, resource or name fails the test;
- the writes Envelope makes succeed: the fact label set to ``clear`` and removed (a
  merge patch as field manager envelope-facts, app/intree/facts.py), each webhook's
  failurePolicy raised (app/serve/failurepolicy.py) and its caBundle replaced (app/serve/certs.py);
- everything else those grants would allow is refused by the chart's
  ValidatingAdmissionPolicy (templates/privileges.yaml), with its message: another label
  (``pod-security.kubernetes.io/enforce=privileged``), another value of the fact label,
  a finalizer, an annotation on kube-system, a rule on secrets, a new URL, a new
  webhook or annotation on its own webhook configurations; and RBAC refuses
  the rest (another webhook configuration, delete, a subresource)."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

import harness
from app.intree import FACT_LABEL, FACT_VALUE
from app.intree.facts import FIELD_MANAGER
from harness import Cluster

pytestmark = pytest.mark.e2e

NS, RELEASE = "lp-system", "lp"
NAME = f"{RELEASE}-envelope"
SCOPE_LABEL = "envelope.test/least-privilege"
MERGE = "application/merge-patch+json"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind",
               "impersonate", "approve", "sign", "*"}


class As:
    """REST calls with a bearer token (no client certificate)."""

    def __init__(self, cluster: Cluster, token: str) -> None:
        self.url = cluster.api_url
        self.token = token
        self.ctx = ssl.create_default_context(cafile=str(cluster.pki.serving_ca))

    def __call__(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json") -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            text = err.read()
            try:
                return err.code, json.loads(text)
            except ValueError:
                return err.code, text.decode(errors="replace")


def _token(cluster: Cluster, sa: str) -> str:
    return cluster.kubectl("create", "token", sa, "-n", NS, "--duration=1h").stdout.strip()


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[tuple[As, As]]:
    """The chart installed (nothing runs: no node); (the chart's ServiceAccount, a plain
    ServiceAccount of the same namespace)."""
    selector = json.dumps([{"key": harness.ISOLATED_NAMESPACE_LABEL, "operator": "Exists"},
                           {"key": SCOPE_LABEL, "operator": "Exists"}])
    cluster.helm(
        "install", RELEASE, str(harness.CHART_DIR), "--set", "image.local=true", "-n", NS,
        "--create-namespace", "--set", "webhooks.url=https://127.0.0.1:9",
        "--set", "certificates.extraSANs={127.0.0.1}", "--set", "inTree.enabled=true",
        "--set", "webhooks.safeInstall=true", "--set", "certificates.mode=self",
        "--set-json", f"webhooks.namespaceSelectorExpressions={selector}")
    try:
        assert cluster.kubectl("get", "validatingadmissionpolicybinding",
                               f"{NAME}-privileges.envelope.io", check=False).returncode == 0, \
            "the chart rendered no privileges policy"
        cluster.kubectl("create", "serviceaccount", "plain", "-n", NS)
        sa = As(cluster, _token(cluster, NAME))
        _wait_for_policy(sa)
        yield sa, As(cluster, _token(cluster, "plain"))
    finally:
        cluster.helm("uninstall", RELEASE, "-n", NS, check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def _wait_for_policy(sa: As, timeout: float = 60.0) -> None:
    """Wait until the API server enforces the privileges policy: a new
    ValidatingAdmissionPolicy and its binding take effect only once the API server's
    policy informers have synced and it has compiled them (a refresh every second,
    longer under load — a CI run saw every write of the tests allowed). Probed with a
    dry-run label write the policy refuses, so nothing is stored."""
    path = f"/api/v1/namespaces/{NS}?dryRun=All&fieldManager={FIELD_MANAGER}"
    deadline = time.monotonic() + timeout
    while True:
        status, body = sa("PATCH", path, {"metadata": {"labels": {SCOPE_LABEL: "probe"}}}, MERGE)
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        if status in (403, 422) and "envelope-privileges" in message:
            return
        assert time.monotonic() < deadline, \
            f"the privileges policy was not enforced {timeout:.0f} s after install: {status} {message[:200]}"
        time.sleep(0.5)


def _rules(who: As, namespace: str) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, resourceName or '*') the caller may use in ``namespace``."""
    status, body = who("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace}})
    assert status == 201, body
    out = set()
    for rule in body["status"]["resourceRules"]:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or ["*"]:
                        out.add((group, resource, verb, name))
    return out


def test_rbac_grants_exactly_the_writes_envelope_makes(cluster: Cluster,
                                                       installed: tuple[As, As]) -> None:
    sa, plain = installed
    other = harness.unique_name("e2e-lp-other", max_length=50)
    cluster.create_namespace(other, labels={harness.ISOLATED_NAMESPACE_LABEL: "true"})
    expected_cluster_wide = {
        ("", "namespaces", "patch", "*"),
        *{("admissionregistration.k8s.io", r, "update", NAME)
          for r in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")},
    }
    expected_here = expected_cluster_wide | {
        ("", "secrets", "create", "*"), ("", "secrets", "update", f"{NAME}-tls"),
        ("coordination.k8s.io", "leases", "create", "*"),
        ("coordination.k8s.io", "leases", "update", f"{NAME}-leader"),
        ("coordination.k8s.io", "leases", "update", f"{NAME}-leader-facts"),
    }
    for namespace, expected in ((other, expected_cluster_wide), (NS, expected_here)):
        extra = _rules(sa, namespace) - _rules(plain, namespace)
        writes = {r for r in extra if r[2] in WRITE_VERBS}
        assert writes == expected, (namespace, sorted(writes ^ expected))
        secrets = {r for r in extra if r[1] == "secrets" and r[2] not in WRITE_VERBS}
        assert secrets <= {("", "secrets", "get", f"{NAME}-tls")}, sorted(secrets)


def _refused(answer: tuple[int, Any], by_policy: bool = True) -> str:
    status, body = answer
    message = body.get("message", "") if isinstance(body, dict) else str(body)
    assert status in (403, 422), f"allowed ({status}): {str(message or body)[:300]}"
    if by_policy:  # RBAC allows it: the chart's policy is what refuses
        assert "envelope-privileges" in message, message
    return message


def test_namespace_writes_only_the_fact_label(cluster: Cluster, installed: tuple[As, As]) -> None:
    sa, _ = installed
    ns = harness.unique_name("e2e-lp", max_length=50)
    cluster.create_namespace(ns, labels={harness.ISOLATED_NAMESPACE_LABEL: "true", "team": "a"})
    path = f"/api/v1/namespaces/{ns}?fieldManager={FIELD_MANAGER}"

    def label(value: str | None, key: str = FACT_LABEL, where: str = path) -> tuple[int, Any]:
        return sa("PATCH", where, {"metadata": {"labels": {key: value}}}, MERGE)

    # what the keeper writes
    status, body = label(FACT_VALUE)
    assert status == 200 and body["metadata"]["labels"][FACT_LABEL] == FACT_VALUE, body.get("message")
    status, body = label(None)
    assert status == 200 and FACT_LABEL not in body["metadata"]["labels"], body
    # everything else
    _refused(label("privileged", "pod-security.kubernetes.io/enforce"))
    _refused(label("restricted", "team"))
    _refused(label(None, "team"))
    _refused(label("forged"))
    _refused(sa("PATCH", path, {"metadata": {"finalizers": ["example.com/hold"]}}, MERGE))
    _refused(sa("PATCH", path, {"metadata": {"annotations": {"a": "b"}}}, MERGE))
    _refused(sa("PATCH", "/api/v1/namespaces/kube-system",
                {"metadata": {"annotations": {"owned-by": "envelope"}}}, MERGE))
    _refused(sa("PATCH", path, {"metadata": {"labels": {FACT_LABEL: FACT_VALUE, "x": "y"}}}, MERGE))
    _refused(sa("PATCH", path, {"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "Namespace", "name": NS, "uid": "0"}]}}, MERGE))
    # RBAC: no create, delete or subresource
    _refused(sa("DELETE", f"/api/v1/namespaces/{ns}"), by_policy=False)
    _refused(sa("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ns + "-new"}}), by_policy=False)
    current = cluster.kubectl_json("get", "namespace", ns)
    _refused(sa("PUT", f"/api/v1/namespaces/{ns}/finalize", current), by_policy=False)
    stored = cluster.kubectl_json("get", "namespace", ns)["metadata"]
    assert stored["labels"] == {harness.ISOLATED_NAMESPACE_LABEL: "true", "team": "a",
                                "kubernetes.io/metadata.name": ns}, stored["labels"]
    assert not stored.get("annotations") and not stored.get("finalizers"), stored
    assert "owned-by" not in (cluster.kubectl_json("get", "namespace", "kube-system")[
        "metadata"].get("annotations") or {})


def _config(sa: As, resource: str, name: str = NAME) -> tuple[str, dict[str, Any]]:
    path = f"/apis/admissionregistration.k8s.io/v1/{resource}/{name}"
    status, body = sa("GET", path)
    assert status == 200, body
    return path, body


@pytest.mark.parametrize("resource", ["mutatingwebhookconfigurations",
                                      "validatingwebhookconfigurations"])
def test_webhook_configuration_writes_only_failure_policy_and_ca(
        cluster: Cluster, installed: tuple[As, As], resource: str) -> None:
    sa, _ = installed
    path, config = _config(sa, resource)
    assert config["webhooks"], config
    # what the failure-policy raiser and the CA injection write
    raised = copy.deepcopy(config)
    for hook in raised["webhooks"]:
        hook["failurePolicy"] = "Fail" if hook.get("failurePolicy") == "Ignore" else "Ignore"
        hook["clientConfig"]["caBundle"] = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n"
                                                            b"MA==\n-----END CERTIFICATE-----\n").decode()
    status, body = sa("PUT", path, raised)
    assert status == 200, body.get("message")
    _, config = _config(sa, resource)

    def changed(edit: Any) -> tuple[int, Any]:
        body = copy.deepcopy(config)
        edit(body)
        return sa("PUT", path, body)

    secrets = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
               "resources": ["secrets"], "scope": "*"}
    _refused(changed(lambda c: c["webhooks"][0]["rules"].append(secrets)))
    _refused(changed(lambda c: c["webhooks"][0]["clientConfig"].update(
        url="https://attacker.example:443/collect")))
    _refused(changed(lambda c: c["webhooks"][0].update(namespaceSelector={})))
    _refused(changed(lambda c: c["webhooks"][0].update(timeoutSeconds=29)))
    _refused(changed(lambda c: c["webhooks"][0].pop("matchConditions", None)
                     or c["webhooks"][0].update(matchConditions=[
                         {"name": "all", "expression": "true"}])))
    _refused(changed(lambda c: c["webhooks"].append({**copy.deepcopy(c["webhooks"][0]),
                                                      "name": "extra.envelope.io"})))
    _refused(changed(lambda c: c["webhooks"].pop()))
    _refused(changed(lambda c: c["metadata"].setdefault("annotations", {}).update(
        {"envelope.io/failure-policies": "{}"})))
    _refused(changed(lambda c: c["metadata"].setdefault("labels", {}).update(x="y")))
    # RBAC: not deleted, not created, no other configuration
    _refused(sa("DELETE", path), by_policy=False)
    _refused(sa("POST", f"/apis/admissionregistration.k8s.io/v1/{resource}", {
        **{k: v for k, v in config.items() if k != "metadata"},
        "metadata": {"name": "envelope-forged"}}), by_policy=False)
    other = f"e2e-lp-other-{resource[:4]}"
    status, body = cluster.api("POST", f"/apis/admissionregistration.k8s.io/v1/{resource}", {
        "apiVersion": config["apiVersion"], "kind": config["kind"], "metadata": {"name": other},
        "webhooks": [{**h, "failurePolicy": "Ignore"} for h in config["webhooks"]]})
    assert status == 201, body
    try:
        status, body = sa("GET", f"/apis/admissionregistration.k8s.io/v1/{resource}/{other}")
        _refused((status, body), by_policy=False)
    finally:
        cluster.kubectl("delete", resource, other, check=False)
    _, after = _config(sa, resource)
    assert [h["clientConfig"].get("url") for h in after["webhooks"]] == \
        [h["clientConfig"].get("url") for h in config["webhooks"]]
    assert [h["rules"] for h in after["webhooks"]] == [h["rules"] for h in config["webhooks"]]
