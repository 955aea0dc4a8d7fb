"""KEP-6060 caller tokens end to end, on a kube-apiserver that issues them.

The API server is ``TOKEN_KUBERNETES_VERSION`` from e2e/controlplane/versions.env
(v1.37.2, the first release with the alpha gate ``APIServerWebhookAuthenticationToken``),
built on first use; etcd and kubectl are the pinned ones. It mints webhook-bound tokens
through the TokenRequest API. It does not present them on its own admission calls yet
(k8s.io/apiserver v0.37.2 only sends what the AdmissionConfiguration kubeconfig names
for the webhook's host), so a minted token is delivered the way an operator can today:
a ``tokenFile`` in that kubeconfig, one user per host. The mutating and validating
webhooks are registered under two host names (127.0.0.1 and localhost) so each gets
the token bound to its own configuration.

Envelope runs ``--caller-token enforce`` and reads the issuer, the JWKS and its two
configurations from the same API server. What passes and what is refused is decided by
the real issuer's tokens; nothing here signs a token itself.

Marked to run last (e2e/conftest.py), so ``make test`` has built that kube-apiserver in
the background by then.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import harness
from app.serve.callerauth import audience_of
from harness import Cluster

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "e2e" / "controlplane" / "build.sh"
LABEL = "envelope.test/caller-token"
CONFIG = "envelope-token-e2e"
CALLER = "webhook-caller"  # the service account the tokens are issued to

pytestmark = pytest.mark.last


def _token_version() -> str:
    for line in (ROOT / "e2e" / "controlplane" / "versions.env").read_text().splitlines():
        if line.startswith("TOKEN_KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("versions.env has no TOKEN_KUBERNETES_VERSION")


def _default_version() -> str:
    for line in (ROOT / "e2e" / "controlplane" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("versions.env has no KUBERNETES_VERSION")


def _token_apiserver() -> Path:
    """The 1.37 kube-apiserver binary, built (once, cached) by build.sh: the default
    control plane's own when the default is that version, else built on its own."""
    env = dict(os.environ)
    if _token_version() != _default_version():
        env["ENVELOPE_CONTROLPLANE_APISERVER_ONLY"] = _token_version()
    done = subprocess.run(["bash", str(BUILD)], env=env, stdout=subprocess.PIPE, text=True,
                          timeout=3600, check=True)
    return Path(done.stdout.strip().splitlines()[-1]) / "kube-apiserver"


@dataclass
class Setup:
    cluster: Cluster
    webhook: harness.Webhook
    namespace: str
    hosts: dict[str, str]  # configuration kind -> base URL it is registered under
    token_files: dict[str, Path]


def _rules(*groups: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "apiVersions": ["v1"], "resources": [resource],
             "operations": ["CREATE"]} for group, resource in groups]


def _configuration(kind: str, url: str, ca: bytes, name: str = CONFIG,
                   groups: tuple[tuple[str, str], ...] = (("", "pods"),)) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": f"{kind.lower()}.token.envelope.test", "admissionReviewVersions": ["v1"],
        "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
        "namespaceSelector": {"matchLabels": {LABEL: "true"}},
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
        "rules": _rules(*groups)}
    if kind == "MutatingWebhookConfiguration":
        hook["reinvocationPolicy"] = "IfNeeded"
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name}, "webhooks": [hook]}


