"""A real node: containerd (runc) and the kubelet, registered with a harness API server,
running pods in cgroup v1 hierarchies on this machine, and torn down leaving nothing.

What it takes on these machines (docs/testing.md, "The node"; measured on the VMs the
developers and CI use: cgroup v1 mounted read-write, root without CAP_SYS_RESOURCE):

- Debian's ``containerd`` (1.6), ``runc``, ``containernetworking-plugins`` and
  ``busybox-static``; a missing one fails with the ``apt-get install`` line to run
  (``node_prerequisites``);
- the kubelet built from the ``k8s.io/kubernetes`` Go module at the API server's version
  (``e2e/controlplane/build.sh`` with ``ENVELOPE_CONTROLPLANE_KUBELET=1``);
- containerd's CRI with ``restrict_oom_score_adj`` (the sandbox cannot lower its OOM score
  without CAP_SYS_RESOURCE), runc with ``SystemdCgroup = false``, a loopback-only CNI
  conflist (the node turns Ready; pods use ``hostNetwork``), and images imported from an
  OCI layout tarball (``e2e/controlplane/build-node-image.py``; no registry);
- the kubelet with ``failCgroupV1: false``, ``cgroupDriver: cgroupfs``, a cgroup root of
  its own (``/envelope-node-<id>`` in every v1 hierarchy, so two sessions' nodes never
  share ``kubepods``), its root dir, pod logs, socket and ports under the work dir, on
  127.0.0.1 (``--node-ip``).

Nothing of the host is changed. The kubelet runs in a mount namespace of its own (slave
propagation: it sees the host's mounts, its own never leave it) where the six sysctls it
would otherwise set on the host (vm.overcommit_memory, kernel.panic, ...:
``setupKernelTunables`` in pkg/kubelet/cm/container_manager_linux.go) read as the values
it wants, and without ``iptables`` on its PATH (it would add a KUBE-FIREWALL chain to the
host's filter table: pkg/kubelet/kubelet_network_linux.go). So the kubelet mounts no
volume containerd can see: secret, projected and memory-backed emptyDir volumes are not
usable on this node (none of the node tests needs one; the API server's ServiceAccount
admission plugin is off in the harness, so no token volume is added).

``Node.stop()`` deletes the node's pods through the API server (the kubelet tears them
down), stops the kubelet, kills and deletes what containerd still runs, stops containerd
and its shims, unmounts what is left under the work dir, removes the cgroup root from
every hierarchy and the container log links it left in /var/log/containers; then
``leftovers()`` is empty (the fixture asserts it).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import BUILD_SCRIPT, REPO_ROOT, HarnessError, unique_name
from .cluster import Cluster
from .ports import free_port
from .processes import ManagedProcess, start_process

CGROUP_FS = Path("/sys/fs/cgroup")
CNI_BIN_DIR = Path(os.environ.get("ENVELOPE_NODE_CNI_BIN", "/usr/lib/cni"))
IMAGE_BUILD_SCRIPT = REPO_ROOT / "e2e" / "controlplane" / "build-node-image.py"
BUSYBOX_IMAGE = "docker.io/local/busybox:1"
PAUSE_IMAGE = "docker.io/local/pause:1"
CRI_NAMESPACE = "k8s.io"
LEGACY_LOG_DIR = Path("/var/log/containers")
SHIM_SOCKET_DIR = Path("/run/containerd/s")
#: What the kubelet sets on the host unless told not to (setupKernelTunables, v1.37.2);
#: here it reads these values in its own mount namespace and the host keeps its own.
KERNEL_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
#: Packages (Debian names) of what the node runs.
PACKAGES: dict[str, str] = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
}
NODE_LEASE_SECONDS = 10
"""The kubelet renews its Lease every quarter of this (2.5 s) and posts its status every
NODE_STATUS_SECONDS: a stopped kubelet is noticed by the node lifecycle controller within
its --node-monitor-grace-period (start_controller_manager(..., kubelets=True))."""
NODE_STATUS_SECONDS = 2


def node_prerequisites() -> list[str]:
    """What this machine lacks to run the node, each with what to install; empty when
    nothing is missing."""
    missing: dict[str, str] = {}
    for tool, package in PACKAGES.items():
        if shutil.which(tool) is None and not (Path("/usr/sbin") / tool).exists():
            missing[tool] = package
    if not (CNI_BIN_DIR / "loopback").exists():
        missing[str(CNI_BIN_DIR / "loopback")] = "containernetworking-plugins"
    if not Path("/bin/busybox").exists():
        missing["/bin/busybox"] = "busybox-static"
    problems = []
    if missing:
        packages = sorted(set(missing.values()))
        problems.append(f"missing {', '.join(sorted(missing))}: apt-get install -y {' '.join(packages)}")
    if not (CGROUP_FS / "cpu" / "cpu.cfs_quota_us").exists() or not (CGROUP_FS / "memory").is_dir():
        problems.append(f"no cgroup v1 cpu and memory hierarchies under {CGROUP_FS}: the e2e node runs on "
                        "cgroup v1 only (docs/fidelity.md, 'The node')")
    if os.geteuid() != 0:
        problems.append("the e2e node must run as root (containerd, runc and the kubelet's cgroups)")
    return problems


def _run_script(argv: list[str], env: Mapping[str, str], what: str, timeout: float) -> Path:
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env},
                          cwd=REPO_ROOT, timeout=timeout, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise HarnessError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return Path(lines[-1])


def kubelet_binary(version: str | None = None) -> Path:
    """The kubelet built by build.sh (ENVELOPE_CONTROLPLANE_KUBELET=1) at ``version`` (default:
    versions.env's KUBERNETES_VERSION), or ``$ENVELOPE_KUBELET_BIN/kubelet``. Waits on the
    build's lock when `make test`'s background prebuild is building it."""
    override = os.environ.get("ENVELOPE_KUBELET_BIN")
    if override:
        return Path(override) / "kubelet"
    env = {"ENVELOPE_CONTROLPLANE_KUBELET": "1"}
    if version:
        env["ENVELOPE_CONTROLPLANE_KUBERNETES"] = version
    bin_dir = _run_script(["bash", str(BUILD_SCRIPT)], env, "building the kubelet (build.sh)", 3600)
    return bin_dir / "kubelet"


def node_images() -> Path:
    """The OCI layout tarball of the node's images (built once, cached)."""
    return _run_script([sys.executable, str(IMAGE_BUILD_SCRIPT)], {}, "build-node-image.py", 120)


def _hierarchies(*, unified: bool = False) -> list[Path]:
    """The cgroup v1 hierarchies mounted under /sys/fs/cgroup (cpu, memory, systemd, ...);
    ``unified``: the cgroup2 one of a hybrid host too (/sys/fs/cgroup/unified, where runc
    makes each container's cgroup as well)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        mountpoint = Path(left.split()[4])
        if (fstype == "cgroup" or (unified and fstype == "cgroup2")) and mountpoint.parent == CGROUP_FS:
            out.append(mountpoint)
    return sorted(set(out))


def _mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root``, deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].replace("\\040", " "))
        if point == root or root in point.parents:
            found.append(point)
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


_LIBC = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2


def _umount(point: Path) -> None:
    _LIBC.umount2(os.fsencode(point), _MNT_DETACH)


def _pids_in(cgroup: Path) -> list[int]:
    pids: list[int] = []
    for procs in cgroup.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def _remove_cgroup_tree(root: Path) -> None:
    """rmdir ``root`` and every cgroup below it, deepest first, killing what still runs."""
    if not root.is_dir():
        return
    for _ in range(20):
        pids = _pids_in(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.25)
    dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for d in [*dirs, root]:
        for _ in range(20):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.25)


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (containerd's shims name its socket)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(proc.name))
    return pids


KNOWN_NOISE = ("nodeIP can't be loopback address",)
"""Log lines left out of failure messages: the kubelet refuses 127.0.0.1 as the Node's
address at every status update (pkg/kubelet/nodestatus ``validateNodeIP``), so the Node has
none; nothing here reaches the kubelet through the API server (logs and cgroups are read
on the host)."""


def _tail(proc: ManagedProcess, lines: int = 40) -> str:
    kept = [line for line in proc.log_tail(2000).splitlines() if not any(n in line for n in KNOWN_NOISE)]
    return "\n".join(kept[-lines:])


@dataclass
class Node:
    """containerd + the kubelet running one Node of ``cluster``."""

    name: str
    cluster: Cluster
    workdir: Path
    kubelet_bin: Path
    cgroup_root: str
    containerd: ManagedProcess
    kubelet: ManagedProcess | None = None
    kubelet_port: int = 0
    healthz_port: int = 0
    _seen_ids: set[str] = field(default_factory=set)
    _made_dirs: list[Path] = field(default_factory=list)
    _kubelet_starts: int = 0

    # -- paths ------------------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    def cgroup(self, controller: str, *parts: str) -> Path:
        """``/sys/fs/cgroup/<controller>/<cgroup root>/kubepods/<parts...>``."""
        return CGROUP_FS / controller / self.cgroup_root.strip("/") / "kubepods" / Path(*parts)

    # -- containerd ---------------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        done = subprocess.run(["ctr", "--address", str(self.socket), "-n", CRI_NAMESPACE, *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise HarnessError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def container_ids(self) -> list[str]:
        ids = self.ctr("containers", "ls", "-q", check=False).split()
        self._seen_ids.update(ids)
        return ids

    # -- the kubelet --------------------------------------------------------------------

    def _kubelet_config(self) -> Path:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # Refused by default since 1.35; these machines have cgroup v1 only.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.pod_logs),
            "failSwapOn": False,
            # No image is ever pulled: never collect the imported ones.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # The machine is shared: a busy neighbour must not make the node evict.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "nodeStatusUpdateFrequency": f"{NODE_STATUS_SECONDS}s",
            "nodeStatusReportFrequency": f"{NODE_STATUS_SECONDS}s",
            "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "serializeImagePulls": False,
            "resolvConf": "/etc/resolv.conf",
        }
        path = self.workdir / "kubelet-config.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    def start_kubelet(self, *, timeout: float = 120.0) -> None:
        """Start the kubelet (again) and wait until the Node is Ready (not necessarily
        untainted: see ``wait_ready``)."""
        if self.kubelet is not None and self.kubelet.alive():
            raise HarnessError("the kubelet is already running")
        self.kubelet_port = self.kubelet_port or free_port()
        self.healthz_port = self.healthz_port or free_port()
        config = self._kubelet_config()
        tunables = self.workdir / "sysctl"
        tunables.mkdir(exist_ok=True)
        binds = []
        for name, value in KERNEL_TUNABLES.items():
            fake = tunables / name.replace("/", "_")
            fake.write_text(value + "\n")
            target = Path("/proc/sys") / name
            if target.exists():
                binds.append(f"mount --bind {fake} {target}")
        kubelet = [
            str(self.kubelet_bin),
            f"--config={config}",
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--root-dir={self.workdir / 'kubelet'}",
            f"--cert-dir={self.workdir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            "--node-ip=127.0.0.1",
            "--v=2",
        ]
        script = " && ".join([*binds, 'exec "$@"'])
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.workdir)}  # no /usr/sbin: no iptables
        self._kubelet_starts += 1
        self.kubelet = start_process(
            ["unshare", "--mount", "--propagation", "slave", "--",
             "/bin/sh", "-c", script, "kubelet", *kubelet],
            self.workdir / f"kubelet.{self._kubelet_starts}.log", name="kubelet", env=env)
        self.wait_ready(timeout=timeout)

    def stop_kubelet(self) -> None:
        """Stop the kubelet; its pods keep running in containerd, as on a real node."""
        if self.kubelet is not None:
            self.kubelet.stop(timeout=15)
            self.kubelet = None

    def node_object(self) -> dict[str, Any]:
        status, body = self.cluster.api("GET", f"/api/v1/nodes/{self.name}")
        if status != 200:
            raise HarnessError(f"GET node {self.name}: HTTP {status}: {body}")
        got: dict[str, Any] = body
        return got

    def ready(self) -> str:
        """The Node's Ready condition status ("True", "False", "Unknown" or "")."""
        with contextlib.suppress(HarnessError):
            for cond in (self.node_object().get("status") or {}).get("conditions") or []:
                if cond.get("type") == "Ready":
                    return str(cond.get("status"))
        return ""

    def wait_ready(self, *, timeout: float = 120.0, untainted: bool = False) -> None:
        """Wait for Ready; ``untainted``: also for the node lifecycle controller to lift the
        ``node.kubernetes.io/not-ready`` taint a new Node gets (TaintNodesByCondition), which
        only a running kube-controller-manager does (pods bound by ``spec.nodeName`` do not
        need it: the kubelet checks NoExecute taints only)."""
        def ok() -> bool:
            node = self.node_object()
            taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
            return self.ready() == "True" and not (untainted and "node.kubernetes.io/not-ready" in taints)

        self.wait(f"Node {self.name} Ready{' and untainted' if untainted else ''}", ok, timeout)

    def wait(self, what: str, check: Callable[[], bool], timeout: float, interval: float = 0.5) -> None:
        """Poll ``check``; fail with the kubelet's and containerd's log tails."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for proc in (self.containerd, self.kubelet):
                if proc is not None and not proc.alive():
                    raise HarnessError(f"{proc.name} exited ({proc.popen.returncode}) while waiting for "
                                       f"{what}. Log {proc.log_path}:\n{_tail(proc, 60)}")
            try:
                if check():
                    return
            except Exception as err:
                last = f"{type(err).__name__}: {err}"
            time.sleep(interval)
        tails = "\n".join(f"--- {p.name} ({p.log_path}) ---\n{_tail(p)}"
                          for p in (self.kubelet, self.containerd) if p is not None)
        raise HarnessError(f"timed out after {timeout:.0f}s waiting for {what}"
                           f"{' (last error: ' + last + ')' if last else ''}\n{tails}")

    # -- pods ---------------------------------------------------------------------------

    def pod_cgroup_dir(self, pod: Mapping[str, Any]) -> str:
        """The pod's cgroup below kubepods, as the kubelet names it (cgroupfs driver):
        ``pod<uid>`` for Guaranteed, ``<qos>/pod<uid>`` otherwise
        (pkg/kubelet/cm/pod_container_manager_linux.go GetPodContainerName)."""
        qos = str((pod.get("status") or {}).get("qosClass") or "")
        uid = pod["metadata"]["uid"]
        return f"pod{uid}" if qos == "Guaranteed" else f"{qos.lower()}/pod{uid}"

    def container_cgroup(self, pod: Mapping[str, Any], container: str, controller: str) -> Path:
        """A running container's cgroup directory in ``controller``'s hierarchy."""
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == container and status.get("containerID"):
                cid = str(status["containerID"]).split("://", 1)[1]
                return self.cgroup(controller, self.pod_cgroup_dir(pod), cid)
        raise HarnessError(f"container {container} of pod {pod['metadata']['name']} has no container ID yet")

    def container_log(self, pod: Mapping[str, Any], container: str) -> str:
        """What the container wrote (all its runs), read from the kubelet's pod log dir."""
        meta = pod["metadata"]
        d = self.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container
        return "".join(p.read_text(errors="replace") for p in sorted(d.glob("*.log")))

    def running_tasks(self) -> list[str]:
        """containerd's running tasks (an exited container's task is deleted at once by the CRI;
        its container stays until the kubelet's garbage collection)."""
        self.container_ids()
        return self.ctr("tasks", "ls", "-q", check=False).split()

    def delete_pods(self, timeout: float = 60.0) -> None:
        """Delete every Pod bound to this node and wait until containerd runs no task."""
        status, body = self.cluster.api("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")
        for pod in (body or {}).get("items") or [] if status == 200 else []:
            meta = pod["metadata"]
            self.cluster.api("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                             "?gracePeriodSeconds=0")
        if self.kubelet is not None and self.kubelet.alive():
            with contextlib.suppress(HarnessError):
                self.wait("containerd to run no task", lambda: not self.running_tasks(), timeout)

    # -- teardown -------------------------------------------------------------------------

    def stop(self) -> None:
        """Tear everything down (see the module's docstring); idempotent."""
        with contextlib.suppress(Exception):
            self.delete_pods(timeout=60)
        self.stop_kubelet()
        if self.containerd.alive():
            ids = self.container_ids()
            for cid in ids:
                self.ctr("tasks", "kill", "-s", "SIGKILL", cid, check=False, timeout=20)
            for cid in ids:
                self.ctr("tasks", "delete", "-f", cid, check=False, timeout=20)
                self.ctr("containers", "delete", cid, check=False, timeout=20)
        self.containerd.stop(timeout=15)
        for pid in _processes_mentioning(f"-address {self.socket}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for point in _mounts_under(self.workdir):
            _umount(point)
        for hierarchy in _hierarchies(unified=True):
            _remove_cgroup_tree(hierarchy / self.cgroup_root.strip("/"))
        for cid in self._seen_ids:  # a killed shim leaves its socket behind
            digest = hashlib.sha256(os.path.join(str(self.socket), CRI_NAMESPACE, cid).encode()).hexdigest()
            with contextlib.suppress(OSError):
                (SHIM_SOCKET_DIR / digest).unlink()
        if LEGACY_LOG_DIR.is_dir():
            for link in LEGACY_LOG_DIR.iterdir():
                with contextlib.suppress(OSError):
                    if link.is_symlink() and str(self.pod_logs) in os.readlink(link):
                        link.unlink()
        for made in self._made_dirs:  # deepest first; only if empty (another node may use it)
            with contextlib.suppress(OSError):
                made.rmdir()
        if self.cluster is not None:
            with contextlib.suppress(OSError):
                self.cluster.api("DELETE", f"/api/v1/nodes/{self.name}")

    def leftovers(self) -> list[str]:
        """What of this node is still on the machine (empty after stop())."""
        found = [f"process {pid}" for pid in _processes_mentioning(str(self.socket))]
        found += [f"process {pid} (kubelet)"
                  for pid in _processes_mentioning(f"--hostname-override={self.name}")]
        found += [f"mount {p}" for p in _mounts_under(self.workdir)]
        found += [f"cgroup {h / self.cgroup_root.strip('/')}" for h in _hierarchies(unified=True)
                  if (h / self.cgroup_root.strip("/")).exists()]
        if LEGACY_LOG_DIR.is_dir():
            found += [f"log link {p}" for p in LEGACY_LOG_DIR.iterdir()
                      if p.is_symlink() and str(self.pod_logs) in os.readlink(p)]
        for cid in self._seen_ids:
            digest = hashlib.sha256(os.path.join(str(self.socket), CRI_NAMESPACE, cid).encode()).hexdigest()
            if (SHIM_SOCKET_DIR / digest).exists():
                found.append(f"shim socket {SHIM_SOCKET_DIR / digest}")
        return found


def _containerd_config(workdir: Path, socket: Path, cni_conf: Path) -> str:
    root, state = workdir / "containerd" / "root", workdir / "containerd" / "state"
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{socket}"

# Loaded for the tasks service only; its runc state stays in the work dir too.
[plugins."io.containerd.runtime.v1.linux"]
  runtime_root = "{state / 'runc-v1'}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{workdir / 'containerd' / 'opt'}"

{cri}
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # Without CAP_SYS_RESOURCE the sandbox cannot lower its OOM score below containerd's.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false

{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{state / 'runc'}"

{cri[:-1]}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"
"""


def start_node(cluster: Cluster, workdir: Path, *, kubelet_bin: Path | None = None,
               name: str | None = None, timeout: float = 180.0) -> Node:
    """Start containerd and the kubelet for ``cluster`` and wait until the Node is Ready.
    Raises HarnessError naming what to install when this machine cannot run a node."""
    problems = node_prerequisites()
    if problems:
        raise HarnessError("the e2e node cannot run here: " + "; ".join(problems))
    kubelet_bin = kubelet_bin or kubelet_binary()
    images = node_images()
    workdir.mkdir(parents=True, exist_ok=True)
    name = name or unique_name("envelope-node", max_length=30)
    cgroup_root = f"/{name}"
    for hierarchy in _hierarchies():
        d = hierarchy / name
        d.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":  # a new cpuset has no CPUs until it is given its parent's
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((hierarchy / f).read_text())
    cni = workdir / "cni"
    cni.mkdir(exist_ok=True)
    (cni / "10-loopback.conflist").write_text(json.dumps(
        {"cniVersion": "1.0.0", "name": "envelope-loopback", "plugins": [{"type": "loopback"}]}))
    socket = workdir / "containerd.sock"
    config = workdir / "containerd.toml"
    config.write_text(_containerd_config(workdir, socket, cni))
    made = [d for d in (SHIM_SOCKET_DIR, SHIM_SOCKET_DIR.parent, LEGACY_LOG_DIR) if not d.exists()]
    containerd = start_process(["containerd", "--config", str(config)], workdir / "containerd.log",
                               name="containerd")
    node = Node(name=name, cluster=cluster, workdir=workdir, kubelet_bin=kubelet_bin,
                cgroup_root=cgroup_root, containerd=containerd,
                _made_dirs=made)
    try:
        node.wait("containerd's socket", lambda: socket.exists() and bool(node.ctr("version")), 60)
        node.ctr("images", "import", str(images), timeout=120)
        names = node.ctr("images", "ls", "-q").split()
        for image in (BUSYBOX_IMAGE, PAUSE_IMAGE):
            if image not in names:
                raise HarnessError(f"importing {images} gave {names}, not {image}")
        node.start_kubelet(timeout=timeout)
    except BaseException:
        node.stop()
        raise
    return node


@contextlib.contextmanager
def running_node(cluster: Cluster, workdir: Path, **kwargs: Any) -> Iterator[Node]:
    """start_node ... stop, failing if anything is left behind."""
    node = start_node(cluster, workdir, **kwargs)
    try:
        yield node
    finally:
        node.stop()
        left = node.leftovers()
        if left:
            raise HarnessError(f"the e2e node left behind: {left}")
