"""A real Kubernetes control plane (etcd + kube-apiserver) for end-to-end tests.

This is what controller-runtime's envtest does, in Python: the binaries are
built from the upstream Go modules by ``e2e/controlplane/build.sh`` (cached
outside the clone), certificates are made with ``cryptography``, and the
processes run on free ports on 127.0.0.1. kube-scheduler is started on
demand (``start_scheduler``) with one profile, ``envelope-oracle``, and binds
only Pods that name it to Node objects the tests create (no kubelet, as KWOK).
No controllers run: Deployments
create no Pods, namespaces never finish deleting, nothing is garbage
collected.

The pytest fixtures live in ``e2e/conftest.py``; everything here is plain
functions and classes so it can be reused outside pytest, e.g.::

    bin_dir = locate_bin_dir()
    with start_control_plane(Path("/tmp/cp"), bin_dir) as cluster:
        cluster.kubectl("get", "namespaces")
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "e2e" / "controlplane" / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kubectl", "helm")
BIN_ENV = "ENVELOPE_CONTROLPLANE_BIN"

READY_TIMEOUT = 120.0
"""Seconds to wait for kube-apiserver's /readyz."""

# Names used by the webhook registration (see register_webhook).
MUTATING_WEBHOOK_NAME = "workloads.mutate.envelope.io"
VALIDATING_WEBHOOK_NAME = "workloads.validate.envelope.io"
WEBHOOK_CONFIGURATION_NAME = "envelope-e2e"
PROBE_NAMESPACE = "envelope-e2e-probe"
ISOLATED_NAMESPACE_LABEL = "envelope.test/isolated"
"""Namespaces carrying this label (any value) are skipped by the session
webhook's configurations, for tests that register a webhook of their own."""


class HarnessError(RuntimeError):
    """The control plane (or the webhook) could not be built, started or used."""


class CommandError(subprocess.CalledProcessError):
    """A kubectl/helm call failed; str() includes its stdout and stderr."""

    def __str__(self) -> str:
        cmd = " ".join(str(c) for c in self.cmd) if isinstance(self.cmd, list) else self.cmd
        return (
            f"command failed with exit code {self.returncode}: {cmd}\n"
            f"--- stdout ---\n{self.stdout or ''}\n--- stderr ---\n{self.stderr or ''}"
        )