def mint(cluster: Cluster, audience: str, *, kind: str | None = "ValidatingWebhookConfiguration",
         name: str = CONFIG, group: str | None = "*") -> tuple[int, Any]:
    """POST a TokenRequest for the caller service account; (status, token or Status)."""
    spec: dict[str, Any] = {"audiences": [audience], "expirationSeconds": 600}
    if kind is not None:
        spec["boundObjectRef"] = {"kind": kind, "apiVersion": "admissionregistration.k8s.io/v1",
                                  "name": name}
    if group is not None:
        spec["attestations"] = {"admissionReviewAPIGroups": [group]}
    status, body = cluster.api(
        "POST", f"/api/v1/namespaces/kube-system/serviceaccounts/{CALLER}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    if status == 201:
        return status, body["status"]["token"]
    return status, body


@pytest.fixture(scope="module")
def setup(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("caller-token")
    bin_dir = work / "bin"  # the 1.37 API server with the pinned etcd and kubectl
    bin_dir.mkdir()
    (bin_dir / "kube-apiserver").symlink_to(_token_apiserver())
    for tool in ("etcd", "kubectl", "helm"):
        (bin_dir / tool).symlink_to(controlplane_bin_dir / tool)

    port = harness.free_port()
    hosts = {"MutatingWebhookConfiguration": f"https://127.0.0.1:{port}",
             "ValidatingWebhookConfiguration": f"https://localhost:{port}"}
    token_files = {kind: work / f"{kind}.token" for kind in hosts}
    for path in token_files.values():
        path.write_text("not-minted-yet")
    # One kubeconfig user per webhook host: k8s.io/apiserver looks up u.Host first.
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [],
                  "users": [{"name": url.removeprefix("https://"),
                             "user": {"tokenFile": str(token_files[kind])}}
                            for kind, url in hosts.items()]}
    kubeconfig_file = work / "webhook-kubeconfig.yaml"
    kubeconfig_file.write_text(yaml.safe_dump(kubeconfig))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig_file)}
    admission = work / "admission-config.yaml"
    admission.write_text(yaml.safe_dump(
        {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
         "plugins": [{"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                     {"name": "MutatingAdmissionWebhook", "configuration": plugin}]}))
    cluster = harness.start_control_plane(
        work / "cp", bin_dir,
        apiserver_args=[f"--admission-control-config-file={admission}",
                        "--feature-gates=APIServerWebhookAuthenticationToken=true"])
    webhook: harness.Webhook | None = None
    try:
        version = json.loads(cluster.get_raw("/version")[1])["gitVersion"]
        assert version == _token_version(), version
        # The caller: may attest any API group ("*"), as kube-apiserver's own would.
        for manifest in (
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": CALLER, "namespace": "kube-system"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "envelope-e2e-attest"},
             "rules": [{"apiGroups": ["authentication.k8s.io"],
                        "resources": ["admissionReviewAPIGroups"], "verbs": ["attest"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "envelope-e2e-attest"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "envelope-e2e-attest"},
             "subjects": [{"kind": "ServiceAccount", "name": CALLER, "namespace": "kube-system"}]},
        ):
            cluster.apply(manifest)
        webhook = harness.start_webhook(
            work / "webhook", port=port,
            extra_args=["--cluster-view", "none", "--kubeconfig", str(cluster.kubeconfig),
                        "--caller-token", "enforce",
                        "--validating-webhook-configuration", CONFIG,
                        "--mutating-webhook-configuration", CONFIG])
        ca = webhook.ca_file.read_bytes()
        cluster.apply(_configuration("MutatingWebhookConfiguration",
                                     hosts["MutatingWebhookConfiguration"] + "/mutate", ca))
        cluster.apply(_configuration("ValidatingWebhookConfiguration",
                                     hosts["ValidatingWebhookConfiguration"] + "/validate", ca,
                                     groups=(("", "pods"), ("apps", "deployments"))))
        _wait_ready(webhook)
        for kind, path in (("MutatingWebhookConfiguration", "/mutate"),
                           ("ValidatingWebhookConfiguration", "/validate")):
            status, token = mint(cluster, hosts[kind] + path, kind=kind)
            assert status == 201, token
            token_files[kind].write_text(token)
        ns = harness.unique_name("e2e-token", max_length=40)
        cluster.create_namespace(ns, labels={LABEL: "true"})
        yield Setup(cluster, webhook, ns, hosts, token_files)
    finally:
        if webhook is not None:
            webhook.stop()
        cluster.stop()


def _wait_ready(webhook: harness.Webhook, timeout: float = 60.0) -> None:
    """/readyz is 200 once the issuer and the keys are read; the configurations, made
    after Envelope started, are read again every 5 s until both are there (its log)."""
    context = ssl.create_default_context(cafile=str(webhook.ca_file))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        status, last = harness._https_get(f"{webhook.url}/readyz", context, timeout=5)
        if status == 200 and any(
                '"paths":["/mutate","/validate"],"missing":[]' in line
                for line in webhook.log_path.read_text().splitlines()):
            return
        time.sleep(0.5)
    raise AssertionError(f"Envelope never read both configurations: {last}\n"
                         f"{webhook.log_path.read_text()[-3000:]}")


def _review(group: str = "", kind: str = "Pod", resource: str = "pods") -> dict[str, Any]:
    obj = {"apiVersion": f"{group}/v1" if group else "v1", "kind": kind,
           "metadata": {"name": "x", "namespace": "default"}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "direct-1", "operation": "CREATE",
                        "kind": {"group": group, "version": "v1", "kind": kind},
                        "resource": {"group": group, "version": "v1", "resource": resource},
                        "namespace": "default", "object": obj}}


def direct(setup: Setup, path: str, token: str | None,
           review: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """POST a review straight to Envelope, as a caller other than the API server."""
    context = ssl.create_default_context(cafile=str(setup.webhook.ca_file))
    body = json.dumps(review or _review()).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n")
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    with (socket.create_connection(("127.0.0.1", setup.webhook.port), timeout=10) as raw,
          context.wrap_socket(raw, server_hostname="127.0.0.1") as tls):
        tls.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    header, _, payload = data.partition(b"\r\n\r\n")
    return int(header.split()[1]), json.loads(payload)


def _pod(ns: str, name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                       "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                                "resources": {"limits": {"cpu": "2",
                                                                         "memory": "64Mi"}}}]}})


