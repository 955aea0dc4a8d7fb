"""How long ``envelope audit`` takes, and how much memory, on a cluster of N objects.

Run by hand (``python bench/audit.py``), not in the test suite. Starts etcd +
kube-apiserver (e2e/controlplane/build.sh), creates ``--deployments`` Deployments and
``--pods`` bare Pods (no controller) over ``--namespaces`` namespaces with direct
HTTPS POSTs at ``--concurrency``, one in ``--bad-every`` with a memory request below
its limit (a ``fail``) and one in ``--capped-every`` with a CPU limit (a ``warn`` with
a patch), plus one ResourceQuota, one LimitRange per namespace and ``--nodes`` Nodes
(what the rules read). No webhook is registered: the objects are stored as written.

Then runs the real CLI, ``python -m app audit`` (text, then ``--write`` of the
PolicyReports with the upstream CRD installed), as a child process, and reports its
wall time and peak RSS (``wait4`` rusage), with the result counts it printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e"))

import harness  # noqa: E402

CRDS = ROOT / "charts" / "envelope" / "files" / "crds"


def resources(i: int, bad_every: int, capped_every: int) -> dict[str, Any]:
    if i % bad_every == 0:
        return {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    if i % capped_every == 1:
        return {"requests": {"cpu": "250m", "memory": "256Mi"},
                "limits": {"cpu": "1", "memory": "256Mi"}}
    return {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}}


def pod_spec(name: str, res: dict[str, Any]) -> dict[str, Any]:
    return {"containers": [
        {"name": name, "image": "registry.example/app:1", "resources": res,
         "env": [{"name": "RESOURCE_LIMITS", "value": "memory=256Mi"}],
         "ports": [{"containerPort": 8080}]},
        {"name": "proxy", "image": "registry.example/proxy:1",
         "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                       "limits": {"memory": "64Mi"}}}]}


def deployment(name: str, ns: str, res: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name, "team": ns}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod_spec(name, res)}}}


def pod(name: str, ns: str, res: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": pod_spec(name, res)}


def create_all(cluster: harness.Cluster, items: list[tuple[str, dict[str, Any]]],
               concurrency: int) -> float:
    pool = urllib3.PoolManager(maxsize=concurrency, ssl_context=cluster.admin_ssl_context())

    def create(item: tuple[str, dict[str, Any]]) -> None:
        path, obj = item
        for _ in range(20):
            r = pool.request("POST", cluster.api_url + path, body=json.dumps(obj).encode(),
                             headers={"Content-Type": "application/json"})
            if r.status in (201, 409):
                return
            if r.status != 429:
                raise RuntimeError(f"POST {path}: HTTP {r.status}: {r.data[:300]!r}")
            time.sleep(0.5)
        raise RuntimeError(f"POST {path}: still 429")

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool_exec:
        list(pool_exec.map(create, items))
    return time.perf_counter() - started


def run_cli(cluster: harness.Cluster, *args: str) -> tuple[float, float, str, str]:
    """Wall seconds, peak RSS MiB, stdout, stderr of ``python -m app audit ARGS``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ENVELOPE_CONFIG", None)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "app", "audit", "--kubeconfig",
                                 str(cluster.kubeconfig), *args], stdout=out, stderr=err,
                                env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"envelope audit {args}: exit {proc.returncode}\n{stderr[-2000:]}")
    return wall, usage.ru_maxrss / 1024, stdout, stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deployments", type=int, default=8000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--namespaces", type=int, default=40)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--bad-every", type=int, default=10)
    parser.add_argument("--capped-every", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-memory-quotas", dest="memory_quotas", action="store_false",
                        help="no ResourceQuota on memory: namespace-memory-composition, which "
                             "sums every workload of the namespace per object, returns at once")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envelope-bench-audit-"))
    cluster = harness.start_control_plane(work / "cp", harness.locate_bin_dir())
    try:
        harness.install_crds(cluster, CRDS)
        namespaces = [f"team-{i:03d}" for i in range(args.namespaces)]
        create_all(cluster, [("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": ns}})
                             for ns in namespaces], args.concurrency)
        setup: list[tuple[str, dict[str, Any]]] = []
        for ns in namespaces:
            if args.memory_quotas:
                setup.append((f"/api/v1/namespaces/{ns}/resourcequotas", {
                    "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "memory"},
                    "spec": {"hard": {"requests.memory": "4Ti", "limits.memory": "4Ti"}}}))
            setup.append((f"/api/v1/namespaces/{ns}/limitranges", {
                "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
                "spec": {"limits": [{"type": "Container",
                                     "defaultRequest": {"memory": "128Mi"}}]}}))
        for i in range(args.nodes):
            setup.append(("/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": f"node-{i:03d}", "labels": {"pool": f"p{i % 4}"}}}))
        create_all(cluster, setup, args.concurrency)
        for i in range(args.nodes):  # Ready with capacity, as a kubelet would report it
            name = f"node-{i:03d}"
            cluster.kubectl("patch", "node", name, "--subresource=status",
                            "--type=merge", "-p", json.dumps({"status": {
                                "conditions": [{"type": "Ready", "status": "True"}],
                                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                                "allocatable": {"cpu": "63", "memory": "500Gi",
                                                "pods": "110"}}}))
            # The not-ready taint the API server put on the new Node (TaintNodesByCondition);
            # the node lifecycle controller would lift it once Ready.
            cluster.kubectl("patch", "node", name, "--type=merge", "-p",
                            json.dumps({"spec": {"taints": None}}))
        items = []
        for i in range(args.deployments):
            ns = namespaces[i % len(namespaces)]
            items.append((f"/apis/apps/v1/namespaces/{ns}/deployments",
                          deployment(f"d-{i}", ns, resources(i, args.bad_every,
                                                             args.capped_every))))
        for i in range(args.pods):
            ns = namespaces[i % len(namespaces)]
            items.append((f"/api/v1/namespaces/{ns}/pods",
                          pod(f"p-{i}", ns, resources(i, args.bad_every, args.capped_every))))
        created = create_all(cluster, items, args.concurrency)
        print(f"memory quotas: {args.memory_quotas}; load average before the audit: "
              f"{os.getloadavg()[0]:.1f}")
        print(f"created {len(items)} objects ({args.deployments} Deployments, {args.pods} Pods) "
              f"in {len(namespaces)} namespaces in {created:.1f}s "
              f"({len(items) / created:.0f}/s)")
        rows = []
        for label, extra in (("text", ()), ("text", ()), ("--write", ("--write",))):
            wall, rss, stdout, stderr = run_cli(cluster, *extra)
            last = stdout.strip().splitlines()[-1]
            rows.append((label, wall, rss, last, stderr.strip()))
        first = run_cli(cluster, "-o", "json")[2]
        seen: dict[tuple[str, str], str] = {}
        for r in json.loads(first)["results"]:
            seen.setdefault((r["rule"], r["result"]), f"{r['kind']} {r['name']}: {r['message']}")
        for (rule_id, result), example in sorted(seen.items()):
            print(f"  e.g. {result} {rule_id}: {example}"[:200])
        print("| run | wall s | peak RSS MiB | what it printed |")
        print("|---|---|---|---|")
        for label, wall, rss, last, stderr in rows:
            print(f"| {label} | {wall:.1f} | {rss:.0f} | {last} {stderr} |")
        reports = cluster.kubectl_json("get", "policyreports.v1alpha2.wgpolicyk8s.io", "-A")
        fails = sum(r["summary"]["fail"] for r in reports["items"])
        print(f"{len(reports['items'])} PolicyReports stored, {fails} fail results in them")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
