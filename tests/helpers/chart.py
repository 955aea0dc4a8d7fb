"""Rendering the chart with helm, and what the chart tests share (paths, names, a service
account's kubeconfig, waiting)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent


CHART = REPO / "charts" / "envelope"


MANIFEST = REPO / "manifests" / "install.yaml"


BUILD_SCRIPT = REPO / "e2e" / "controlplane" / "build.sh"


BIN_ENV = "ENVELOPE_CONTROLPLANE_BIN"


RELEASE = "envelope"


NAMESPACE = "envelope-system"


KUBE_VERSION = "1.34"
"""Schemas used for offline validation: the control plane's minor version."""


STANDARD_LABELS = (
    "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
    "app.kubernetes.io/component", "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)  # fmt: skip


def _locate_bin_dir() -> Path:
    """As e2e/harness/: $ENVELOPE_CONTROLPLANE_BIN, else build.sh's last line."""
    override = os.environ.get(BIN_ENV)
    if override:
        bin_dir = Path(override).expanduser()
    else:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, cwd=REPO,
                              check=False)
        if proc.returncode == 3 and os.environ.get("ENVELOPE_CONTROLPLANE_CACHED_ONLY") == "1":
            pytest.skip("helm is not built yet and `make unit` builds nothing: run `make controlplane` "
                        "(or `make test`, which builds it and runs these tests)")
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            pytest.fail(
                f"helm is needed to test the chart: {BUILD_SCRIPT.relative_to(REPO)} failed (exit "
                f"{proc.returncode}); set ${BIN_ENV} to a directory with helm and kubectl, or install "
                f"Go so the script can build them.\n{proc.stderr[-3000:]}", pytrace=False)
        bin_dir = Path(lines[-1])
    for tool in ("helm", "kubectl"):
        if not os.access(bin_dir / tool, os.X_OK):
            pytest.fail(f"{bin_dir / tool} is missing or not executable (from ${BIN_ENV} or "
                        f"{BUILD_SCRIPT.relative_to(REPO)})", pytrace=False)
    return bin_dir


@cache
def bin_dir() -> Path:
    return _locate_bin_dir()


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    home = Path(tempfile.gettempdir()) / "envelope-test-helm-home"
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                     ("HELM_DATA_HOME", "data")):
        env[var] = str(home / sub)
    proc = subprocess.run([str(bin_dir() / "helm"), *args], capture_output=True, text=True, env=env,
                          check=False, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}",
                    pytrace=False)
    return proc


#: Under every rendering here: no node pulls the image (there is no kubelet), and a bare
#: repository is refused unless the nodes hold it (test_a_bare_image_name_is_refused).
LOCAL_IMAGE: dict[str, Any] = {"image": {"local": True}}


def _values_file(values: dict[str, Any]) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="envelope-values-", delete=False) as f:
        yaml.safe_dump(deep_merge(LOCAL_IMAGE, values), f)
    return f.name


def _template(values_json: str, namespace: str, release: str,
              tests: bool = False) -> subprocess.CompletedProcess[str]:
    """``helm template``; the ``helm test`` hook (templates/tests/) only with ``tests``
    (the release's objects are what every other test here checks)."""
    path = _values_file(json.loads(values_json))
    skip = [] if tests else ["--skip-tests"]
    try:
        return helm("template", release, str(CHART), "--namespace", namespace, "-f", path, *skip,
                    check=False)
    finally:
        os.unlink(path)


class Rendered:
    """The objects ``helm template`` produced."""

    def __init__(self, docs: list[dict[str, Any]], namespace: str, release: str) -> None:
        self.docs = docs
        self.namespace = namespace
        self.release = release

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of(kind)
        assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
        return found[0]

    @property
    def container(self) -> dict[str, Any]:
        containers = self.one("Deployment")["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["envelope"]
        container: dict[str, Any] = containers[0]
        return container

    @property
    def pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.one("Deployment")["spec"]["template"]["spec"]
        return spec

    def arg(self, flag: str) -> str | None:
        values = self.args(flag)
        assert len(values) <= 1, f"{flag} given {len(values)} times"
        return values[0] if values else None

    def args(self, flag: str) -> list[str]:
        return [a.split("=", 1)[1] for a in self.container["args"] if a.startswith(flag + "=")]

    def webhooks(self) -> dict[str, dict[str, Any]]:
        out = {}
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in self.one(kind)["webhooks"]:
                annotations = self.one(kind)["metadata"].get("annotations") or {}
                out[hook["name"]] = {**hook, "_kind": kind, "_annotations": annotations}
        return out


@cache
def _render_cached(values_json: str, namespace: str, release: str, tests: bool = False) -> Rendered:
    proc = _template(values_json, namespace, release, tests)
    if proc.returncode != 0:
        pytest.fail(f"helm template failed:\n{proc.stderr}", pytrace=False)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return Rendered(docs, namespace, release)


def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE,
           release: str = RELEASE, tests: bool = False) -> Rendered:
    return _render_cached(json.dumps(values or {}, sort_keys=True), namespace, release, tests)


