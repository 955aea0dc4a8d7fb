"""Caller authentication (mTLS) end to end: a kube-apiserver of its own, given an
AdmissionConfiguration whose kubeconfig holds a client certificate for the webhook's
host (``127.0.0.1:<port>``, the name k8s.io/apiserver's
``defaultAuthenticationInfoResolver`` looks up first for a URL webhook), and a real
``envelope serve --client-ca-file ... --client-names kube-apiserver``.

The API server's calls are served (a ``--dry-run=server`` Pod comes back mutated);
a direct caller without a certificate, with one from another CA, or with one from the
right CA but of another name, gets no HTTP answer at all."""

from __future__ import annotations

import base64
import json
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import harness
from harness import CertificateAuthority, Cluster

LABEL = "envelope.test/mtls"
CONFIG = "envelope-mtls-e2e"


@dataclass
class Setup:
    cluster: Cluster
    webhook: harness.Webhook
    certs: dict[str, tuple[Path, Path]]
    namespace: str


def _client(ca: CertificateAuthority, cn: str, directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = ca.issue(cn, client=True)
    return harness.write_cert_and_key(cert, key, directory / f"{name}.crt", directory / f"{name}.key")


def _configurations(webhook: harness.Webhook) -> list[dict]:
    bundle = base64.b64encode(webhook.ca_file.read_bytes()).decode()
    common = {"admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
              "timeoutSeconds": 5, "namespaceSelector": {"matchLabels": {LABEL: "true"}},
              "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                         "operations": ["CREATE"]}]}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": CONFIG},
         "webhooks": [{"name": "mutate.mtls.envelope.test", "reinvocationPolicy": "IfNeeded",
                       "clientConfig": {"url": f"{webhook.url}/mutate", "caBundle": bundle},
                       **common}]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": CONFIG},
         "webhooks": [{"name": "validate.mtls.envelope.test",
                       "clientConfig": {"url": f"{webhook.url}/validate", "caBundle": bundle},
                       **common}]},
    ]


@pytest.fixture(scope="module")
def setup(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("mtls")
    client_ca = CertificateAuthority.create("envelope-e2e-webhook-client-ca")
    client_ca_file = client_ca.write(work / "client-ca.crt")
    certs = {
        "apiserver": _client(client_ca, "kube-apiserver", work, "apiserver"),
        "mallory": _client(client_ca, "mallory", work, "mallory"),
        "other-ca": _client(CertificateAuthority.create("other-ca"), "kube-apiserver", work,
                            "other-ca"),
    }
    port = harness.free_port()
    cert, key = certs["apiserver"]
    # One user per webhook host; for a URL webhook the API server looks up u.Host
    # ("127.0.0.1:<port>"), for a Service webhook "<svc>.<ns>.svc:<port>" (and, for
    # port 443, also without the port).
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [],
                  "users": [{"name": f"127.0.0.1:{port}",
                             "user": {"client-certificate": str(cert), "client-key": str(key)}}]}
    kubeconfig_file = work / "webhook-kubeconfig.yaml"
    kubeconfig_file.write_text(yaml.safe_dump(kubeconfig))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig_file)}
    admission = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
                 "plugins": [{"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                             {"name": "MutatingAdmissionWebhook", "configuration": plugin}]}
    admission_file = work / "admission-config.yaml"
    admission_file.write_text(yaml.safe_dump(admission))

    cluster = harness.start_control_plane(
        work / "cp", controlplane_bin_dir,
        apiserver_args=[f"--admission-control-config-file={admission_file}"])
    webhook: harness.Webhook | None = None
    try:
        probe = ssl.create_default_context()
        probe.load_cert_chain(str(cert), str(key))
        webhook = harness.start_webhook(
            work / "webhook", port=port, probe_context=probe,
            extra_args=["--cluster-view", "none", "--client-ca-file", str(client_ca_file),
                        "--client-names", "kube-apiserver"])
        ns = harness.unique_name("e2e-mtls", max_length=40)
        cluster.create_namespace(ns, labels={LABEL: "true"})
        for config in _configurations(webhook):
            cluster.apply(config)
        yield Setup(cluster, webhook, certs, ns)
    finally:
        if webhook is not None:
            webhook.stop()
        cluster.stop()


def _pod(ns: str, name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                                "resources": {"limits": {"cpu": "2",
                                                                         "memory": "64Mi"}}}]}})


def _direct(webhook: harness.Webhook, pair: tuple[Path, Path] | None) -> bytes | None:
    """POST a review straight to the webhook; the bytes of the answer, or None when the
    TLS handshake fails or the connection ends before any HTTP comes back."""
    context = ssl.create_default_context(cafile=str(webhook.ca_file))
    if pair is not None:
        context.load_cert_chain(str(pair[0]), str(pair[1]))
    review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "direct", "operation": "CREATE",
                                     "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                     "namespace": "kube-system",
                                     "object": json.loads(_pod("kube-system", "p"))}}).encode()
    request = (b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Connection: close\r\nContent-Length: " + str(len(review)).encode() + b"\r\n\r\n"
               + review)
    try:
        with (socket.create_connection(("127.0.0.1", webhook.port), timeout=10) as raw,
              context.wrap_socket(raw, server_hostname="127.0.0.1") as tls):
            tls.sendall(request)
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return None
    return data or None


def test_the_api_server_with_its_client_certificate_is_served(setup: Setup) -> None:
    out = setup.cluster.kubectl("create", "--dry-run=server", "-f", "-", "-o", "json",
                                input=_pod(setup.namespace, "mtls-probe"))
    pod = json.loads(out.stdout)
    resources = pod["spec"]["containers"][0]["resources"]
    # Mutated by Envelope (CPU limit gone, memory request = limit), so the call went
    # through the client-certificate handshake.
    assert "cpu" not in resources.get("limits", {}), resources
    assert resources["requests"]["memory"] == "64Mi", resources
    # A certificate that passes is also served directly (the check is on the
    # certificate, not on where the call comes from).
    answer = _direct(setup.webhook, setup.certs["apiserver"])
    assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer


@pytest.mark.parametrize("who", ["none", "other-ca", "mallory"])
def test_a_direct_caller_without_the_certificate_gets_no_answer(setup: Setup, who: str) -> None:
    pair = None if who == "none" else setup.certs[who]
    assert _direct(setup.webhook, pair) is None
    # and the API server's calls still go through afterwards
    out = setup.cluster.kubectl("create", "--dry-run=server", "-f", "-", "-o", "json",
                                input=_pod(setup.namespace, f"after-{who}"))
    assert "cpu" not in json.loads(out.stdout)["spec"]["containers"][0]["resources"]["limits"]
