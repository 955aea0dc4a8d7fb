"""Envelope's memory with a big cluster behind a real API server, previous code vs current.

Run by hand (``.venv/bin/python bench/cluster_memory.py``), not in the test suite.
Starts etcd + kube-apiserver (``e2e/harness/``), fills them with direct concurrent
HTTPS POSTs as the admin user — namespaces, each with a ResourceQuota and a
LimitRange; Nodes with a kubelet-sized status (labels, 40 images, conditions);
Deployments with a ``kubectl apply`` annotation and one ReplicaSet each, owned by it
(as the Deployment controller would leave them) — up to the asked-for scale or until
``--create-budget`` seconds have passed, whichever comes first.

Then, for the previous code (``git archive`` of ``--baseline``) and the current tree,
one at a time: a child process (``bench/cluster_memory_child.py``) imports what
``envelope serve`` imports and starts the live view on every resource; its RSS is
recorded once synced and after a forced re-list of every resource. Both then watch
``--churn`` seconds of writes (Deployment and ReplicaSet updates, Node heartbeats,
Deployments created and deleted) and their RSS is recorded again.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT / "bench"))

from webhook import deployment  # noqa: E402

import harness  # noqa: E402

CHILD = ROOT / "bench" / "cluster_memory_child.py"


class Api:
    def __init__(self, cluster: harness.Cluster, concurrency: int) -> None:
        self.base = cluster.api_url
        self.pool = urllib3.PoolManager(maxsize=concurrency, block=True,
                                        ssl_context=cluster.admin_ssl_context())
        self.requests = 0

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json", ok: tuple[int, ...] = (200, 201)
             ) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(5):
            response = self.pool.request(method, self.base + path, body=data,
                                         headers={"Content-Type": content_type},
                                         timeout=urllib3.Timeout(connect=5, read=60))
            self.requests += 1
            if response.status in ok:
                return json.loads(response.data) if response.data else {}
            if response.status in (409, 404) and method == "DELETE":
                return {}
            if response.status not in (429, 500, 503, 504) or attempt == 4:
                raise RuntimeError(f"{method} {path}: HTTP {response.status}: "
                                   f"{response.data[:300]!r}")
            time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")


def node(i: int) -> dict[str, Any]:
    gpu = i % 2 == 1
    labels = {"kubernetes.io/hostname": f"node-{i}", "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": f"zone-{i % 3}",
              "topology.kubernetes.io/region": "eu-west-1",
              "node.kubernetes.io/instance-type": "p5.48xlarge" if gpu else "m7i.16xlarge",
              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" if gpu else "none"}
    labels.update({f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true"
                   for f in ("AVX", "AVX2", "AVX512F", "FMA3", "SSE4", "AESNI")})
    now = "2026-11-30T12:00:00Z"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f"node-{i}", "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                     "volumes.kubernetes.io/controller-managed-attach-detach":
                                         "true"}},
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24",
                 "providerID": f"aws:///eu-west-1a/i-{i:017x}",
                 "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}] if gpu else []},
        "status": {
            "capacity": {"cpu": "192", "memory": "2063937876Ki", "pods": "110",
                         "ephemeral-storage": "1073741824Ki",
                         **({"nvidia.com/gpu": "8"} if gpu else {})},
            "allocatable": {"cpu": "191450m", "memory": "2052000000Ki", "pods": "110",
                            "ephemeral-storage": "1000000000Ki",
                            **({"nvidia.com/gpu": "8"} if gpu else {})},
            "conditions": [{"type": t, "status": "False" if t != "Ready" else "True",
                            "lastHeartbeatTime": now, "lastTransitionTime": now,
                            "reason": f"Kubelet{t}", "message": f"kubelet reports {t}"}
                           for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
            "addresses": [{"type": "InternalIP", "address": f"10.1.{i // 250}.{i % 250}"},
                          {"type": "Hostname", "address": f"node-{i}"}],
            "nodeInfo": {"kubeletVersion": "v1.34.12", "containerRuntimeVersion": "containerd://2.1",
                         "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "machineID": f"{i:032x}",
                         "systemUUID": f"{i:032x}", "bootID": f"{i:032x}", "architecture": "amd64",
                         "operatingSystem": "linux", "kubeProxyVersion": ""},
            "images": [{"names": [f"registry.example.com/team/image-{j}@sha256:{j:064x}",
                                  f"registry.example.com/team/image-{j}:v{j}.0"],
                        "sizeBytes": 10**8 + j} for j in range(40)],
        },
    }


SIZES = [(cpu, f"{gib}Gi") for cpu in ("250m", "500m", "1", "2", "4", "7", "15")
         for gib in (1, 2, 4, 8, 16, 29, 61)]


def workload(i: int, namespace: str) -> dict[str, Any]:
    """The bench Deployment (3 containers) in one of 49 sizes x 17 names for the
    main container: 833 distinct pod templates, as a platform's charts give."""
    obj = deployment()
    main = obj["spec"]["template"]["spec"]["containers"][0]
    cpu, memory = SIZES[i % len(SIZES)]
    main["name"] = f"app-{i % 17}"
    main["resources"] = {"limits": {"cpu": cpu, "memory": memory, "ephemeral-storage": "2Gi"},
                         "requests": {"cpu": cpu, "memory": memory}}
    obj["metadata"] = {"name": f"app-{i}", "namespace": namespace,
                       "labels": obj["metadata"]["labels"],
                       "annotations": {"deployment.kubernetes.io/revision": "3"}}
    obj["spec"]["replicas"] = 1 + i % 4
    obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = (
        json.dumps(obj, separators=(",", ":")))
    return obj


