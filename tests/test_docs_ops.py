"""The operations docs (troubleshooting, upgrade, runbooks): every relative link names a
file that exists and every #anchor a heading of it (GitHub's slugs), and the
troubleshooting page covers each error text it promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [DOCS / "troubleshooting.md", DOCS / "upgrade.md", *sorted((DOCS / "runbooks").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_matches_github() -> None:
    assert slug("`x509: certificate is valid for …, not …`") == "x509-certificate-is-valid-for--not-"
    assert slug("`remote error: tls: …` (mTLS)") == "remote-error-tls--mtls"
    assert slug("Install with Helm") == "install-with-helm"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link}: {target} does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"{page.name}: {link}: no heading #{anchor} in {target.name}"


def test_troubleshooting_names_the_api_server_texts() -> None:
    """The texts as k8s.io/apiserver / apimachinery v0.34.12 and Go's TLS stack print them."""
    text = (DOCS / "troubleshooting.md").read_text()
    for phrase in ('denied the request', 'failed calling webhook "', 'failed to call webhook: Post "',
                   'no endpoints available for service "envelope"',
                   "tls: failed to verify certificate: x509: certificate signed by unknown authority",
                   "context deadline exceeded", "connect: connection refused", "i/o timeout",
                   "the server rejected our request for an unknown reason",
                   "the server has asked for the client to provide credentials",
                   "received invalid webhook response", "does not support dry run",
                   "request did not complete within requested timeout", "not yet ready to handle request",
                   "failing open", "failing closed", "apiserver_admission_webhook_fail_open_count",
                   "kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration envelope",
                   "webhooks.excludeNamespaces"):
        assert phrase in text, phrase
    for namespace in ("gpu-operator", "monitoring", "argocd", "cert-manager"):
        assert f"| `{namespace}`" in text, namespace


# ------------------------------------------------------------------------------ e2e
# Each failure troubleshooting.md explains, caused on a real kube-apiserver (1.34, from
# the e2e harness, with --enable-aggregator-routing so a Service is resolved to its
# endpoints without any traffic to a ClusterIP): the text the API server prints must
# be the one the page quotes.


