"""The webhook under test: started as a process, its CRDs, and its registration with
the API server through the chart's webhook configurations."""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import (
    ISOLATED_NAMESPACE_LABEL,
    MUTATING_WEBHOOK_NAME,
    PROBE_NAMESPACE,
    REPO_ROOT,
    VALIDATING_WEBHOOK_NAME,
    WEBHOOK_CONFIGURATION_NAME,
    HarnessError,
)
from .certificates import make_serving_cert
from .cluster import Cluster, _https_get, _tls_context, wait_until
from .ports import free_port
from .processes import ManagedProcess, start_process


@dataclass
class Webhook:
    """The Envelope webhook running as a real process (``python -m app serve``)."""

    process: ManagedProcess
    port: int
    metrics_port: int
    ca_file: Path
    cert_file: Path
    key_file: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def stop(self) -> None:
        self.process.stop(timeout=10)


def start_webhook(
    workdir: Path,
    *,
    kubeconfig: Path | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    command: Sequence[str] = ("-m", "app", "serve"),
    port: int | None = None,
    probe_context: ssl.SSLContext | None = None,
) -> Webhook:
    """Start ``python -m app serve`` (or ``python <command>`` with the same serving
    flags) on free ports (or ``port``) with a fresh serving cert and wait until
    ``GET /healthz`` answers 200 over TLS. ``probe_context``: the client context for
    that wait (e.g. holding a client certificate when the webhook requires mTLS); the
    webhook's new CA is loaded into it here."""
    workdir.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = make_serving_cert(workdir, ("127.0.0.1", "localhost"), name="webhook")
    port, metrics_port = port or free_port(), free_port()
    cmd = [
        sys.executable, *command,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--cert-file", str(cert_file),
        "--key-file", str(key_file),
        "--metrics-port", str(metrics_port),
        *extra_args,
    ]  # fmt: skip
    proc_env = dict(os.environ)
    proc_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), proc_env.get("PYTHONPATH", "")) if p)
    proc_env["PYTHONUNBUFFERED"] = "1"
    if kubeconfig is not None:
        proc_env["KUBECONFIG"] = str(kubeconfig)
    proc_env.update(env or {})
    proc = start_process(cmd, workdir / "webhook.log", name="webhook", env=proc_env, cwd=REPO_ROOT)
    ctx = _tls_context(ca_file)
    if probe_context is not None:
        probe_context.load_verify_locations(cafile=str(ca_file))
        ctx = probe_context

    def healthy() -> bool:
        status, _ = _https_get(f"https://127.0.0.1:{port}/healthz", ctx, timeout=2)
        return status == 200

    try:
        wait_until(f"webhook /healthz on port {port}", healthy, proc, timeout=timeout)
    except BaseException:
        proc.stop(timeout=5)
        raise
    return Webhook(
        process=proc,
        port=port,
        metrics_port=metrics_port,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )


CHART_DIR = REPO_ROOT / "charts" / "envelope"
CRD_DIR = Path(__file__).resolve().parent.parent / "crds"
RELEASE_NAMESPACE = "envelope-e2e-system"