def replica_set(dep: dict[str, Any]) -> dict[str, Any]:
    meta = dep["metadata"]
    rs = copy.deepcopy({k: dep[k] for k in ("spec",)})
    labels = {**meta["labels"], "pod-template-hash": "5d8f7c9b4"}
    rs["spec"].pop("strategy", None)
    rs["spec"]["selector"] = {"matchLabels": labels}
    rs["spec"]["template"]["metadata"]["labels"] = labels
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-5d8f7c9b4", "namespace": meta["namespace"],
                         "labels": labels,
                         "annotations": {"deployment.kubernetes.io/revision": "3",
                                         "deployment.kubernetes.io/desired-replicas":
                                             str(dep["spec"]["replicas"])},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": meta["name"], "uid": meta["uid"],
                                              "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": rs["spec"]}


def fill(api: Api, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + args.create_budget
    done = {"Namespace": 0, "ResourceQuota": 0, "LimitRange": 0, "Node": 0, "Deployment": 0,
            "ReplicaSet": 0}
    lock = threading.Lock()

    def count(kind: str) -> None:
        with lock:
            done[kind] += 1

    def namespace(n: int) -> None:
        name = f"team-{n}"
        api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name,
                                                              "labels": {"team": name}}})
        count("Namespace")
        api.call("POST", f"/api/v1/namespaces/{name}/resourcequotas", {
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"},
            "spec": {"hard": {"requests.memory": "2Ti", "limits.memory": "2Ti",
                              "requests.nvidia.com/gpu": "64", "pods": "500"}}})
        count("ResourceQuota")
        api.call("POST", f"/api/v1/namespaces/{name}/limitranges", {
            "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
            "spec": {"limits": [{"type": "Container", "max": {"memory": "512Gi"},
                                 "defaultRequest": {"memory": "256Mi"},
                                 "default": {"memory": "256Mi"}}]}})
        count("LimitRange")

    def make_node(i: int) -> None:
        if time.monotonic() < deadline:
            api.call("POST", "/api/v1/nodes", node(i))
            count("Node")

    def make_workload(i: int) -> None:
        if time.monotonic() >= deadline:
            return
        ns = f"team-{i % args.namespaces}"
        created = api.call("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", workload(i, ns))
        count("Deployment")
        api.call("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", replica_set(created))
        count("ReplicaSet")

    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(namespace, range(args.namespaces)))
        # Nodes and workloads interleaved, so a budget cut keeps both proportional.
        jobs: list[tuple[Any, int]] = []
        per = max(1, args.deployments // max(1, args.nodes))
        d = 0
        for i in range(args.nodes):
            jobs.append((make_node, i))
            for _ in range(per):
                if d < args.deployments:
                    jobs.append((make_workload, d))
                    d += 1
        jobs.extend((make_workload, k) for k in range(d, args.deployments))
        list(pool.map(lambda job: job[0](job[1]), jobs))
    seconds = time.monotonic() - started
    return {"created": done, "seconds": round(seconds, 1),
            "objects_per_second": round(sum(done.values()) / seconds, 1)}


def churn(api: Api, args: argparse.Namespace, created: dict[str, int]) -> dict[str, int]:
    stop = time.monotonic() + args.churn
    ops = {"deployment": 0, "replicaset": 0, "node": 0, "create+delete": 0}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        k = 0
        while time.monotonic() < stop:
            k += 1
            i = rng.randrange(max(1, created["Deployment"]))
            ns = f"team-{i % args.namespaces}"
            choice = rng.random()
            if choice < 0.35:
                api.call("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/app-{i}",
                         {"metadata": {"annotations": {"churn": str(k)}},
                          "spec": {"replicas": 1 + k % 5}}, "application/merge-patch+json")
                kind = "deployment"
            elif choice < 0.55:
                api.call("PATCH", f"/apis/apps/v1/namespaces/{ns}/replicasets/app-{i}-5d8f7c9b4",
                         {"metadata": {"annotations": {"churn": str(k)}}},
                         "application/merge-patch+json")
                kind = "replicaset"
            elif choice < 0.9:
                n = rng.randrange(max(1, created["Node"]))
                api.call("PATCH", f"/api/v1/nodes/node-{n}/status",
                         {"status": {"conditions": [{"type": "Ready", "status": "True",
                                                     "lastHeartbeatTime":
                                                         time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                       time.gmtime())}]}},
                         "application/strategic-merge-patch+json")
                kind = "node"
            else:
                name = f"churn-{seed}-{k}"
                obj = workload(k, ns)
                obj["metadata"]["name"] = name
                api.call("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", obj)
                api.call("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
                kind = "create+delete"
            with lock:
                ops[kind] += 1

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(args.churn_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ops


class Child:
    def __init__(self, label: str, tree: Path, kubeconfig: Path, log: Path) -> None:
        self.label = label
        self.log = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, str(CHILD), str(tree), str(kubeconfig)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        self.steps: dict[str, dict[str, Any]] = {}

    def read(self, until: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.label}: child exited (see {self.log.name})")
            step = json.loads(line)
            self.steps[step["event"]] = step
            print(f"[{self.label}] {line.strip()}", flush=True)
            if step["event"] == until:
                return step

    def ask(self, command: str, until: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read(until)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, BrokenPipeError, OSError):
            self.ask("quit", "never")
        self.proc.wait(30)


def export_tree(ref: str, into: Path) -> Path:
    """The ``app`` package as it was at ``ref``, in a directory of its own."""
    archive = into / f"{ref}.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref, "app"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / ref, filter="data")
    return into / ref


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, default=30_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--namespaces", type=int, default=1_000)
    parser.add_argument("--create-budget", type=float, default=900,
                        help="stop creating after this many seconds (2 shared cores)")
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--churn", type=float, default=300, help="seconds of churn")
    parser.add_argument("--churn-workers", type=int, default=4)
    parser.add_argument("--baseline", default="6ced6e6",
                        help="git ref of the previous code")
    parser.add_argument("--current", default="HEAD", help="git ref of the current code")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="envelope-cluster-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    current = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.current],
                             capture_output=True, text=True, check=True).stdout.strip()
    trees = {"previous": export_tree(args.baseline, workdir),
             "current": export_tree(current, workdir)}
    cluster = harness.start_control_plane(workdir / "controlplane", harness.locate_bin_dir())
    results: dict[str, Any] = {"conditions": {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "baseline": args.baseline,
        "current": current,
        "python": sys.version.split()[0], "cpus": os.cpu_count()}}
    children: list[Child] = []
    try:
        api = Api(cluster, args.concurrency)
        results["fill"] = fill(api, args)
        print(json.dumps(results["fill"]), flush=True)
        for label, tree in trees.items():
            child = Child(label, tree, cluster.kubeconfig, workdir / f"{label}.log")
            children.append(child)
            child.read("synced")
            child.ask("relist", "relisted")
            child.ask("rss", "rss")
        results["churn"] = churn(api, args, results["fill"]["created"])
        for child in children:
            child.ask("rss", "rss")
        results["rss_mib"] = {c.label: {
            "imported": c.steps["imported"]["VmRSS"],
            "synced": c.steps["synced"]["VmRSS"], "sync_seconds": c.steps["synced"]["seconds"],
            "relisted": c.steps["relisted"]["VmRSS"], "after_churn": c.steps["rss"]["VmRSS"],
            "peak": c.steps["rss"]["VmHWM"], "kept": c.steps["rss"]["counts"],
            "events": c.steps["rss"]["events"]} for c in children}
    finally:
        for child in children:
            child.close()
        cluster.stop()
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