def _ca_and_leaf(sans: list[str]) -> tuple[bytes, bytes, bytes]:
    """(CA PEM, leaf cert PEM, leaf key PEM) with the given DNS/IP SANs."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "troubleshooting-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = []
    for san in sans:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), leaf.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


class _Webhook:
    """A TLS server on 127.0.0.1 answering by path: /deny, /hang, /400, /401, /baduid."""

    def __init__(self, cert: bytes, key: bytes, tmp: Path) -> None:
        import http.server
        import socketserver
        import ssl
        import threading
        import time

        (tmp / "tls.crt").write_bytes(cert)
        (tmp / "tls.key").write_bytes(key)

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                import json

                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                uid = review["request"]["uid"]
                path = self.path.split("?", 1)[0]
                if path == "/hang":
                    time.sleep(4)
                if path in ("/400", "/401"):
                    body, status = b"no", int(path[1:])
                else:
                    response = {"uid": "not-" + uid if path == "/baduid" else uid,
                                "allowed": path != "/deny"}
                    if path == "/deny":
                        response["status"] = {"code": 403, "message": "troubleshooting says no"}
                    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                       "response": response}).encode()
                    status = 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.e2e
def test_the_api_server_prints_what_troubleshooting_quotes(tmp_path: Path) -> None:
    import base64
    import json
    import sys
    import time

    from tests.helpers.chart import bin_dir

    sys.path.insert(0, str(ROOT / "e2e"))
    import harness

    page = (DOCS / "troubleshooting.md").read_text()
    ca, cert, key = _ca_and_leaf(["127.0.0.1"])
    other_ca, _, _ = _ca_and_leaf(["127.0.0.1"])
    dns_ca, dns_cert, dns_key = _ca_and_leaf(["envelope.envelope-system.svc"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    good, dns_only = _Webhook(cert, key, tmp_path / "a"), _Webhook(dns_cert, dns_key, tmp_path / "b")
    closed = harness.free_port()
    try:
        cluster = harness.start_control_plane(tmp_path / "cp", bin_dir(),
                                              apiserver_args=["--enable-aggregator-routing=true"])
    except harness.HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        cluster.kubectl("create", "namespace", "judged")
        cluster.kubectl("create", "namespace", "envelope-system")
        cluster.apply({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": "envelope", "namespace": "envelope-system"},
                       "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}})

        def url(server: _Webhook, path: str) -> dict:
            return {"url": f"https://127.0.0.1:{server.port}{path}"}

        b64 = {name: base64.b64encode(pem).decode() for name, pem in
               (("ca", ca), ("other", other_ca), ("dns", dns_ca))}
        cases = [
            # (clientConfig, caBundle, failurePolicy, texts the API server must print)
            ({"url": f"https://127.0.0.1:{closed}/validate"}, "ca", "Fail",
             ['failed calling webhook "troubleshooting.envelope.io": failed to call webhook: Post "',
              "connect: connection refused"]),
            (url(good, "/deny"), "ca", "Fail",
             ['admission webhook "troubleshooting.envelope.io" denied the request: ',
              ": troubleshooting says no"]),  # the webhook's own message follows
            (url(good, "/deny"), "other", "Fail",
             ["tls: failed to verify certificate: x509: certificate signed by unknown authority"]),
            (url(dns_only, "/deny"), "dns", "Fail",
             ["x509: cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs"]),
            (url(good, "/hang"), "ca", "Fail", ["context deadline exceeded"]),
            (url(good, "/400"), "ca", "Fail", ["the server rejected our request for an unknown reason"]),
            (url(good, "/401"), "ca", "Fail", ["the server has asked for the client to provide credentials"]),
            (url(good, "/baduid"), "ca", "Fail",
             ['received invalid webhook response: expected response.uid="']),
            ({"service": {"name": "envelope", "namespace": "envelope-system", "path": "/validate"}}, "ca",
             "Fail", ['no endpoints available for service "envelope"']),
            ({"service": {"name": "missing", "namespace": "envelope-system", "path": "/validate"}}, "ca",
             "Fail", ['service "missing" not found']),
        ]
        for i, (client_config, bundle, policy, texts) in enumerate(cases):
            config = {"apiVersion": "admissionregistration.k8s.io/v1",
                      "kind": "ValidatingWebhookConfiguration",
                      "metadata": {"name": "troubleshooting"},
                      "webhooks": [{
                          "name": "troubleshooting.envelope.io", "sideEffects": "None",
                          "admissionReviewVersions": ["v1"], "failurePolicy": policy, "timeoutSeconds": 1,
                          "clientConfig": {**client_config, "caBundle": b64[bundle]},
                          "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "judged"}},
                          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                     "resources": ["configmaps"]}]}]}
            cluster.kubectl("apply", "-f", "-", "--server-side", "--force-conflicts",
                            input=json.dumps(config))
            deadline, stderr = time.monotonic() + 30, ""
            while time.monotonic() < deadline:  # the API server picks the change up within seconds
                proc = cluster.kubectl("create", "configmap", f"c{i}", "-n", "judged", "--dry-run=server",
                                       check=False)
                stderr = proc.stderr
                if proc.returncode != 0 and all(t in stderr for t in texts):
                    break
                time.sleep(0.5)
            for text in texts:
                assert text in stderr, f"case {i}: the API server printed {stderr!r}"
                if "troubleshooting says" in text:
                    continue  # the webhook's message, not the API server's
                # The page uses the chart's names: its webhook, its Service.
                quoted = text.replace("troubleshooting.envelope.io", "workloads.validate.envelope.io")
                quoted = quoted.replace('service "missing"', 'service "envelope"')
                assert quoted in page, f"troubleshooting.md does not quote {quoted!r}"
        # failurePolicy Ignore: the write passes, and the API server counts it as failing open.
        config["webhooks"][0].update({"failurePolicy": "Ignore",
                                      "clientConfig": {"url": f"https://127.0.0.1:{closed}/validate",
                                                       "caBundle": b64["ca"]}})
        cluster.kubectl("apply", "-f", "-", "--server-side", "--force-conflicts", input=json.dumps(config))
        deadline = time.monotonic() + 30
        while cluster.kubectl("create", "configmap", "open", "-n", "judged", "--dry-run=server",
                              check=False).returncode != 0:
            assert time.monotonic() < deadline, "failurePolicy Ignore never let the write through"
            time.sleep(0.5)
        metrics = cluster.kubectl("get", "--raw", "/metrics").stdout
        assert 'apiserver_admission_webhook_fail_open_count{name="troubleshooting.envelope.io"' in metrics
        assert "apiserver_admission_webhook_fail_open_count" in page
    finally:
        cluster.stop()
        good.close()
        dns_only.close()
