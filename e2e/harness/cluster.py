"""The control plane: etcd and kube-apiserver started on free ports, a ``Cluster`` to
talk to it (kubectl, helm, the REST API), and waiting for things to become true."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import READY_TIMEOUT, CommandError, HarnessError
from .certificates import ControlPlanePKI, make_control_plane_pki
from .ports import free_port
from .processes import ManagedProcess, start_process


def _tls_context(
    ca_file: Path, cert_file: Path | None = None, key_file: Path | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert_file is not None:
        ctx.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
    return ctx


def _https_get(url: str, ctx: ssl.SSLContext, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def https_get(url: str, ctx: ssl.SSLContext, timeout: float = 5.0) -> tuple[int, str]:
    """GET ``url`` with TLS context ``ctx``; returns (status, body), also for 4xx/5xx."""
    return _https_get(url, ctx, timeout)


def tls_context(ca_file: Path, cert_file: Path | None = None, key_file: Path | None = None) -> ssl.SSLContext:
    """Client TLS context trusting ``ca_file``, optionally presenting a client cert."""
    return _tls_context(ca_file, cert_file, key_file)


@dataclass
class Cluster:
    """A running etcd + kube-apiserver, and the client tools to talk to it."""

    bin_dir: Path
    workdir: Path
    kubeconfig: Path
    api_url: str
    pki: ControlPlanePKI
    etcd_url: str
    processes: list[ManagedProcess] = field(default_factory=list)
    _api_ctx: ssl.SSLContext | None = field(default=None, repr=False)

    # -- client tools -------------------------------------------------------------

    def tool_env(self) -> dict[str, str]:
        """Environment for kubectl/helm: isolated from the user's config."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["KUBERC"] = "off"  # ignore a user's ~/.kube/kuberc preferences
        home = self.workdir / "home"
        for var, sub in (
            ("HELM_CACHE_HOME", "helm/cache"),
            ("HELM_CONFIG_HOME", "helm/config"),
            ("HELM_DATA_HOME", "helm/data"),
        ):
            env[var] = str(home / sub)
        return env

    def _run(
        self,
        argv: list[str],
        input: str | bytes | None,
        check: bool,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        data = input.decode() if isinstance(input, bytes) else input
        proc = subprocess.run(
            argv,
            input=data,
            capture_output=True,
            text=True,
            env=self.tool_env(),
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise CommandError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def kubectl(
        self,
        *args: str,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster (text mode).

        With ``check`` (default) a non-zero exit raises CommandError, whose
        message includes stdout and stderr.
        """
        argv = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.workdir / 'kube-cache'}",
            *args,
        ]
        return self._run(argv, input, check, timeout)

    def kubectl_json(self, *args: str, input: str | bytes | None = None) -> Any:
        """``kubectl ARGS -o json`` parsed."""
        return json.loads(self.kubectl(*args, "-o", "json", input=input).stdout)

    def apply(
        self, manifest: Mapping[str, Any] | str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply -f -`` of a manifest (dict -> JSON, or YAML/JSON text)."""
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl("apply", "-f", "-", *args, input=text, check=check)

    def helm(
        self,
        *args: str,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real helm against this cluster (text mode)."""
        argv = [str(self.bin_dir / "helm"), f"--kubeconfig={self.kubeconfig}", *args]
        return self._run(argv, input, check, timeout)

    # -- raw API access -----------------------------------------------------------

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the API server and presenting the admin cert."""
        return _tls_context(self.pki.serving_ca, self.pki.admin_cert, self.pki.admin_key)

    def get_raw(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET ``path`` on the API server as admin; returns (status, body)."""
        return _https_get(self.api_url + path, self.admin_ssl_context(), timeout)

    def api(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        """One REST call as admin, without a kubectl process (for tests that send
        hundreds of objects). Returns (HTTP status, parsed JSON body or None);
        4xx/5xx are returned, not raised. PATCH bodies: pass ``content_type``
        (e.g. ``application/merge-patch+json``). ``raw`` sends those exact bytes
        instead of ``body`` as JSON."""
        data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.api_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self._api_ctx is None:
            self._api_ctx = self.admin_ssl_context()
        try:
            with urllib.request.urlopen(req, context=self._api_ctx, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def create_node(
        self,
        name: str,
        allocatable: Mapping[str, str],
        *,
        capacity: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
        unschedulable: bool = False,
        ready: bool = True,
    ) -> dict[str, Any]:
        """Create a Node object as KWOK would: no kubelet behind it, just capacity,
        allocatable, labels, taints and a Ready condition, so kube-scheduler can
        bind pods to it.

        The TaintNodesByCondition admission plugin adds
        ``node.kubernetes.io/not-ready:NoSchedule`` to every new Node (the node
        lifecycle controller, absent here, would remove it once Ready). The taints
        are therefore set by a second call, which leaves exactly ``taints``."""
        node = node_manifest(name, allocatable, capacity=capacity, labels=labels,
                             unschedulable=unschedulable, ready=ready)
        status, created = self.api("POST", "/api/v1/nodes", node)
        if status != 201:
            raise HarnessError(f"creating node {name}: HTTP {status}: {created}")
        status, patched = self.api(
            "PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": [dict(t) for t in taints] or None}},
            content_type="application/merge-patch+json",
        )
        if status != 200:
            raise HarnessError(f"setting the taints of node {name}: HTTP {status}: {patched}")
        result: dict[str, Any] = patched
        return result

    def delete_node(self, name: str) -> None:
        """Delete a Node (pods bound to it stay, as without a pod GC controller)."""
        status, body = self.api("DELETE", f"/api/v1/nodes/{name}")
        if status not in (200, 404):
            raise HarnessError(f"deleting node {name}: HTTP {status}: {body}")

    def force_delete_pod(self, namespace: str, name: str) -> None:
        """Delete a Pod at once (grace period 0): a bound Pod would otherwise wait for
        a kubelet that does not exist."""
        status, body = self.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0")
        if status not in (200, 404):
            raise HarnessError(f"deleting pod {namespace}/{name}: HTTP {status}: {body}")

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        manifest = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(labels or {})},
        }
        self.kubectl("create", "-f", "-", input=json.dumps(manifest))
        return name

    def create_resource_quota(
        self,
        namespace: str,
        name: str,
        hard: Mapping[str, str],
        used: Mapping[str, str] | None = None,
        scopes: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Create a ResourceQuota and fill in its status as the (absent) quota
        controller would.

        Without kube-controller-manager a new quota's ``status.hard`` stays
        empty, and the ResourceQuota admission plugin only enforces what is in
        ``status.hard``, so a plain ``kubectl create`` of a quota enforces
        nothing here. ``used`` defaults to zero for every resource: right for a
        fresh namespace. After that the admission plugin itself keeps
        ``status.used`` up to date as objects are created (not on delete).
        """
        manifest: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": dict(hard)},
        }
        if scopes:
            manifest["spec"]["scopes"] = list(scopes)
        self.kubectl("create", "-f", "-", input=json.dumps(manifest))
        status = {
            "status": {
                "hard": dict(hard),
                "used": dict(used) if used is not None else dict.fromkeys(hard, "0"),
            }
        }
        result = self.kubectl(
            "patch",
            "resourcequota",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
            "-o",
            "json",
        )
        quota: dict[str, Any] = json.loads(result.stdout)
        return quota

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd."""
        for proc in reversed(self.processes):
            proc.stop(timeout=20)
        self.processes.clear()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def external_cluster(kubeconfig: Path, workdir: Path) -> Cluster:
    """A Cluster for an existing API server (kind, for users with Docker), driven by
    the kubectl and helm on PATH. No processes are ours to stop."""
    tools = [shutil.which(t) for t in ("kubectl", "helm")]
    if not all(tools):
        raise HarnessError("ENVELOPE_E2E_KUBECONFIG needs kubectl and helm on PATH")
    bin_dir = Path(str(tools[0])).parent
    api_url = subprocess.run(
        [str(tools[0]), f"--kubeconfig={kubeconfig}", "config", "view", "--minify",
         "-o", "jsonpath={.clusters[0].cluster.server}"],
        capture_output=True, text=True, check=True).stdout
    return Cluster(bin_dir=bin_dir, workdir=workdir, kubeconfig=kubeconfig, api_url=api_url,
                   pki=None, etcd_url="")  # type: ignore[arg-type]


def _kubeconfig_yaml(api_url: str, pki: ControlPlanePKI) -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: envelope-e2e
  cluster:
    server: {api_url}
    certificate-authority: {pki.serving_ca}
users:
- name: envelope-e2e-admin
  user:
    client-certificate: {pki.admin_cert}
    client-key: {pki.admin_key}
contexts:
- name: envelope-e2e
  context:
    cluster: envelope-e2e
    user: envelope-e2e-admin
    namespace: default
current-context: envelope-e2e
preferences: {{}}
"""


def wait_until(
    what: str,
    check: Callable[[], bool],
    proc: ManagedProcess,
    timeout: float,
    interval: float = 0.25,
) -> None:
    """Poll ``check`` until it returns true; raise HarnessError (with the log tail of
    ``proc``) when ``proc`` exits or ``timeout`` passes. Exceptions from ``check`` count
    as "not yet"."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        if not proc.alive():
            raise HarnessError(
                f"{proc.name} exited with code {proc.popen.returncode} while waiting for "
                f"{what}. Log {proc.log_path}:\n{proc.log_tail()}"
            )
        try:
            if check():
                return
        except Exception as err:
            last_error = f"{type(err).__name__}: {err}"
        if time.monotonic() > deadline:
            raise HarnessError(
                f"timed out after {timeout:.0f}s waiting for {what}"
                f"{' (last error: ' + last_error + ')' if last_error else ''}. "
                f"Log {proc.log_path}:\n{proc.log_tail()}"
            )
        time.sleep(interval)


class _PortConflict(HarnessError):
    """A process lost the race for a port that free_port() had found free."""


def _wait_started(what: str, check: Callable[[], bool], proc: ManagedProcess, timeout: float) -> None:
    """wait_until, but stop ``proc`` on failure and tell a port conflict apart."""
    try:
        wait_until(what, check, proc, timeout)
    except BaseException as err:
        proc.stop(timeout=5)
        if isinstance(err, HarnessError) and "address already in use" in proc.log_tail(200):
            raise _PortConflict(str(err)) from None
        raise


def _start_etcd(bin_dir: Path, workdir: Path, attempt: int) -> tuple[ManagedProcess, str]:
    client, peer = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    data_dir = workdir / "etcd-data"
    shutil.rmtree(data_dir, ignore_errors=True)  # a failed attempt's member config
    cmd: list[str | Path] = [
        bin_dir / "etcd",
        "--name=envelope-e2e",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=envelope-e2e={peer_url}",
        "--initial-cluster-state=new",
        # Test data only: skip fsync, as envtest does, for speed.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]
    log = workdir / ("etcd.log" if attempt == 0 else f"etcd.{attempt}.log")
    proc = start_process(cmd, log, name="etcd")

    def healthy() -> bool:
        with urllib.request.urlopen(f"{client_url}/health", timeout=2) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")

    _wait_started(f"etcd health at {client_url}", healthy, proc, timeout=30)
    return proc, client_url


def _start_apiserver(
    bin_dir: Path, workdir: Path, etcd_url: str, pki: ControlPlanePKI, attempt: int,
    extra_args: Sequence[str] = (),
) -> tuple[ManagedProcess, str]:
    port = free_port()
    api_url = f"https://127.0.0.1:{port}"
    cmd: list[str | Path] = [
        bin_dir / "kube-apiserver",
        f"--etcd-servers={etcd_url}",
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.client_ca}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--service-account-issuer=https://127.0.0.1",
        f"--service-account-key-file={pki.sa_public_key}",
        f"--service-account-signing-key-file={pki.sa_private_key}",
        "--authorization-mode=RBAC",
        # On by default; listed so a changed default cannot silently drop them.
        "--enable-admission-plugins=LimitRanger,ResourceQuota,"
        "MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
        # No token controller runs, so Pods could never get their token volume.
        "--disable-admission-plugins=ServiceAccount",
        "--allow-privileged=true",
        # 1.37 refuses a loopback advertise address for the kubernetes Service's
        # endpoints (nothing here needs them); the same on 1.35 and 1.36.
        "--endpoint-reconciler-type=none",
        *extra_args,
    ]
    log = workdir / ("kube-apiserver.log" if attempt == 0 else f"kube-apiserver.{attempt}.log")
    proc = start_process(cmd, log, name="kube-apiserver")
    ctx = _tls_context(pki.serving_ca, pki.admin_cert, pki.admin_key)

    def ready() -> bool:
        status, _ = _https_get(f"{api_url}/readyz", ctx, timeout=5)
        return status == 200

    _wait_started(f"kube-apiserver /readyz at {api_url}", ready, proc, timeout=READY_TIMEOUT)
    return proc, api_url


def start_control_plane(workdir: Path, bin_dir: Path, *, attempts: int = 3,
                        apiserver_args: Sequence[str] = ()) -> Cluster:
    """Start etcd and kube-apiserver under ``workdir`` (logs, data, certs, kubeconfig).
    ``apiserver_args`` are appended to kube-apiserver's flags (e.g.
    ``--admission-control-config-file=...``).

    Returns once /readyz answers 200; raises HarnessError (with the log tail)
    otherwise. A start that loses a port race is retried on new ports.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    pki = make_control_plane_pki(workdir / "pki")
    etcd: ManagedProcess | None = None
    try:
        for attempt in range(attempts):
            try:
                etcd, etcd_url = _start_etcd(bin_dir, workdir, attempt)
                break
            except _PortConflict:
                if attempt + 1 == attempts:
                    raise
        assert etcd is not None
        for attempt in range(attempts):
            try:
                apiserver, api_url = _start_apiserver(bin_dir, workdir, etcd_url, pki, attempt,
                                                     apiserver_args)
                break
            except _PortConflict:
                if attempt + 1 == attempts:
                    raise
    except BaseException:
        if etcd is not None:
            etcd.stop(timeout=5)
        raise
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(_kubeconfig_yaml(api_url, pki))
    kubeconfig.chmod(0o600)
    return Cluster(
        bin_dir=bin_dir,
        workdir=workdir,
        kubeconfig=kubeconfig,
        api_url=api_url,
        pki=pki,
        etcd_url=etcd_url,
        processes=[etcd, apiserver],
    )


def node_manifest(
    name: str,
    allocatable: Mapping[str, str],
    *,
    capacity: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
) -> dict[str, Any]:
    """A Node object with status filled in (what a kubelet would report)."""
    alloc = dict(allocatable)
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **dict(labels or {})}
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels},
        "spec": spec,
        "status": {
            "capacity": dict(capacity) if capacity is not None else alloc,
            "allocatable": alloc,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "EnvelopeE2E",
                    "message": "a Node object without a kubelet (as KWOK makes)",
                }
            ],
            "phase": "Running",
        },
    }