def render_on(values: dict[str, Any], *api_versions: str,
              kube_version: str = "1.37.2") -> tuple[int, list[dict[str, Any]], str]:
    """``helm template`` as on an API server of ``kube_version`` that serves
    ``api_versions`` (``.Capabilities``): (exit code, the objects, stderr). Not cached."""
    path = _values_file(values)
    extra = [a for v in api_versions for a in ("--api-versions", v)]
    try:
        proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", path,
                    "--skip-tests", "--kube-version", kube_version, *extra, check=False)
    finally:
        os.unlink(path)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d] if proc.returncode == 0 else []
    return proc.returncode, docs, proc.stderr


def render_error(values: dict[str, Any]) -> str:
    proc = _template(json.dumps(values), NAMESPACE, RELEASE)
    assert proc.returncode != 0, "helm template should have refused these values"
    return proc.stderr


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _ca_bundles(cluster: Any, name: str) -> dict[str, str]:
    out = {}
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        config = cluster.kubectl_json("get", kind, name)
        for hook in config.get("webhooks") or []:
            out[hook["name"]] = hook["clientConfig"].get("caBundle", "")
    return out


def _sa_kubeconfig(cluster: Any, namespace: str, sa: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": cluster.api_url,
                                               "certificate-authority": str(cluster.pki.serving_ca)}}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "c", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }))
    path.chmod(0o600)
    return path


def _wait(what: str, check: Any, proc: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if not proc.alive():
            pytest.fail(f"the webhook exited while waiting for {what}:\n{proc.log_tail(60)}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; webhook log:\n{proc.log_tail(60)}", pytrace=False)
        time.sleep(0.5)


# --- the value sets the chart is rendered with in the tests ---------------------------

def _make_ca_b64() -> str:
    """Base64 of a real self-signed CA certificate (PEM), as a user would provide."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "provided-ca")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode()


PROVIDED_CA = _make_ca_b64()

MODES: dict[str, dict[str, Any]] = {
    "self": {},
    "certManager": {"certificates": {"mode": "certManager"}},
    "certManager-issuerRef": {"certificates": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
    "provided": {"certificates": {"mode": "provided",
                                  "provided": {"secretName": "my-tls", "caBundle": PROVIDED_CA}}},
}
FEATURES: dict[str, dict[str, Any]] = {
    "workloads-off": {"webhooks": {"workloads": {"enabled": False}}},
    "quotas-off": {"webhooks": {"quotas": {"enabled": False}}},
    "actors-off": {"webhooks": {"actors": {"enabled": False}}},
    "all-families-off": {"webhooks": {"workloads": {"enabled": False}, "quotas": {"enabled": False},
                                      "actors": {"enabled": False}}},
    "url": {"webhooks": {"url": "https://127.0.0.1:8443"}, "certificates": {"extraSANs": ["127.0.0.1"]}},
    "url-provided": {"webhooks": {"url": "https://127.0.0.1:8443/"}, **MODES["provided"]},
    "url-certManager": {"webhooks": {"url": "https://127.0.0.1:8443"},
                        "certificates": {"mode": "certManager", "extraSANs": ["127.0.0.1", "dev.local"]}},
    "serviceMonitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "metrics-off": {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
    "one-replica": {"replicaCount": 1},
    "autoscaling": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8,
                                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}}}},
    "namespace": {"namespace": {"create": True}},
    "customised": {
        "replicaCount": 5,
        "image": {"repository": "registry.example/envelope", "digest": "sha256:" + "a" * 64},
        "priorityClassName": "",
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "spread": {"whenUnsatisfiable": "DoNotSchedule", "zones": False},
        "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}},
        "webhooks": {
            "timeoutSeconds": 10,
            "excludeNamespaces": ["monitoring", "kube-system"],
            "namespaceSelectorExpressions": [
                {"key": "envelope.io/ignore", "operator": "DoesNotExist"}],
            "workloads": {"mutate": {"failurePolicy": "Fail"}, "validate": {"failurePolicy": "Ignore"}},
            "quotas": {"failurePolicy": "Ignore"},
        },
        "policy": {"rules": {"cpu-limits": "warn"}, "failureMode": "allow"},
        "serviceAccount": {"annotations": {"example.com/role": "envelope"}},
        "commonLabels": {"team": "platform"},
    },
}
CASES = {**MODES, **FEATURES}
