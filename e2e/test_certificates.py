"""``--tls-mode self`` against the real API server: the webhook makes its CA, injects it
into its own configurations, and rotates it while requests keep being admitted; after
each forced rotation and the bounded overlap the caBundle trusts the new CA only."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

import harness
from harness import Cluster

CONFIG = "envelope-self-e2e"
NAMESPACE = "envelope-system"
LABEL = "envelope.test/self-tls"
OVERLAP = 8  # seconds the rotated-out CA stays trusted after the switch (4x --tls-interval 1 is the floor)


def served_cert(port: int) -> x509.Certificate:
    """The certificate a replica serves right now (no verification)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der
    return x509.load_der_x509_certificate(der)


def served_issuer(port: int) -> str:
    cert = served_cert(port)
    return cert.issuer.rfc4514_string() + f" serial={cert.serial_number}"


def bundle_cas(encoded: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(encoded))


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def configurations(port: int) -> list[dict]:
    common = {"admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
              "timeoutSeconds": 5,
              "namespaceSelector": {"matchLabels": {LABEL: "true"}},
              "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                         "operations": ["CREATE"]}]}
    base = f"https://127.0.0.1:{port}"
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": CONFIG},
         "webhooks": [{"name": "mutate.self.envelope.test", "clientConfig": {"url": f"{base}/mutate"},
                       "reinvocationPolicy": "IfNeeded", **common}]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": CONFIG},
         "webhooks": [{"name": "validate.self.envelope.test",
                       "clientConfig": {"url": f"{base}/validate"}, **common}]},
    ]


def start_replica(cluster: Cluster, workdir: Path, name: str) -> tuple[harness.ManagedProcess, int]:
    port, metrics = harness.free_port(), harness.free_port()
    cmd = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--metrics-port", str(metrics), "--tls-mode", "self", "--namespace", NAMESPACE,
           "--service-name", "envelope", "--tls-extra-san", "127.0.0.1",
           "--mutating-webhook-configuration", CONFIG, "--validating-webhook-configuration", CONFIG,
           "--tls-interval", "1", "--ca-overlap-seconds", str(OVERLAP), "--cluster-view", "live"]
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "POD_NAME": name,
           "PYTHONPATH": str(harness.REPO_ROOT)}
    proc = harness.start_process(cmd, workdir / f"{name}.log", name=name, env=env, cwd=harness.REPO_ROOT)
    return proc, port


def ready(port: int) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        status, _ = harness.https_get(f"https://127.0.0.1:{port}/readyz", ctx, timeout=2)
    except OSError:
        return False
    return status == 200


def wait(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: {what}")
        time.sleep(0.3)


@pytest.fixture
def replicas(cluster: Cluster, tmp_path: Path) -> Iterator[list[tuple[harness.ManagedProcess, int]]]:
    if cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        cluster.create_namespace(NAMESPACE)
    procs = [start_replica(cluster, tmp_path, f"envelope-{i}") for i in range(2)]
    for manifest in configurations(procs[0][1]):
        cluster.apply(manifest)
    try:
        yield procs
    finally:
        for proc, _ in procs:
            proc.stop(timeout=10)
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, CONFIG, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "secret", "envelope-tls", "-n", NAMESPACE, "--ignore-not-found",
                        check=False)


def secret_bundle(cluster: Cluster) -> str:
    secret = cluster.kubectl_json("get", "secret", "envelope-tls", "-n", NAMESPACE)
    return str(secret["data"]["ca-bundle.crt"])


def injected(cluster: Cluster) -> list[str]:
    out = []
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        config = cluster.kubectl_json("get", kind, CONFIG)
        out += [h["clientConfig"].get("caBundle", "") for h in config["webhooks"]]
    return out


def test_self_mode_injects_and_rotates_without_failed_admissions(
        cluster: Cluster, replicas: list[tuple[harness.ManagedProcess, int]], tmp_path: Path) -> None:
    for proc, port in replicas:
        wait(lambda port=port: ready(port), 60, f"{proc.name} ready:\n{proc.log_tail()}")
    bundle = secret_bundle(cluster)
    assert injected(cluster) == [bundle, bundle]
    holder = cluster.kubectl_json("get", "lease", "envelope-leader", "-n", NAMESPACE)
    assert holder["spec"]["holderIdentity"] in ("envelope-0", "envelope-1")

    ns = harness.unique_name("e2e-self-tls", max_length=40)
    cluster.create_namespace(ns, labels={LABEL: "true"})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
           "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]}}
    results: list[tuple[int, str]] = []
    stop = threading.Event()

    def admit() -> None:
        while not stop.is_set():
            out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                  input=json.dumps(pod), check=False)
            ok = out.returncode == 0 and "cpu" not in json.loads(out.stdout)["spec"]["containers"][0][
                "resources"]["limits"]
            results.append((0 if ok else 1, out.stderr.strip()))

    worker = threading.Thread(target=admit)
    worker.start()
    trusted: list[list[str]] = []
    try:
        time.sleep(2)
        for token in ("r1", "r2"):  # two forced rotations ("suspected leaked key")
            trusted.append(rotate(cluster, replicas, token))
    finally:
        stop.set()
        worker.join(60)
    failures = [err for code, err in results if code]
    print(f"\nself TLS rotation: {len(results)} admissions through the webhooks, "
          f"{len(failures)} failed; CAs trusted after each rotation: {[len(t) for t in trusted]}")
    assert len(results) >= 5, results
    assert failures == [], failures[:3]
    # each rotation ended with one CA, a new one each time (before: 2, then 3 CAs trusted)
    assert [len(t) for t in trusted] == [1, 1] and trusted[0] != trusted[1], trusted
    assert injected(cluster) == [secret_bundle(cluster)] * 2


def rotate(cluster: Cluster, replicas: list[tuple[harness.ManagedProcess, int]],
           token: str) -> list[str]:
    """Force a rotation, see both CAs trusted while replicas reload, then only the new
    one after the overlap; returns the fingerprints the bundle ends with."""
    def secret() -> dict:
        return cluster.kubectl_json("get", "secret", "envelope-tls", "-n", NAMESPACE)

    before = {port: served_issuer(port) for _, port in replicas}
    cluster.kubectl("annotate", "--overwrite", "secret", "envelope-tls", "-n", NAMESPACE,
                    f"envelope.io/rotate={token}")
    wait(lambda: secret()["metadata"].get("annotations", {}).get("envelope.io/rotated") == token,
         60, f"rotation {token} finished")
    switched = secret()
    seen = time.time()
    switched_at = datetime.fromisoformat(switched["metadata"]["annotations"]["envelope.io/switched-at"])
    if seen - switched_at.timestamp() < OVERLAP - 1:  # still inside the overlap: both trusted
        assert len(bundle_cas(switched["data"]["ca-bundle.crt"])) >= 2
    for _, port in replicas:  # every replica reloads the new certificate from the Secret
        wait(lambda port=port: served_issuer(port) != before[port], 30, "replica reloaded")
    wait(lambda: len(bundle_cas(secret_bundle(cluster))) == 1, OVERLAP + 30,
         f"old CA dropped after rotation {token}")
    wait(lambda: injected(cluster) == [secret_bundle(cluster)] * 2, 30, "bundle injected")
    [ca] = bundle_cas(secret_bundle(cluster))
    for _, port in replicas:  # what every replica serves chains to the one trusted CA
        assert signed_by(served_cert(port), ca)
    time.sleep(2)  # admissions keep passing with the single-CA bundle in place
    return [ca.fingerprint(hashes.SHA256()).hex()]
