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
- ``floor-envpatch``: the same, answering with Envelope's own patch and warning for the
  mutated object (precomputed): Envelope's patch without Envelope (mutated objects only);
- ``go-h2`` / ``go-h1``: a do-nothing webhook in Go (``bench/noopwebhook``, standard
  library only) over HTTP/2 and over HTTP/1.1: what *any* webhook costs here;
- ``envelope``: Envelope, with the chart's configurations in URL mode, without the
  mutating webhook's matchConditions (every write is sent to /mutate);
- ``envelope-mc``: the same with the chart's matchConditions (compliant writes skip
  /mutate; only the validating call remains);
- the peers users would pick instead (``bench/peers``): ``map`` (a
  MutatingAdmissionPolicy doing the same mutation with a CEL JSON patch, inside the API
  server), ``kyverno-cpol`` and ``kyverno-mpol`` (Kyverno v1.19.1, built from the Go
  module proxy by bench/peers/build-kyverno.sh, with a classic ClusterPolicy and with a
  CEL MutatingPolicy). Before any peer round is timed, ``bench/peers/same_answer.py``
  checks that the peers store what Envelope stores (``--same-answer N``);
- what the chart's ``inTree.enabled`` runs (``bench/peers/intree.py``): ``intree-map``,
  the MutatingAdmissionPolicy and binding compiled from the default policy
  (``app.intree.compile_in_tree``) alone — the compiled policy's CEL against the
  hand-written ``map``; ``envelope-intree``, that policy with Envelope's webhooks (the
  mutating one with the reduced condition, the validating one as the chart has it).
  Their namespaces get the namespace fact from one run of the fact keeper
  (``app.intree.facts.FactKeeper``). Before they are timed, the round's objects (and
  ``--same-answer N`` generated Deployments) are created through ``envelope-mc`` and
  ``envelope-intree`` and must be stored equal, bookkeeping annotation and warnings
  included; after each timed round the first and the last object stored are compared
  with that answer again.

Objects (``--object``, comma-separated): ``mutated`` is bench/webhook.py's Deployment
without its limits string envelope (which the peers cannot rewrite), with CPU limits to
strip; ``burstable`` is ``mutated`` with the log-shipper's memory limit left out (a
Burstable pod: no warning from Envelope, so inside the in-tree policy's domain, which
``mutated`` — a Guaranteed pod losing exclusive cores, warned about — is not);
``compliant`` is the mutated Deployment as Envelope stores it.

``--object compliant`` sends the Deployment as Envelope would store it (no CPU limits
left to strip), so Envelope answers without a patch: the cost of checking a write that
is already right, apart from the API server's cost of applying a patch.

For every round it also reports the CPU time each process spent per create
(kube-apiserver, etcd, the webhook, this client), read from /proc, so the added
latency can be traced to who burned the cores, and the webhook calls the API server
made per create (its ``apiserver_admission_webhook_request_total``), so a round's
matchConditions can be seen to skip a webhook.
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
sys.path.insert(0, str(ROOT / "bench" / "peers"))
import intree  # noqa: E402
import peers  # noqa: E402
from objects import burstable_deployment, comparable, compliant_deployment, timed_deployment  # noqa: E402
from rounds import PEER_ROUNDS, PeerRound  # noqa: E402
from same_answer import differences, same_answer, stored_through  # noqa: E402

FLOOR = ROOT / "bench" / "floor.py"

ROUNDS = ("none", "floor", "floor-patch", "floor-envpatch", "go-h2", "go-h1", "envelope", "envelope-mc",
          "map", "kyverno-cpol", "kyverno-mpol", *intree.INTREE_ROUNDS)
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


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def admission_counters(cluster: harness.Cluster) -> dict[str, float]:
    status, body = cluster.get_raw("/metrics", timeout=30)
    if status != 200:
        raise RuntimeError(f"GET /metrics on the API server: HTTP {status}")
    return intree.admission_counters(body)


def timed_object(template: dict[str, Any], name: str, namespace: str | None = None) -> dict[str, Any]:
    """What a round writes: ``template`` with a metadata of its own (name, namespace, the
    template's labels; no annotations)."""
    obj = copy.deepcopy(template)
    obj["metadata"] = {"name": name, "labels": obj["metadata"]["labels"],
                       **({"namespace": namespace} if namespace else {})}
    return obj


def run_round(cluster: harness.Cluster, namespace: str, count: int, concurrency: int,
              template: dict[str, Any]) -> list[float]:
    pool = urllib3.PoolManager(maxsize=concurrency, ssl_context=cluster.admin_ssl_context())
    url = f"{cluster.api_url}/apis/apps/v1/namespaces/{namespace}/deployments"

    def create(i: int) -> float:
        body = json.dumps(timed_object(template, f"bench-{i}", namespace)).encode()
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


