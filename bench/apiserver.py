"""What the webhook adds to a real write: create latency through kube-apiserver with
Envelope registered vs not (Kyverno publishes its overhead the same way).

Run by hand (`make bench-apiserver`), not in the test suite. Starts etcd +
kube-apiserver (built by e2e/controlplane/build.sh), then creates N Deployments at
concurrency C with direct HTTPS POSTs as the admin user — first with no webhook
registered; then with a *floor* webhook (the same server's `/floor` route, which
answers an allow for the uid without decoding anything: what any webhook costs the
API server here); then with Envelope registered for mutation and validation — each
round in a fresh namespace — and prints p50/p99 and the differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import urllib3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e"))

import harness  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from webhook import deployment  # noqa: E402


def bin_dir() -> Path:
    env = os.environ.get("ENVELOPE_CONTROLPLANE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(ROOT / "e2e/controlplane/build.sh")], capture_output=True,
                         text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


def run_round(cluster: harness.Cluster, namespace: str, count: int, concurrency: int) -> list[float]:
    pool = urllib3.PoolManager(maxsize=concurrency, ssl_context=cluster.admin_ssl_context())
    url = f"{cluster.api_url}/apis/apps/v1/namespaces/{namespace}/deployments"

    def create(i: int) -> float:
        obj = deployment()
        obj["metadata"] = {"name": f"bench-{i}", "namespace": namespace,
                           "labels": obj["metadata"]["labels"]}
        body = json.dumps(obj).encode()
        started = time.perf_counter()
        response = pool.request("POST", url, body=body, headers={"Content-Type": "application/json"})
        elapsed = time.perf_counter() - started
        if response.status != 201:
            raise RuntimeError(f"create bench-{i}: HTTP {response.status}: {response.data[:300]!r}")
        return elapsed

    with ThreadPoolExecutor(concurrency) as executor:
        return list(executor.map(create, range(count)))


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50": statistics.median(ordered) * 1000,
            "p99": ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envelope-bench-apiserver-"))
    cluster = harness.start_control_plane(work / "cp", bin_dir())
    try:
        results = {}
        for label in ("no webhook", "floor webhook", "floor webhook + patch", "envelope"):
            webhook = None
            if label != "no webhook":
                webhook = harness.start_webhook(work / label.replace(" ", "-"),
                                                kubeconfig=cluster.kubeconfig,
                                                extra_args=["--log-level", "warning", "--bench-floor"])
                if label.startswith("floor webhook"):
                    mutate = "/floor-patch" if label.endswith("patch") else "/floor"
                    manifest = harness.webhook_configurations(cluster, webhook.url, webhook.ca_file)
                    manifest = manifest.replace("/mutate\"", mutate + "\"").replace(
                        "/validate\"", "/floor\"")
                    cluster.apply(manifest)
                    time.sleep(3)  # no probe to wait on: the floor touches nothing
                else:
                    harness.register_webhook(cluster, webhook)
            ns = harness.unique_name(f"bench-{label.replace(' ', '-')}", max_length=40)
            cluster.create_namespace(ns)
            run_round(cluster, ns, 50, args.concurrency)  # warm up connections and caches
            ns2 = cluster.create_namespace(ns + "-m")
            results[label] = summary(run_round(cluster, ns2, args.count, args.concurrency))
            if webhook is not None:
                harness.unregister_webhook(cluster)
                webhook.stop()
                time.sleep(2)
    finally:
        cluster.stop()
    print(f"{args.count} Deployment creates at concurrency {args.concurrency} through kube-apiserver")
    print("| | p50 ms | p99 ms |")
    print("|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['p50']:.1f} | {r['p99']:.1f} |")
    base, floor, env = results["no webhook"], results["floor webhook"], results["envelope"]
    patched = results["floor webhook + patch"]
    print(f"a one-op patch over the do-nothing webhook: p50 {patched['p50'] - floor['p50']:+.1f} ms, "
          f"p99 {patched['p99'] - floor['p99']:+.1f} ms")
    print(f"added by Envelope: p50 {env['p50'] - base['p50']:+.1f} ms, "
          f"p99 {env['p99'] - base['p99']:+.1f} ms")
    print(f"added by a do-nothing webhook: p50 {floor['p50'] - base['p50']:+.1f} ms, "
          f"p99 {floor['p99'] - base['p99']:+.1f} ms")
    print(f"Envelope over the do-nothing webhook: p50 {env['p50'] - floor['p50']:+.1f} ms, "
          f"p99 {env['p99'] - floor['p99']:+.1f} ms")
    print(f"Envelope over the patching do-nothing webhook: p50 {env['p50'] - patched['p50']:+.1f} ms, "
          f"p99 {env['p99'] - patched['p99']:+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
