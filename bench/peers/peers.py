"""Run the peers for real against the e2e API server: Kyverno out of cluster (the
binary bench/peers/build-kyverno.sh builds), the MutatingAdmissionPolicy in the API
server itself.

Kyverno out of cluster, as its DEVELOPMENT.md ("Debugging local code") and
.vscode/launch.json describe it: its CRDs from the module's ``config/crds``, the
``kyverno`` namespace with the admission controller's service account and its two
config maps (``INIT_CONFIG``, ``METRICS_CONFIG``), the environment it reads at start
(namespace, service account, deployment and pod name), and ``--serverIP`` so it
registers URL webhooks (``https://<serverIP>/...``) instead of Service references. It
runs with the e2e admin kubeconfig (no RBAC to install), with admission reports off
(the benchmark measures the mutation, not reporting) and its metrics on a free port.
Stopped out of cluster it leaves its webhook configurations behind:
:func:`delete_kyverno_webhooks` removes them by label.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "e2e"))

import intree  # noqa: E402

import harness  # noqa: E402

BUILD = ROOT / "bench" / "peers" / "build-kyverno.sh"
NAMESPACE = "kyverno"
SERVICE_ACCOUNT = "kyverno-admission-controller"
MANAGED_BY = "webhook.kyverno.io/managed-by=kyverno"

#: kube-apiserver flags MutatingAdmissionPolicy needs: none since it went GA
#: (``admissionregistration.k8s.io/v1``, on by default from 1.36; the bench's control
#: plane is the e2e default, v1.37.2). 1.34 and 1.35 needed the beta gate and API.
MAP_APISERVER_ARGS: tuple[str, ...] = ()


def kyverno_dir() -> Path:
    """The cache dir of the built Kyverno (``bin/kyverno``, ``src/config/crds``)."""
    env = os.environ.get("ENVELOPE_KYVERNO_DIR")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


@dataclass
class Kyverno:
    process: harness.ManagedProcess
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def install_kyverno_prerequisites(cluster: harness.Cluster, kdir: Path) -> None:
    # Server-side: client-side apply's last-applied annotation would exceed 256 KiB for
    # Kyverno's largest CRDs (clusterpolicies, policies).
    files = sorted((kdir / "src" / "config" / "crds").glob("*/*.yaml"))
    args = [arg for f in files for arg in ("-f", str(f))]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", *args, timeout=180)
    names = cluster.kubectl("get", *args, "-o", "name").stdout.split()
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=120s", *names, timeout=130)
    if cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        cluster.create_namespace(NAMESPACE)
    cluster.apply("\n---\n".join(json.dumps(o) for o in (
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        # The chart's defaults, minus its resource filters: nothing here needs excluding.
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kyverno", "namespace": NAMESPACE},
         "data": {"enableDefaultRegistryMutation": "true", "defaultRegistry": "docker.io",
                  "generateSuccessEvents": "false",
                  "webhooks": json.dumps([{"namespaceSelector": {"matchExpressions": [
                      {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                       "values": [NAMESPACE, "kube-system"]}]}}])}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kyverno-metrics", "namespace": NAMESPACE}, "data": {}},
    )))


def start_kyverno(cluster: harness.Cluster, workdir: Path, kdir: Path) -> Kyverno:
    workdir.mkdir(parents=True, exist_ok=True)
    install_kyverno_prerequisites(cluster, kdir)
    port = harness.free_port()
    env = dict(os.environ, KYVERNO_NAMESPACE=NAMESPACE, KYVERNO_SERVICEACCOUNT_NAME=SERVICE_ACCOUNT,
               KYVERNO_DEPLOYMENT="kyverno-admission-controller", KYVERNO_POD_NAME="kyverno-bench",
               INIT_CONFIG="kyverno", METRICS_CONFIG="kyverno-metrics")
    cmd: list[str | Path] = [
        kdir / "bin" / "kyverno",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--serverIP=127.0.0.1:{port}",
        "--webhookServerHost=127.0.0.1",
        f"--webhookServerPort={port}",
        "--servicePort=443",
        f"--metricsPort={harness.free_port()}",
        f"--profilePort={harness.free_port()}",
        "--controllerRuntimeMetricsAddress=0",
        "--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca",
        "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair",
        "--backgroundServiceAccountName=system:serviceaccount:kyverno:kyverno-background-controller",
        "--reportsServiceAccountName=system:serviceaccount:kyverno:kyverno-reports-controller",
        "--admissionReports=false",
        "--webhookRegistrationTimeout=60s",
        "-v=1",
    ]
    proc = harness.start_process(cmd, workdir / "kyverno.log", name="kyverno", env=env)
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # its own CA, made at start; a local readiness probe only

    def ready() -> bool:
        return harness.https_get(f"https://127.0.0.1:{port}/health/readiness", insecure, timeout=2)[0] == 200

    try:
        harness.wait_until("kyverno /health/readiness", ready, proc, timeout=180, interval=1)
    except BaseException:
        proc.stop(timeout=10)
        raise
    return Kyverno(proc, port)


def delete_kyverno_webhooks(cluster: harness.Cluster) -> None:
    cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                    "-l", MANAGED_BY, "--ignore-not-found", "--wait=false", check=False)


def apply_objects(cluster: harness.Cluster, objects: list[dict[str, Any]]) -> None:
    cluster.apply("\n---\n".join(json.dumps(o) for o in objects))


def delete_objects(cluster: harness.Cluster, objects: list[dict[str, Any]]) -> None:
    for o in objects:
        kind = o["kind"].lower()
        group = o["apiVersion"].rpartition("/")[0]
        cluster.kubectl("delete", f"{kind}.{group}" if group else kind, o["metadata"]["name"],
                        "--ignore-not-found", "--wait=false", check=False)


def _mutating_calls(cluster: harness.Cluster) -> float:
    status, body = cluster.get_raw("/metrics", timeout=20)
    if status != 200:
        raise harness.HarnessError(f"GET /metrics: HTTP {status}")
    return intree.admission_counters(body).get("calls:admit", 0.0)


def wait_in_tree(cluster: harness.Cluster, namespace: str, probe: dict[str, Any], what: str,
                 proc: harness.ManagedProcess | None = None, timeout: float = 120) -> None:
    """Like :func:`wait_mutates`, and until the mutation came from the in-tree policy:
    the probe (in the policy's domain) loses its CPU limits while the API server calls
    no mutating webhook (its request counter stands still)."""
    deadline = time.monotonic() + timeout
    while True:
        before = _mutating_calls(cluster)
        wait_mutates(cluster, namespace, probe, what, proc, max(1.0, deadline - time.monotonic()))
        if _mutating_calls(cluster) == before:
            return
        if time.monotonic() > deadline:
            raise harness.HarnessError(f"{what}: the mutating webhook still answers the probe, "
                                       f"the in-tree policy never did")
        time.sleep(1)


def wait_mutates(cluster: harness.Cluster, namespace: str, probe: dict[str, Any], what: str,
                 proc: harness.ManagedProcess | None = None, timeout: float = 120) -> None:
    """Dry-run ``probe`` (a Deployment with a CPU limit) until the stored form has lost
    it: the peer is registered and acting."""
    body = json.dumps({**probe, "metadata": {**probe["metadata"], "namespace": namespace}})
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise harness.HarnessError(f"{what} exited:\n{proc.log_tail()}")
        r = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=body, check=False)
        if r.returncode == 0:
            out = json.loads(r.stdout)
            limits = [c.get("resources", {}).get("limits", {})
                      for c in out["spec"]["template"]["spec"]["containers"]]
            if all("cpu" not in lim for lim in limits):
                return
            last = "CPU limit still there"
        else:
            last = r.stderr.strip()[-500:]
        time.sleep(1)
    raise harness.HarnessError(f"{what} never mutated the probe: {last}"
                               + (f"\n{proc.log_tail()}" if proc else ""))
