"""What the webhook adds to a real write: create latency through kube-apiserver with
Envelope registered vs not (Kyverno publishes its overhead the same way).

Run by hand (`make bench-apiserver`), not in the test suite. Starts etcd +
kube-apiserver (built by e2e/controlplane/build.sh), then creates N Deployments at
concurrency C with direct HTTPS POSTs as the admin user, one round per webhook set-up,
each in a fresh namespace:

- ``none``: no webhook registered (the baseline);
- ``floor``: Envelope's server answering from its ``/floor`` route, an allow for the
  uid without decoding anything (what uvicorn + TLS cost, no rules);
- ``floor-patch``: the same, answering the mutation with a one-op JSON patch;
- ``go-h2`` / ``go-h1``: a do-nothing webhook in Go (``bench/noopwebhook``, standard
  library only) over HTTP/2 and over HTTP/1.1: what *any* webhook costs here;
- ``envelope``: Envelope, with the chart's configurations in URL mode.

``--object compliant`` sends the Deployment as Envelope would store it (no CPU limits
left to strip), so Envelope answers without a patch: the cost of checking a write that
is already right, apart from the API server's cost of applying a patch.

For every round it also reports the CPU time each process spent per create
(kube-apiserver, etcd, the webhook, this client), read from /proc, so the added
latency can be traced to who burned the cores.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import resource
import statistics
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

sys.path.insert(0, str(ROOT / "bench"))
from webhook import deployment  # noqa: E402

from app.cli import subject_of  # noqa: E402
from app.cluster.view import StaticView  # noqa: E402
from app.config import Policy  # noqa: E402
from app.engine import check_object  # noqa: E402
from app.ruleset import default_ruleset  # noqa: E402

FLOOR = ROOT / "bench" / "floor.py"
RULES = default_ruleset()

ROUNDS = ("none", "floor", "floor-patch", "go-h2", "go-h1", "envelope")
NOOP_SOURCE = ROOT / "bench" / "noopwebhook"
TICK = os.sysconf("SC_CLK_TCK")


def bin_dir() -> Path:
    env = os.environ.get("ENVELOPE_CONTROLPLANE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(ROOT / "e2e/controlplane/build.sh")], capture_output=True,
                         text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


def noop_webhook_binary() -> Path:
    """Build bench/noopwebhook once per source version, in a cache outside the clone."""
    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((NOOP_SOURCE / name).read_bytes())
    cache = Path(os.environ.get("ENVELOPE_CONTROLPLANE_DIR", Path.home() / ".cache/envelope/controlplane"))
    binary = cache.parent / "bench" / f"noopwebhook-{digest.hexdigest()[:12]}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0")
        subprocess.run(["go", "build", "-o", str(binary), "."], cwd=NOOP_SOURCE, env=env, check=True)
    return binary


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def compliant_deployment() -> dict[str, Any]:
    """The bench Deployment as Envelope would store it: a second pass changes nothing."""
    result = check_object(RULES, subject_of(deployment()), StaticView(), Policy())
    if result.errors or not result.patch:
        raise RuntimeError(f"the bench Deployment should need a patch and no error: {result.findings}")
    again = check_object(RULES, subject_of(result.obj), StaticView(), Policy())
    if again.patch or again.errors:
        raise RuntimeError(f"the stored form still changes: {again.patch} {again.findings}")
    return result.obj


def run_round(cluster: harness.Cluster, namespace: str, count: int, concurrency: int,
              template: dict[str, Any]) -> list[float]:
    pool = urllib3.PoolManager(maxsize=concurrency, ssl_context=cluster.admin_ssl_context())
    url = f"{cluster.api_url}/apis/apps/v1/namespaces/{namespace}/deployments"

    def create(i: int) -> float:
        obj = copy.deepcopy(template)
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


def start_noop(workdir: Path, binary: Path, *, http1: bool) -> tuple[harness.ManagedProcess, str, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = harness.make_serving_cert(workdir, ("127.0.0.1",), name="noop")
    port = harness.free_port()
    cmd = [binary, "-addr", f"127.0.0.1:{port}", "-cert-file", cert_file, "-key-file", key_file]
    if http1:
        cmd.append("-http1")
    proc = harness.start_process(cmd, workdir / "noop.log", name="noopwebhook")
    ctx = harness.tls_context(ca_file)
    try:
        harness.wait_until(f"no-op webhook on port {port}",
                           lambda: harness.https_get(f"https://127.0.0.1:{port}/healthz", ctx,
                                                     timeout=2)[0] == 200, proc, timeout=20)
    except BaseException:
        proc.stop(timeout=5)
        raise
    return proc, f"https://127.0.0.1:{port}", ca_file


def register_paths(cluster: harness.Cluster, url: str, ca_file: Path, mutate: str, validate: str) -> None:
    """The chart's configurations, pointed at other paths; no probe to wait on."""
    manifest = harness.webhook_configurations(cluster, url, ca_file)
    cluster.apply(manifest.replace("/mutate\"", mutate + "\"").replace("/validate\"", validate + "\""))
    time.sleep(3)  # the API server loads configurations asynchronously


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--rounds", default=",".join(ROUNDS),
                        help=f"comma-separated, from {', '.join(ROUNDS)} (default: all; 'none' always runs)")
    parser.add_argument("--object", choices=("mutated", "compliant"), default="mutated",
                        help="mutated: CPU limits for Envelope to strip (default); "
                             "compliant: already as Envelope would store it")
    args = parser.parse_args()
    template = deployment() if args.object == "mutated" else compliant_deployment()
    rounds = ["none"] + [r for r in args.rounds.split(",") if r and r != "none"]
    unknown = set(rounds) - set(ROUNDS)
    if unknown:
        parser.error(f"unknown rounds: {', '.join(sorted(unknown))}")
    noop = noop_webhook_binary() if {"go-h2", "go-h1"} & set(rounds) else None
    work = Path(tempfile.mkdtemp(prefix="envelope-bench-apiserver-"))
    cluster = harness.start_control_plane(work / "cp", bin_dir())
    pids = {p.name: p.pid for p in cluster.processes}
    results: dict[str, dict[str, float]] = {}
    try:
        for label in rounds:
            proc: harness.ManagedProcess | None = None
            if label in ("floor", "floor-patch", "envelope"):
                command = ("-m", "app", "serve") if label == "envelope" else (str(FLOOR),)
                webhook = harness.start_webhook(work / label, kubeconfig=cluster.kubeconfig,
                                                extra_args=["--log-level", "warning"],
                                                command=command)
                proc = webhook.process
                if label == "envelope":
                    harness.register_webhook(cluster, webhook)
                else:
                    register_paths(cluster, webhook.url, webhook.ca_file,
                                   "/floor-patch" if label == "floor-patch" else "/floor", "/floor")
            elif label in ("go-h2", "go-h1"):
                assert noop is not None
                proc, url, ca_file = start_noop(work / label, noop, http1=label == "go-h1")
                register_paths(cluster, url, ca_file, "/mutate", "/validate")
            ns = cluster.create_namespace(harness.unique_name(f"bench-{label}", max_length=40))
            run_round(cluster, ns, 50, args.concurrency, template)  # warm up connections and caches
            ns2 = cluster.create_namespace(ns + "-m")
            watched = dict(pids, **({"webhook": proc.pid} if proc else {}))
            before = {name: cpu_seconds(pid) for name, pid in watched.items()}
            before["client"] = own_cpu_seconds()
            started = time.perf_counter()
            samples = run_round(cluster, ns2, args.count, args.concurrency, template)
            wall = time.perf_counter() - started
            result = summary(samples)
            result["rate"] = args.count / wall
            for name, pid in watched.items():
                result[f"cpu:{name}"] = (cpu_seconds(pid) - before[name]) / args.count * 1000
            result["cpu:client"] = (own_cpu_seconds() - before["client"]) / args.count * 1000
            results[label] = result
            if proc is not None:
                harness.unregister_webhook(cluster)
                proc.stop()
                time.sleep(2)
    finally:
        cluster.stop()
    print(f"{args.count} Deployment creates ({args.object}) at concurrency {args.concurrency} "
          "through kube-apiserver")
    print("CPU columns: milliseconds of CPU per create, per process")
    print("| round | creates/s | p50 ms | p99 ms | added p50 | added p99 "
          "| kube-apiserver | etcd | webhook | client |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = results["none"]
    for label, r in results.items():
        print(f"| {label} | {r['rate']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} "
              f"| {r['p50'] - base['p50']:+.1f} | {r['p99'] - base['p99']:+.1f} "
              f"| {r['cpu:kube-apiserver']:.2f} | {r['cpu:etcd']:.2f} "
              f"| {r.get('cpu:webhook', 0.0):.2f} | {r['cpu:client']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