def check_stored(cluster: harness.Cluster, namespace: str, names: list[str], expected: dict[str, Any],
                 what: str) -> None:
    """The objects ``names`` were stored as ``expected`` (a strict :func:`comparable`)."""
    want = {k: v for k, v in expected.items() if k != "warnings"}
    for name in names:
        status, body = cluster.api("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        if status != 200:
            raise RuntimeError(f"{what}: GET {name}: HTTP {status}")
        found = differences(want, comparable(body, bookkeeping=True))
        if found:
            raise RuntimeError(f"{what}: {name} stored unlike the checked answer: {found[:3]}")


def measure(cluster: harness.Cluster, label: str, count: int, concurrency: int,
            template: dict[str, Any], watched: dict[str, int], peer: PeerRound | None = None,
            expected: dict[str, Any] | None = None) -> dict[str, float]:
    ns = cluster.create_namespace(harness.unique_name(f"bench-{label}", max_length=40))
    ns2 = cluster.create_namespace(ns + "-m")
    if peer is not None:
        peer.prepare([ns, ns2])
    run_round(cluster, ns, 50, concurrency, template)  # warm up connections and caches
    counters = admission_counters(cluster)
    before = {name: cpu_seconds(pid) for name, pid in watched.items()}
    before["client"] = own_cpu_seconds()
    started = time.perf_counter()
    try:
        samples = run_round(cluster, ns2, count, concurrency, template)
    except RuntimeError as exc:
        raise RuntimeError(f"round {label}, concurrency {concurrency}: {exc}") from None
    wall = time.perf_counter() - started
    result = summary(samples)
    result["rate"] = count / wall
    for name, pid in watched.items():
        result[f"cpu:{name}"] = (cpu_seconds(pid) - before[name]) / count * 1000
    result["cpu:client"] = (own_cpu_seconds() - before["client"]) / count * 1000
    result.update(intree.per_create(counters, admission_counters(cluster), count))
    if expected is not None:
        check_stored(cluster, ns2, ["bench-0", f"bench-{count - 1}"], expected, f"round {label}")
    return result


def start_round(label: str, cluster: harness.Cluster, work: Path, noop: Path | None,
                probe_ns: str) -> tuple[harness.ManagedProcess | None, PeerRound | None]:
    if label in PEER_ROUNDS:
        peer = PeerRound(label, cluster, work)
        return peer.start(probe_ns), peer
    if label in ("floor", "floor-patch", "floor-envpatch"):
        webhook = harness.start_webhook(work / label, kubeconfig=cluster.kubeconfig,
                                        extra_args=["--log-level", "warning"], command=(str(FLOOR),))
        register_paths(cluster, webhook.url, webhook.ca_file, "/" + label, "/floor")
        return webhook.process, None
    if label in ("go-h2", "go-h1"):
        assert noop is not None
        proc, url, ca_file = start_noop(work / label, noop, http1=label == "go-h1")
        register_paths(cluster, url, ca_file, "/mutate", "/validate")
        return proc, None
    return None, None


def stop_round(cluster: harness.Cluster, proc: harness.ManagedProcess | None, peer: PeerRound | None) -> None:
    if peer is not None:
        peer.stop()
    elif proc is not None:
        harness.unregister_webhook(cluster)
        proc.stop()
        time.sleep(2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--concurrency", default="20",
                        help="comma-separated concurrencies, e.g. 1,20 (default 20)")
    parser.add_argument("--rounds", default="none,floor,floor-patch,go-h2,go-h1,envelope",
                        help=f"comma-separated, from {', '.join(ROUNDS)} ('none' always runs)")
    parser.add_argument("--object", default="mutated",
                        help="comma-separated, from mutated (CPU limits to strip), burstable (the "
                             "same with one memory limit left out: in the in-tree policy's domain) "
                             "and compliant (already as Envelope stores it)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every round this many times (interleaved); report medians")
    parser.add_argument("--same-answer", type=int, default=60, metavar="N",
                        help="before timing peer rounds, check N generated Deployments store "
                             "equal through each peer and Envelope (0: skip)")
    args = parser.parse_args()
    objects = {"mutated": timed_deployment, "burstable": burstable_deployment,
               "compliant": compliant_deployment}
    wanted_objects = [o for o in args.object.split(",") if o]
    if set(wanted_objects) - set(objects):
        parser.error(f"unknown objects: {args.object}")
    templates = {o: objects[o]() for o in wanted_objects}
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    rounds = ["none"] + [r for r in args.rounds.split(",") if r and r != "none"]
    unknown = set(rounds) - set(ROUNDS)
    if unknown:
        parser.error(f"unknown rounds: {', '.join(sorted(unknown))}")
    noop = noop_webhook_binary() if {"go-h2", "go-h1"} & set(rounds) else None
    if {"kyverno-cpol", "kyverno-mpol"} & set(rounds):
        peers.kyverno_dir()  # build (or find) it before the control plane starts
    work = Path(tempfile.mkdtemp(prefix="envelope-bench-apiserver-"))
    cluster = harness.start_control_plane(work / "cp", bin_dir(), apiserver_args=peers.MAP_APISERVER_ARGS)
    pids = {p.name: p.pid for p in cluster.processes}
    runs: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    rss: dict[str, list[float]] = {}
    loads = [load()]
    checked: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        peer_labels = [r for r in rounds if r in ("map", "kyverno-cpol", "kyverno-mpol")]
        if peer_labels and args.same_answer:
            differing = same_answer(cluster, work / "same-answer", args.same_answer,
                                    ("envelope", *peer_labels))
            if differing:
                print(f"same answer: {differing} objects differ; not timing", file=sys.stderr)
                return 1
        if set(intree.INTREE_ROUNDS) & set(rounds):
            checked = in_tree_answers(cluster, work / "intree-answer", templates)
            if args.same_answer and same_answer(cluster, work / "intree-same", args.same_answer,
                                                ("envelope-mc", "envelope-intree"), strict=True):
                print("same answer: envelope-intree stores generated objects unlike envelope-mc; "
                      "not timing", file=sys.stderr)
                return 1
        probe_ns = cluster.create_namespace(harness.unique_name("bench-probe", max_length=40))
        for rep in range(args.repeat):
            for label in rounds:
                proc, peer = start_round(label, cluster, work / f"{rep}", noop, probe_ns)
                try:
                    watched = dict(pids, **({"webhook": proc.pid} if proc else {}))
                    for obj_name, template in templates.items():
                        for c in concurrencies:
                            if label == "floor-envpatch" and obj_name != "mutated":
                                continue  # its patch names the mutated object's paths
                            r = measure(cluster, label, args.count, c, template, watched, peer,
                                        checked.get((label, obj_name)))
                            runs.setdefault((label, obj_name, c), []).append(r)
                    if proc is not None:
                        rss.setdefault(label, []).append(rss_mib(proc.pid))
                finally:
                    stop_round(cluster, proc, peer)
            loads.append(load())
    finally:
        cluster.stop()
    report(runs, rss, args, loads)
    return 0


def in_tree_answers(cluster: harness.Cluster, workdir: Path,
                    templates: dict[str, dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The timed objects created through ``envelope-mc``, ``intree-map`` and
    ``envelope-intree``: each must be stored by ``envelope-intree`` as by ``envelope-mc``
    (annotations and warnings included), and ``intree-map`` either stores it so too
    (the object is in the policy's domain) or leaves it to the webhook (outside the
    domain: the policy changes nothing). Prints which; raises on any other answer.
    Returns (round, object) -> the stored form, for the checks after each timed round."""
    labels = ("envelope-mc", *intree.INTREE_ROUNDS)
    named = [timed_object(obj, f"answer-{name}") for name, obj in templates.items()]
    stored = stored_through(cluster, workdir, labels, named, strict=True)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for name in templates:
        key = f"answer-{name}"
        answers = {label: stored[label][key] for label in labels}
        for label, answer in answers.items():
            if "error" in answer:
                raise RuntimeError(f"{label} refused the {name} object: {answer['error']}")
            out[(label, name)] = answer
        found = differences(answers["envelope-mc"], answers["envelope-intree"])
        if found:
            raise RuntimeError(f"envelope-intree stores the {name} object unlike envelope-mc: {found[:5]}")
        verdict = intree.domain_verdict(answers["envelope-mc"], answers["intree-map"],
                                        timed_object(templates[name], name))
        print(f"in-tree answer, {name} object: envelope-intree stores it as envelope-mc "
              f"(warnings: {answers['envelope-mc']['warnings']}); intree-map: {verdict}")
    return out


GAPS: tuple[tuple[tuple[str, ...], str, str, float], ...] = (
    (("mutated", "burstable"), "envelope-mc", "floor-patch", 1.2),
    (("mutated", "burstable"), "envelope-mc", "go-h2", 2.0),
    (("compliant",), "envelope-mc", "go-h2", 1.3),
    (("mutated", "burstable", "compliant"), "envelope-intree", "envelope-mc", 1.0),
)
"""Issue 39's held line: (objects, round, against, most added p50 as a multiple of the
other's). Every run prints each pair it has, so a feature that costs a millisecond
shows as a ratio, not as a number to compare with an old run on another day."""


def floor_gaps(median: dict[tuple[str, str, int], dict[str, float]]) -> None:
    """Print the gap of Envelope's rounds to ``floor-patch`` and ``go-h2`` (added p50
    over ``none``, as a ratio) for every pair of :data:`GAPS` this run measured."""
    rows = intree.target_ratios(median, GAPS)
    if rows:
        print("\ngaps (added p50 over none, ms; ratio to the floor; issue 39's line)")
        print("| objects | c | round | added p50 | against | added p50 | ratio | line | met |")
        print("|---|---|---|---|---|---|---|---|---|")
    for t in rows:
        ratio = "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}×"
        met = "n/a" if t["ratio"] is None else ("yes" if t["met"] else "**no**")
        print(f"| {t['object']} | {t['concurrency']} | {t['round']} | {t['added']:+.1f} "
              f"| {t['against']} | {t['added_against']:+.1f} | {ratio} | ≤ {t['goal']}× | {met} |")


def report(runs: dict[tuple[str, str, int], list[dict[str, float]]], rss: dict[str, list[float]],
           args: argparse.Namespace, loads: list[str]) -> None:
    median = {key: {k: statistics.median(r.get(k, 0.0) for r in rs)
                    for k in dict.fromkeys(k for r in rs for k in r)} for key, rs in runs.items()}
    print(f"{args.count} Deployment creates per round through kube-apiserver; medians of "
          f"{args.repeat} run(s); {loads[0]} at start, {loads[-1]} at the end "
          f"(per repetition: {'; '.join(loads[1:])})")
    print("CPU columns: milliseconds of CPU per create, per process")
    for obj_name in dict.fromkeys(k[1] for k in median):
        for c in dict.fromkeys(k[2] for k in median):
            base = median[("none", obj_name, c)]
            print(f"\n{obj_name} objects, concurrency {c}")
            print("| round | creates/s | p50 ms | p99 ms | added p50 | added p99 "
                  "| kube-apiserver | etcd | webhook | client |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for (label, o, cc), r in median.items():
                if (o, cc) != (obj_name, c):
                    continue
                print(f"| {label} | {r['rate']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} "
                      f"| {r['p50'] - base['p50']:+.1f} | {r['p99'] - base['p99']:+.1f} "
                      f"| {r['cpu:kube-apiserver']:.2f} | {r['cpu:etcd']:.2f} "
                      f"| {r.get('cpu:webhook', 0.0):.2f} | {r['cpu:client']:.2f} |")
            print(f"\nadmission per create, {obj_name} objects, concurrency {c} (API server metrics: "
                  "webhook calls; milliseconds of wall time in each admission plugin and in "
                  "matchConditions)")
            print("| round | mutating calls | validating calls | MutatingAdmissionPolicy ms "
                  "| MutatingAdmissionWebhook ms | ValidatingAdmissionWebhook ms "
                  "| webhook matchConditions ms | policy matchConditions ms |")
            print("|---|---|---|---|---|---|---|---|")
            for (label, o, cc), r in median.items():
                if (o, cc) == (obj_name, c):
                    print(f"| {label} | {r.get('calls:admit', 0.0):.2f} "
                          f"| {r.get('calls:validating', 0.0):.2f} "
                          f"| {r.get('plugin:MutatingAdmissionPolicy', 0.0):.2f} "
                          f"| {r.get('plugin:MutatingAdmissionWebhook', 0.0):.2f} "
                          f"| {r.get('plugin:ValidatingAdmissionWebhook', 0.0):.2f} "
                          f"| {r.get('match:webhook', 0.0):.2f} | {r.get('match:policy', 0.0):.2f} |")
    floor_gaps(median)
    targets = intree.target_ratios(median)
    if targets:
        print("\nin-tree targets (added p50 over none; ratio; API-server CPU ms per create)")
        print("| objects | c | round | added p50 | against | added p50 | ratio | target | met "
              "| kube-apiserver CPU | against |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for t in targets:
            ratio = "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}×"
            goal = "reported" if t["goal"] is None else f"≤ {t['goal']}×"
            met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
            print(f"| {t['object']} | {t['concurrency']} | {t['round']} | {t['added']:+.1f} "
                  f"| {t['against']} | {t['added_against']:+.1f} | {ratio} | {goal} | {met} "
                  f"| {t['cpu']:.2f} | {t['cpu_against']:.2f} |")
    if rss:
        print("\nRSS of each webhook process after its round (MiB, median): "
              + ", ".join(f"{label} {statistics.median(v):.0f}" for label, v in rss.items()))
    print("\nall runs (JSON):")
    print(json.dumps({f"{k[0]}/{k[1]}/c{k[2]}": v for k, v in runs.items()}))


if __name__ == "__main__":
    sys.exit(main())