def install_crds(cluster: Cluster, directory: Path = CRD_DIR, timeout: float = 60.0) -> list[str]:
    """Apply every CRD manifest in ``directory`` and wait until each is Established."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        return []
    args = [arg for f in files for arg in ("-f", str(f))]
    cluster.kubectl("apply", *args)
    names = cluster.kubectl("get", *args, "-o", "name").stdout.split()
    cluster.kubectl("wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *names,
                    timeout=timeout + 10)
    return names


def webhook_configurations(cluster: Cluster, base_url: str, ca_file: Path) -> str:
    """The chart's Mutating + ValidatingWebhookConfiguration, rendered by the real
    ``helm template`` in URL mode (``clientConfig.url`` = ``base_url``/mutate, /validate),
    with the test CA as a provided bundle. Namespaces labelled
    ``envelope.test/isolated`` are left to tests that run a webhook of their own. The
    workload webhooks match what the rules judge, ``pods/resize`` included
    (``charts/envelope/files/kinds.yaml``; e2e/test_oracle_resize.py relies on it)."""
    ca_bundle = base64.b64encode(ca_file.read_bytes()).decode()
    selector = json.dumps([{"key": ISOLATED_NAMESPACE_LABEL, "operator": "DoesNotExist"}])
    result = cluster.helm(
        "template", WEBHOOK_CONFIGURATION_NAME, str(CHART_DIR), "--set", "image.local=true",
        "--namespace", RELEASE_NAMESPACE,
        "--set", f"webhooks.url={base_url}",
        "--set", "webhooks.timeoutSeconds=10",
        # The scenarios start the webhook themselves and want the policies as written;
        # e2e/test_safe_install.py covers the chart's default (Ignore, then raised).
        "--set", "webhooks.safeInstall=false",
        # Fail rather than Ignore: a webhook that cannot be reached must fail the test.
        "--set", "webhooks.workloads.mutate.failurePolicy=Fail",
        "--set", "certificates.mode=provided",
        "--set", "certificates.provided.secretName=unused-in-url-mode",
        "--set", f"certificates.provided.caBundle={ca_bundle}",
        "--set-json", f"webhooks.namespaceSelectorExpressions={selector}",
        "--show-only", "templates/webhooks.yaml",
    )
    return result.stdout


def _webhook_requests_answered(cluster: Cluster) -> set[str]:
    """Names of our webhooks that the API server got an HTTP 200 from, per its
    ``apiserver_admission_webhook_request_total`` metric."""
    status, body = cluster.get_raw("/metrics", timeout=20)
    if status != 200:
        return set()
    seen: set[str] = set()
    for line in body.splitlines():
        if not line.startswith("apiserver_admission_webhook_request_total{"):
            continue
        if 'code="200"' not in line:
            continue
        for name in (MUTATING_WEBHOOK_NAME, VALIDATING_WEBHOOK_NAME):
            if f'name="{name}"' in line and float(line.rsplit(" ", 1)[1]) > 0:
                seen.add(name)
    return seen


def probe_pod(name: str = "envelope-e2e-probe") -> dict[str, Any]:
    """A Pod with a CPU limit, used to check the webhooks are being called."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": PROBE_NAMESPACE},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "16Mi"},
                        "limits": {"cpu": "1", "memory": "16Mi"},
                    },
                }
            ]
        },
    }


def register_webhook(cluster: Cluster, webhook: Webhook, timeout: float = 60.0) -> None:
    """Wait until the webhook is ready, register the webhook configurations and wait
    until the API server calls both webhooks and gets HTTP 200 back.

    The API server loads webhook configurations asynchronously, so this sends
    dry-run probe Pods (``kubectl create --dry-run=server``) in the
    ``envelope-e2e-probe`` namespace until the API server's own
    ``apiserver_admission_webhook_request_total`` metric shows a 200 from both
    the mutating and the validating webhook. This does not depend on what the
    webhook does to the Pod.
    """
    # As a Service would: no traffic before /readyz (caches synced) says so.
    ctx = _tls_context(webhook.ca_file)
    wait_until(f"webhook /readyz on port {webhook.port}",
                lambda: _https_get(f"{webhook.url}/readyz", ctx, timeout=2)[0] == 200,
                webhook.process, timeout)
    cluster.apply(webhook_configurations(cluster, webhook.url, webhook.ca_file))
    if cluster.kubectl("get", "namespace", PROBE_NAMESPACE, check=False).returncode != 0:
        cluster.create_namespace(PROBE_NAMESPACE)
    probe = json.dumps(probe_pod())
    last = ""

    def answered() -> bool:
        nonlocal last
        result = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe, check=False
        )
        last = (result.stderr or "").strip()
        wanted = {MUTATING_WEBHOOK_NAME, VALIDATING_WEBHOOK_NAME}
        return wanted <= _webhook_requests_answered(cluster)

    try:
        wait_until("the API server to call the webhooks", answered, webhook.process, timeout, interval=0.5)
    except HarnessError as err:
        raise HarnessError(f"{err}\nlast probe stderr: {last or '(none)'}") from None


def unregister_webhook(cluster: Cluster) -> None:
    """Delete the webhook configurations (never blocked by webhooks)."""
    cluster.kubectl(
        "delete",
        "mutatingwebhookconfiguration,validatingwebhookconfiguration",
        WEBHOOK_CONFIGURATION_NAME,
        "--ignore-not-found",
        "--wait=false",
        check=False,
    )