# --------------------------------------------------------------------------- ports


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free right now.

    The port is released before returning, so another process could take it in
    between; start_control_plane retries on a bind conflict.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# ---------------------------------------------------------------------- certificates


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signing for every certificate; certificate and CRL signing for a CA only."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA that can issue leaf certificates."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, common_name: str) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(ski, critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert=cert, key=key)

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        sans: Iterable[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """Issue a leaf certificate; ``sans`` are IP addresses or DNS names."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = []
        for san in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key

    def write(self, path: Path) -> Path:
        return _write(path, _cert_pem(self.cert))


def write_cert_and_key(
    cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    cert_path: Path,
    key_path: Path,
) -> tuple[Path, Path]:
    _write(cert_path, _cert_pem(cert))
    _write(key_path, _key_pem(key), 0o600)
    return cert_path, key_path


def make_serving_cert(
    tmpdir: Path | str,
    sans: Iterable[str] = ("127.0.0.1", "localhost"),
    *,
    name: str = "serving",
) -> tuple[Path, Path, Path]:
    """Make a fresh CA and a TLS serving certificate signed by it.

    Returns ``(ca_pem_path, cert_path, key_path)`` in ``tmpdir``: the files
    ``<name>-ca.crt``, ``<name>.crt`` and ``<name>.key`` (PEM, PKCS#8 key).
    The certificate carries every entry of ``sans`` as a SAN (IP or DNS name),
    and the first one as its common name.
    """
    sans = list(sans)
    if not sans:
        raise ValueError("a serving certificate needs at least one SAN")
    directory = Path(tmpdir)
    ca = CertificateAuthority.create(f"envelope-e2e-{name}-ca")
    cert, key = ca.issue(sans[0], sans=sans, server=True)
    ca_path = ca.write(directory / f"{name}-ca.crt")
    cert_path, key_path = write_cert_and_key(cert, key, directory / f"{name}.crt", directory / f"{name}.key")
    return ca_path, cert_path, key_path


@dataclass(frozen=True)
class ControlPlanePKI:
    """All certificates and keys the control plane needs, as file paths."""

    serving_ca: Path
    serving_cert: Path
    serving_key: Path
    client_ca: Path
    admin_cert: Path
    admin_key: Path
    sa_private_key: Path
    sa_public_key: Path


def make_control_plane_pki(directory: Path) -> ControlPlanePKI:
    """API server serving cert (SANs 127.0.0.1/localhost), client CA, an admin
    client cert in ``system:masters`` and the service-account RSA key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    serving_ca, serving_cert, serving_key = make_serving_cert(
        directory,
        # 10.0.0.1 is the "kubernetes" Service IP in --service-cluster-ip-range.
        ("127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default.svc"),
        name="apiserver",
    )
    client_ca = CertificateAuthority.create("envelope-e2e-client-ca")
    admin, admin_key = client_ca.issue("envelope-e2e-admin", organizations=["system:masters"], client=True)
    admin_cert_path, admin_key_path = write_cert_and_key(
        admin, admin_key, directory / "admin.crt", directory / "admin.key"
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_private = _write(directory / "sa.key", _key_pem(sa_key), 0o600)
    sa_public = _write(
        directory / "sa.pub",
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return ControlPlanePKI(
        serving_ca=serving_ca,
        serving_cert=serving_cert,
        serving_key=serving_key,
        client_ca=client_ca.write(directory / "client-ca.crt"),
        admin_cert=admin_cert_path,
        admin_key=admin_key_path,
        sa_private_key=sa_private,
        sa_public_key=sa_public,
    )


# ------------------------------------------------------------------------ processes

_LIVE: dict[int, ManagedProcess] = {}
_LIVE_LOCK = threading.RLock()  # re-entrant: also taken in signal handlers
_HANDLERS_INSTALLED = False
_PREVIOUS_HANDLERS: dict[int, Any] = {}


# Loaded up front: the preexec hook below runs between fork and exec, where
# importing or loading libraries is not safe.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> None:  # runs in the child, before exec
    """Linux: have the kernel SIGKILL the child if the test process dies hard."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class ManagedProcess:
    """A child process running in its own process group, logging to a file."""

    name: str
    cmd: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``timeout``."""
        try:
            _signal_group(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
            # Also kill anything the leader left behind in its group.
            _signal_group(self.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            with _LIVE_LOCK:
                _LIVE.pop(self.popen.pid, None)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_all_processes() -> None:
    """Stop every process started by start_process that is still registered."""
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for proc in reversed(procs):
        with contextlib.suppress(Exception):
            proc.stop(timeout=5)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all_processes()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # Default action: restore it and re-deliver, so the exit status is right.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_cleanup_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(stop_all_processes)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            _PREVIOUS_HANDLERS[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)


def start_process(
    cmd: Sequence[str | os.PathLike[str]],
    log_path: Path,
    *,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ManagedProcess:
    """Start ``cmd`` in a new process group, stdout+stderr appended to ``log_path``.

    The process is stopped (whole group) by ``ManagedProcess.stop()``, and in
    any case at interpreter exit, on SIGTERM/SIGHUP, and (Linux) by the kernel
    if this process is killed outright.
    """
    _install_cleanup_handlers()
    argv = [os.fspath(c) for c in cmd]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("ab")
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_set_parent_death_signal,
        )
    except BaseException:
        log_file.close()
        raise
    proc = ManagedProcess(
        name=name or Path(argv[0]).name,
        cmd=argv,
        log_path=log_path,
        popen=popen,
        _log_file=log_file,
    )
    with _LIVE_LOCK:
        _LIVE[popen.pid] = proc
    return proc


def stop_process(proc: ManagedProcess, timeout: float = 15.0) -> None:
    """Stop ``proc`` and its whole process group (see ManagedProcess.stop)."""
    proc.stop(timeout=timeout)


# ------------------------------------------------------------------------- binaries


def _binaries_missing(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def locate_bin_dir(*, build_output: IO[str] | None = None) -> Path:
    """Directory holding etcd, kube-apiserver, kubectl and helm.

    ``$ENVELOPE_CONTROLPLANE_BIN`` if set; otherwise run
    ``e2e/controlplane/build.sh`` (a no-op when its cache is warm, a long build
    when cold), writing its progress to ``build_output`` (default: stderr).
    Raises HarnessError with a clear message when that is impossible.
    """
    override = os.environ.get(BIN_ENV)
    if override:
        bin_dir = Path(override).expanduser()
        missing = _binaries_missing(bin_dir)
        if missing:
            raise HarnessError(
                f"${BIN_ENV}={override} lacks executable(s): {', '.join(missing)}. "
                f"Unset it to build them with {BUILD_SCRIPT.relative_to(REPO_ROOT)}."
            )
        return bin_dir
    if shutil.which("go") is None:
        raise HarnessError(
            "The e2e control plane (etcd, kube-apiserver, kubectl, helm) is not "
            f"available: ${BIN_ENV} is not set and the Go toolchain ('go') is not on "
            f"PATH, so {BUILD_SCRIPT.relative_to(REPO_ROOT)} cannot build it. Install Go "
            f">= 1.25, or point ${BIN_ENV} at a directory holding the four binaries."
        )
    out = build_output if build_output is not None else sys.stderr
    try:
        out.flush()
        stderr: IO[str] | int = out if out.fileno() >= 0 else subprocess.PIPE
    except (AttributeError, OSError, ValueError):  # e.g. a capture buffer: no fd
        stderr = subprocess.PIPE
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        check=False,
        cwd=REPO_ROOT,
    )
    if proc.stderr:
        out.write(proc.stderr)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise HarnessError(
            f"{BUILD_SCRIPT.relative_to(REPO_ROOT)} failed with exit code {proc.returncode}; "
            "see its output above and the build logs under "
            "${ENVELOPE_CONTROLPLANE_DIR:-~/.cache/envelope/controlplane}/<key>/logs/."
            + ("\n" + "\n".join(proc.stderr.splitlines()[-30:]) if proc.stderr else "")
        )
    bin_dir = Path(lines[-1])
    missing = _binaries_missing(bin_dir)
    if missing:
        raise HarnessError(f"build.sh reported {bin_dir}, which lacks {', '.join(missing)}")
    return bin_dir


# ----------------------------------------------------------------------- the cluster


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
    cmd = [
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
    cmd = [
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


# ---------------------------------------------------------------- kube-scheduler

SCHEDULER_NAME = "envelope-oracle"
"""The only profile of the harness's kube-scheduler: it schedules the Pods whose
``spec.schedulerName`` is this, and leaves every other test's Pods alone."""


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


@dataclass
class Scheduler:
    """kube-scheduler running against the harness API server (profile SCHEDULER_NAME)."""

    process: ManagedProcess
    scheduler_name: str
    port: int

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def stop(self) -> None:
        self.process.stop(timeout=10)


def pod_schedule_outcome(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """``("bound", node)`` once a Pod has a node, ``("unschedulable", message)``
    once kube-scheduler has marked it PodScheduled=False/Unschedulable, else None."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return ("bound", str(node))
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return ("unschedulable", str(cond.get("message", "")))
    return None


def start_scheduler(cluster: Cluster, workdir: Path, *, timeout: float = 60.0) -> Scheduler:
    """Start kube-scheduler with a kubeconfig for the harness API server and wait
    until it has bound a probe Pod to a probe Node (both deleted again), so the
    caller knows its informers run and it binds.

    One profile, ``schedulerName: envelope-oracle``; no leader election; a high
    client QPS so hundreds of scenarios are not throttled."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = workdir / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        "clientConnection:\n"
        f"  kubeconfig: {cluster.kubeconfig}\n"
        "  qps: 500\n"
        "  burst: 1000\n"
        "leaderElection:\n"
        "  leaderElect: false\n"
        "profiles:\n"
        f"- schedulerName: {SCHEDULER_NAME}\n"
    )
    cmd = [
        cluster.bin_dir / "kube-scheduler",
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'scheduler-certs'}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "-v=1",
    ]
    proc = start_process(cmd, workdir / "kube-scheduler.log", name="kube-scheduler")
    probe_ns = "envelope-e2e-scheduler-probe"
    node_name = unique_name("scheduler-probe-node")
    pod_name = "probe"
    try:
        status, _ = cluster.api("GET", f"/api/v1/namespaces/{probe_ns}")
        if status == 404:
            cluster.create_namespace(probe_ns, labels={ISOLATED_NAMESPACE_LABEL: "true"})
        cluster.create_node(node_name, {"cpu": "1", "memory": "1Gi", "pods": "10"},
                            labels={"envelope.test/scheduler-probe": node_name})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": probe_ns},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "nodeSelector": {"envelope.test/scheduler-probe": node_name},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        cluster.force_delete_pod(probe_ns, pod_name)
        status, body = cluster.api("POST", f"/api/v1/namespaces/{probe_ns}/pods", pod)
        if status != 201:
            raise HarnessError(f"creating the scheduler probe pod: HTTP {status}: {body}")

        def bound() -> bool:
            _, got = cluster.api("GET", f"/api/v1/namespaces/{probe_ns}/pods/{pod_name}")
            return pod_schedule_outcome(got or {}) == ("bound", node_name)

        wait_until("kube-scheduler to bind a probe pod", bound, proc, timeout)
        cluster.force_delete_pod(probe_ns, pod_name)
        cluster.delete_node(node_name)
    except BaseException:
        proc.stop(timeout=5)
        raise
    return Scheduler(process=proc, scheduler_name=SCHEDULER_NAME, port=port)


# ------------------------------------------------------------------------ webhook


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
CRD_DIR = Path(__file__).resolve().parent / "crds"
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
    ``envelope.test/isolated`` are left to tests that run a webhook of their own."""
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


def unique_name(prefix: str, max_length: int = 63) -> str:
    """A DNS-1123 label: ``prefix`` (sanitised, truncated) plus a random suffix."""
    cleaned = "".join(c if c.isalnum() else "-" for c in prefix.lower())
    cleaned = "-".join(part for part in cleaned.split("-") if part) or "e2e"
    suffix = uuid.uuid4().hex[:6]
    return f"{cleaned[: max_length - len(suffix) - 1].rstrip('-')}-{suffix}"
