"""The webhook handlers alone: Envelope's ``/mutate`` and Kyverno's mutate endpoint
given the same AdmissionReview over HTTPS keep-alive (wrk, one thread, concurrency 16),
no API server in the path.

Run by hand (``make bench-peers`` runs it after the API-server rounds). Starts etcd +
kube-apiserver (Kyverno needs one to start and to load its policy; Envelope runs with
its live cluster view too, as in production), then for each of Envelope, Kyverno with
the ClusterPolicy and Kyverno with the MutatingPolicy: checks that the endpoint answers
this review with a JSON patch that removes the CPU limits, runs wrk, and reads the
server process's CPU time from /proc. Reports reviews/s, p50/p99, CPU µs per review and
reviews per second per core (reviews / CPU seconds), and the RSS after the run.

Kyverno's endpoint is the URL it registered in its MutatingWebhookConfiguration for
Deployments (``--serverIP`` makes it a URL); its certificate is its own, so wrk and the
check here do not verify it (loopback only).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "e2e"))

import peers  # noqa: E402
import policies  # noqa: E402
from apiserver import bin_dir, cpu_seconds, rss_mib  # noqa: E402
from objects import timed_deployment  # noqa: E402
from webhook import LUA, wrk  # noqa: E402

import harness  # noqa: E402


def review(obj: dict[str, Any], namespace: str) -> bytes:
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                    "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                    "requestKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "requestResource": {"group": "apps", "version": "v1", "resource": "deployments"},
                    "name": obj["metadata"]["name"], "namespace": namespace, "operation": "CREATE",
                    "userInfo": {"username": "system:serviceaccount:argocd:argocd-application-controller",
                                 "groups": ["system:serviceaccounts", "system:authenticated"]},
                    "object": obj, "oldObject": None, "dryRun": False,
                    "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions",
                                "fieldManager": "argocd-controller"}},
    }).encode()


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # loopback, the server's own throwaway CA
    return ctx


def patch_of(url: str, body: bytes) -> list[dict[str, Any]]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=_insecure(), timeout=10) as response:
        answer = json.loads(response.read())["response"]
    if not answer.get("allowed"):
        raise RuntimeError(f"{url} refused the review: {answer}")
    return json.loads(base64.b64decode(answer["patch"])) if answer.get("patch") else []


def removes_cpu_limit(url: str, body: bytes) -> bool:
    return any(op.get("op") == "remove" and op.get("path", "").endswith("/limits/cpu")
               for op in patch_of(url, body))


def kyverno_mutate_url(cluster: harness.Cluster) -> str:
    """The URL Kyverno registered for mutating Deployments."""
    configs = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "-l", peers.MANAGED_BY)
    for config in configs["items"]:
        for hook in config.get("webhooks") or []:
            if any("deployments" in r.get("resources", []) or "*" in r.get("resources", [])
                   for r in hook.get("rules") or []) and "url" in hook["clientConfig"]:
                return str(hook["clientConfig"]["url"])
    raise RuntimeError(f"no Kyverno mutating webhook for deployments: {json.dumps(configs)[:2000]}")


def measure(url: str, body: bytes, pid: int, seconds: int, connections: int, tmp: Path) -> dict[str, float]:
    (tmp / "body.json").write_bytes(body)
    script = tmp / "post.lua"
    script.write_text(LUA.format(body=tmp / "body.json"))
    wrk(url, script, 3, connections)  # warm up
    before, started = cpu_seconds(pid), time.perf_counter()
    result = wrk(url, script, seconds, connections)
    cpu, wall = cpu_seconds(pid) - before, time.perf_counter() - started
    reviews = result["rps"] * wall
    result["cpu_us"] = cpu / reviews * 1e6
    result["per_core"] = reviews / cpu if cpu else 0.0
    result["rss"] = rss_mib(pid)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("bench: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    kdir = peers.kyverno_dir()
    work = Path(tempfile.mkdtemp(prefix="envelope-bench-handlers-"))
    cluster = harness.start_control_plane(work / "cp", bin_dir())
    loads = [os.getloadavg()]
    results: dict[str, list[dict[str, float]]] = {}
    try:
        namespace = cluster.create_namespace("handlers")
        body = review(timed_deployment(), namespace)
        for rep in range(args.repeat):
            for label in ("envelope", "kyverno-cpol", "kyverno-mpol"):
                if label == "envelope":
                    webhook = harness.start_webhook(work / f"{label}-{rep}", kubeconfig=cluster.kubeconfig,
                                                    extra_args=["--log-level", "warning"])
                    proc, url = webhook.process, webhook.url + "/mutate"
                else:
                    kyverno = peers.start_kyverno(cluster, work / f"{label}-{rep}", kdir)
                    proc = kyverno.process
                    policy = (policies.kyverno_cluster_policy() if label == "kyverno-cpol"
                              else policies.kyverno_mutating_policy())
                    peers.apply_objects(cluster, [policy])
                    harness.wait_until("Kyverno's mutating webhook configuration",
                                       lambda: bool(kyverno_mutate_url(cluster)), proc, 120, interval=1)
                    url = kyverno_mutate_url(cluster)
                try:
                    harness.wait_until(f"{label} to patch the review",
                                       lambda target=url: removes_cpu_limit(target, body),
                                       proc, 120, interval=1)
                    results.setdefault(label, []).append(
                        measure(url, body, proc.pid, args.seconds, args.connections, work))
                finally:
                    if label != "envelope":
                        peers.delete_objects(cluster, [policy])
                    proc.stop()
                    peers.delete_kyverno_webhooks(cluster)
            loads.append(os.getloadavg())
    finally:
        cluster.stop()
    print(f"one AdmissionReview ({len(body)} bytes, the 3-container Deployment), wrk -t1 "
          f"-c{args.connections}, {args.seconds}s per run, medians of {args.repeat}; load average "
          + " -> ".join(" ".join(f"{x:.1f}" for x in load) for load in loads))
    print("| handler | reviews/s | p50 ms | p99 ms | CPU µs per review | reviews/s per core | RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for label, runs in results.items():
        m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {label} | {m['rps']:.0f} | {m['p50']:.2f} | {m['p99']:.2f} | {m['cpu_us']:.0f} "
              f"| {m['per_core']:.0f} | {m['rss']:.0f} |")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