def test_the_api_server_presenting_minted_tokens_is_served(setup: Setup) -> None:
    out = setup.cluster.kubectl("create", "--dry-run=server", "-f", "-", "-o", "json",
                                input=_pod(setup.namespace, "token-probe"))
    resources = json.loads(out.stdout)["spec"]["containers"][0]["resources"]
    # Mutated (so /mutate took the mutating token) and admitted by /validate (its token).
    assert "cpu" not in resources.get("limits", {}), resources
    assert resources["requests"]["memory"] == "64Mi", resources
    metrics = _metrics(setup)
    assert 'envelope_caller_tokens_total{mode="enforce",result="valid"}' in metrics


def _metrics(setup: Setup) -> str:
    import urllib.request
    with urllib.request.urlopen(f"{setup.webhook.metrics_url}/metrics", timeout=10) as resp:
        return resp.read().decode()


def _refused(setup: Setup, audience: str, reason: str, **how: Any) -> None:
    """A token the API server mints (``mint(..., **how)``) is refused on /validate."""
    code, token = mint(setup.cluster, audience, **how)
    assert code == 201, token
    status, body = direct(setup, "/validate", token)
    assert status == 401 and f"({reason})" in body["error"], body


def test_a_caller_without_a_token_gets_401(setup: Setup) -> None:
    status, body = direct(setup, "/validate", None)
    assert status == 401 and "(missing)" in body["error"], body
    # a plain service-account token (the API server's own audience, no webhook binding)
    _refused(setup, "https://127.0.0.1", "not-webhook-bound", kind=None, group=None)


def test_tokens_for_another_webhook_or_address_are_refused(setup: Setup) -> None:
    validate = setup.hosts["ValidatingWebhookConfiguration"] + "/validate"
    # bound to the mutating configuration, presented on /validate
    _refused(setup, validate, "configuration", kind="MutatingWebhookConfiguration")
    # bound to somebody else's configuration
    other = _configuration("ValidatingWebhookConfiguration", "https://10.0.0.9:443/validate",
                           setup.webhook.ca_file.read_bytes(), name="someone-else")
    other["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"nothing": "matches"}}
    setup.cluster.apply(other)
    _refused(setup, validate, "configuration", name="someone-else")
    # "*" tokens skip the audience check at issuance; Envelope still checks it
    _refused(setup, "https://attacker.example/validate", "audience")


def test_an_attested_group_is_held_to_the_review(setup: Setup) -> None:
    validate = setup.hosts["ValidatingWebhookConfiguration"] + "/validate"
    # The API server refuses to attest a group our webhook has no rule for ...
    code, refused = mint(setup.cluster, validate, group="batch")
    assert code == 403, refused
    # ... and to attest one for an audience that is not our webhook's address.
    code, refused = mint(setup.cluster, "https://attacker.example/validate", group="apps")
    assert code == 403, refused
    code, token = mint(setup.cluster, validate, group="apps")
    assert code == 201, token
    status, body = direct(setup, "/validate", token, _review("apps", "Deployment", "deployments"))
    assert status == 200 and body["response"]["uid"] == "direct-1", body
    status, body = direct(setup, "/validate", token)  # a Pod: core group
    assert status == 403 and "(api-group)" in body["error"], body
    # a Pod review that claims the apps resource group: the kind's group counts too
    forged = _review("apps", "Deployment", "deployments")
    forged["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    status, body = direct(setup, "/validate", token, forged)
    assert status == 403 and "(api-group)" in body["error"], body


def test_a_recreated_configuration_ends_its_old_tokens(setup: Setup) -> None:
    kind = "ValidatingWebhookConfiguration"
    validate = setup.hosts[kind] + "/validate"
    code, old = mint(setup.cluster, validate)
    assert code == 201, old
    assert direct(setup, "/validate", old)[0] == 200
    status, current = setup.cluster.api(
        "GET", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{CONFIG}")
    assert status == 200
    setup.cluster.api("DELETE",
                      f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{CONFIG}")
    recreated = {k: v for k, v in current.items() if k != "metadata"}
    recreated["metadata"] = {"name": CONFIG}
    status, made = setup.cluster.api(
        "POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", recreated)
    assert status == 201 and made["metadata"]["uid"] != current["metadata"]["uid"], made
    code, new = mint(setup.cluster, validate)
    assert code == 201, new
    # The new configuration's token makes Envelope read its configurations again (at
    # most every ten seconds) ...
    deadline = time.monotonic() + 30
    while (status := direct(setup, "/validate", new)[0]) != 200 and time.monotonic() < deadline:
        time.sleep(1)
    assert status == 200
    # ... after which the deleted configuration's tokens are refused.
    status, body = direct(setup, "/validate", old)
    assert status == 401 and "(configuration-uid)" in body["error"], body
    setup.token_files[kind].write_text(new)  # keep the API server's own calls working


@pytest.mark.parametrize("service", [
    {"name": "envelope", "namespace": "envelope-system", "path": "/validate"},
    {"name": "envelope", "namespace": "envelope-system", "port": 8443, "path": "/validate/"},
    {"name": "envelope", "namespace": "envelope-system"},
])
def test_the_service_audience_is_the_one_the_api_server_requires(setup: Setup,
                                                                  service: dict[str, Any]) -> None:
    """For a named group the API server mints only for the webhook's own audience; it must
    accept ours (``audience_of``) and refuse the near misses."""
    name = f"svc-audience-{service.get('port', 443)}-{len(service)}"
    config = _configuration("ValidatingWebhookConfiguration", "https://unused", b"", name=name,
                            groups=(("apps", "deployments"),))
    hook = config["webhooks"][0]
    hook["clientConfig"] = {"service": service}
    hook["namespaceSelector"] = {"matchLabels": {"nothing": "matches"}}
    setup.cluster.apply(config)
    ours = audience_of({"service": service})
    assert ours is not None
    code, token = mint(setup.cluster, ours, name=name, group="apps")
    assert code == 201, (ours, token)
    without_port = ours.replace(f":{service.get('port', 443)}", "")
    for wrong in (without_port, ours.rstrip("/") + "/x", ours.replace("https://", "http://")):
        code, body = mint(setup.cluster, wrong, name=name, group="apps")
        assert code == 403, (wrong, body)
