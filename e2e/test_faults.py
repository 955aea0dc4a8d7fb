"""Fault suite: real kube-apiserver + etcd of its own, two real ``envelope serve``
replicas watching it (through a TCP proxy, so a watch can be cut mid-stream), and a
load client sending AdmissionReviews at ≥ 200/s during each fault:

1. a watch dropped mid-stream (every proxied connection cut);
2. kube-apiserver restarted;
3. one of the two replicas killed (SIGKILL);
4. the serving certificate rewritten in place (certificate, then key 0.2 s later);
5. the serving certificate swapped atomically (kubelet-style ``..data`` symlink);
6. a flood of 3 MiB bodies from a second client;
7. connection hoarders: 1,200 connections that never start TLS and 8 byte-a-second
   bodies at one replica (issue 25).

Each answer is compared with a reference run (the same reviews asked before any
fault): a different verdict, patch, message or warning is a *wrong verdict*. A request
without an answer (or a 5xx, or an answer without its uid) is a *failed admission*;
the only ones the failure mode implies are in-flight requests to the killed replica.
RSS of each replica is sampled throughout. The figures are printed and recorded in
docs/reliability.md; the suite asserts 0 wrong verdicts, 0 failed admissions beyond the
killed replica's, and RSS under the chart's memory limit."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import harness
from harness import Cluster

CHART_MEMORY_LIMIT_MIB = 384
"""charts/envelope/values.yaml resources.limits.memory (Mi)."""
LOAD_THREADS = 4
PHASE_SECONDS = 6.0


# ------------------------------------------------------------------ TCP proxy


class Proxy:
    """127.0.0.1:<port> -> the API server; ``drop()`` cuts every open connection
    (both directions) mid-stream, as a lost node or a load balancer reset would."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> int:
        with self.lock:
            victims, self.open = self.open, []
        for s in victims:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.dropped += len(victims) // 2
        return len(victims) // 2

    def close(self) -> None:
        self.listener.close()
        self.drop()


# ------------------------------------------------------------------ reviews


def _deployment(i: int, memory: str, cpu_limit: bool) -> dict[str, Any]:
    limits = {"memory": memory, **({"cpu": "2"} if cpu_limit else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"load-{i}", "namespace": "faults"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": f"load-{i}"}},
                     "template": {"metadata": {"labels": {"app": f"load-{i}"}},
                                  "spec": {"containers": [{
                                      "name": "c", "image": "registry.k8s.io/pause:3.10",
                                      "resources": {"requests": {"cpu": "500m", "memory": memory},
                                                    "limits": limits}}]}}}}


# Memory sizes around the nodes' 64Gi: the view decides (pod-fits-node), so a lost or
# partial view changes the verdict and shows up as a wrong one.
SIZES = ["1Gi", "8Gi", "32Gi", "63Gi", "64Gi", "65Gi", "100Gi", "200Gi"]
REVIEWS = [(endpoint, _deployment(i, size, cpu_limit=bool(i % 2)))
           for i, size in enumerate(SIZES * 2) for endpoint in ("/mutate", "/validate")]


def review_body(index: int, uid: str) -> bytes:
    _, obj = REVIEWS[index]
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "operation": "CREATE", "namespace": "faults",
                                   "name": obj["metadata"]["name"],
                                   "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                                   "resource": {"group": "apps", "version": "v1",
                                                "resource": "deployments"},
                                   "userInfo": {"username": "load"}, "object": obj}}).encode()


def verdict(answer: dict[str, Any]) -> str:
    response = dict(answer["response"])
    response.pop("uid", None)
    return json.dumps(response, sort_keys=True)


# ------------------------------------------------------------------ load


@dataclass
class Endpoint:
    name: str
    port: int
    context: ssl.SSLContext
    alive: bool = True
    killed: bool = False
    """Being killed by the test: failures on it are the ones the failure mode implies."""


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    failed: int = 0
    failed_on_killed: int = 0
    wrong: int = 0
    no_uid: int = 0
    latencies: list[float] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)


class Load:
    """``LOAD_THREADS`` threads, each with a keep-alive HTTPS connection to one replica
    (round-robin over the live ones), reconnecting every ``reconnect_every`` requests so
    new handshakes happen during certificate rotation."""

    def __init__(self, endpoints: list[Endpoint], reference: dict[int, str],
                 reconnect_every: int = 20) -> None:
        self.endpoints = endpoints
        self.reference = reference
        self.reconnect_every = reconnect_every
        self.tally = Tally()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True)
                        for t in range(LOAD_THREADS)]
        self.started = 0.0
        self.elapsed = 0.0

    def __enter__(self) -> Load:
        self.started = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        self.elapsed = time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.tally.answered / self.elapsed if self.elapsed else 0.0

    def _run(self, worker: int) -> None:
        conn: http.client.HTTPSConnection | None = None
        target: Endpoint | None = None
        n = worker
        while not self.stop.is_set():
            live = [e for e in self.endpoints if e.alive]
            if target is None or not target.alive:
                target = live[worker % len(live)]
                conn = None
            if conn is None:
                conn = http.client.HTTPSConnection("127.0.0.1", target.port,
                                                   context=target.context, timeout=15)
            index = n % len(REVIEWS)
            uid = f"load-{worker}-{n}"
            n += 1
            started = time.monotonic()
            with self.lock:
                self.tally.sent += 1
            try:
                conn.request("POST", REVIEWS[index][0], body=review_body(index, uid),
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                status = response.status
            except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
                conn.close()
                conn = None
                with self.lock:
                    if target.killed:
                        self.tally.failed_on_killed += 1
                        target.alive = False  # as a Service drops the endpoint
                    else:
                        self.tally.failed += 1
                        self.tally.examples.append(f"{target.name}: {type(exc).__name__}: {exc}")
                continue
            elapsed = time.monotonic() - started
            with self.lock:
                self.tally.latencies.append(elapsed)
                if status != 200:
                    self.tally.failed += 1
                    self.tally.examples.append(f"{target.name}: HTTP {status} {data[:200]!r}")
                    continue
                self.tally.answered += 1
                answer = json.loads(data)
                if answer.get("response", {}).get("uid") != uid:
                    self.tally.no_uid += 1
                if verdict(answer) != self.reference[index]:
                    self.tally.wrong += 1
                    self.tally.examples.append(f"{target.name}: wrong verdict for {index}: "
                                               f"{verdict(answer)[:300]}")
            if n % self.reconnect_every == 0:
                conn.close()
                conn = None


class RssSampler:
    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss(pid: int) -> float:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak.get(name, 0.0), self.rss(pid))

    def __enter__(self) -> RssSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


# ------------------------------------------------------------------ fixture


@dataclass
class Rig:
    cluster: Cluster
    proxy: Proxy
    replicas: dict[str, harness.Webhook]
    endpoints: dict[str, Endpoint]
    cert_dir: Path
    spare: tuple[Path, Path, Path]
    reference: dict[int, str]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


def _proxied_kubeconfig(cluster: Cluster, proxy: Proxy, path: Path) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _swap_data(cert_dir: Path, cert: Path, key: Path, generation: int) -> None:
    """kubelet-style atomic update: a new ``..<generation>`` directory, then one rename
    of the ``..data`` symlink."""
    new = cert_dir / f"..{generation}"
    new.mkdir()
    shutil.copy(cert, new / "tls.crt")
    shutil.copy(key, new / "tls.key")
    tmp = cert_dir / "..data_tmp"
    tmp.symlink_to(new.name)
    os.replace(tmp, cert_dir / "..data")


def _ready(webhook: harness.Webhook, context: ssl.SSLContext) -> bool:
    try:
        return harness.https_get(f"{webhook.url}/readyz", context, timeout=3)[0] == 200
    except OSError:
        return False


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout}s: {what}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def rig(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("faults")
    cluster = harness.start_control_plane(work / "cp", controlplane_bin_dir)
    proxy = Proxy(int(cluster.api_url.rsplit(":", 1)[1]))
    replicas: dict[str, harness.Webhook] = {}
    try:
        for i in range(3):
            cluster.create_node(f"fault-node-{i}", {"cpu": "16", "memory": "64Gi", "pods": "110"})
        kubeconfig = _proxied_kubeconfig(cluster, proxy, work / "proxied-kubeconfig")
        # Replica a serves from kubelet-style symlinked files, so both rotations can run on it.
        cert_dir = work / "a-tls"
        cert_dir.mkdir()
        ca_a, cert_a, key_a = harness.make_serving_cert(work / "certs-a", name="a")
        spare = harness.make_serving_cert(work / "certs-b", name="b")
        _swap_data(cert_dir, cert_a, key_a, 1)
        for name in ("tls.crt", "tls.key"):
            (cert_dir / name).symlink_to(f"..data/{name}")
        env = {"MALLOC_ARENA_MAX": "2"}
        common = ["--cluster-view", "live", "--staleness", "60"]
        probe_a = ssl.create_default_context(cafile=str(ca_a))
        replicas["a"] = harness.start_webhook(
            work / "a", kubeconfig=kubeconfig, env=env, probe_context=probe_a,
            extra_args=[*common, "--cert-file", str(cert_dir / "tls.crt"),
                        "--key-file", str(cert_dir / "tls.key")])
        replicas["b"] = harness.start_webhook(work / "b", kubeconfig=kubeconfig, env=env,
                                              extra_args=common)
        context_a = ssl.create_default_context(cafile=str(ca_a))
        context_a.load_verify_locations(cafile=str(spare[0]))
        endpoints = {"a": Endpoint("a", replicas["a"].port, context_a),
                     "b": Endpoint("b", replicas["b"].port,
                                   ssl.create_default_context(cafile=str(replicas["b"].ca_file)))}
        for name, webhook in replicas.items():
            _wait(lambda w=webhook, c=endpoints[name].context: _ready(w, c), 60, f"{name} ready")
        # The reference: each review asked once of replica a, and checked against b.
        reference: dict[int, str] = {}
        for index in range(len(REVIEWS)):
            answers = []
            for endpoint in endpoints.values():
                conn = http.client.HTTPSConnection("127.0.0.1", endpoint.port,
                                                   context=endpoint.context, timeout=10)
                conn.request("POST", REVIEWS[index][0], body=review_body(index, "ref"),
                             headers={"Content-Type": "application/json"})
                answers.append(verdict(json.loads(conn.getresponse().read())))
                conn.close()
            assert answers[0] == answers[1], answers
            reference[index] = answers[0]
        denied = sum('"allowed": false' in v for v in reference.values())
        assert denied >= 4, "the view must decide some verdicts (nodes not seen?)"
        rig = Rig(cluster, proxy, replicas, endpoints, cert_dir, spare, reference)
        yield rig
        print("\nFAULT SUITE", json.dumps(rig.results, indent=1))
        (work / "results.json").write_text(json.dumps(rig.results, indent=1))
    finally:
        for webhook in replicas.values():
            webhook.stop()
        proxy.close()
        cluster.stop()


def run_phase(rig: Rig, name: str, fault: Callable[[], None], *, on: tuple[str, ...] = ("a", "b"),
              at: float = 2.0, seconds: float = PHASE_SECONDS) -> Tally:
    endpoints = [rig.endpoints[n] for n in on if rig.endpoints[n].alive]
    pids = {n: rig.replicas[n].process.pid for n in on if rig.endpoints[n].alive}
    with RssSampler(pids) as rss, Load(endpoints, rig.reference) as load:
        time.sleep(at)
        fault()
        time.sleep(max(0.0, seconds - at))
    tally = load.tally
    lat = sorted(tally.latencies) or [0.0]
    rig.results[name] = {
        "requests": tally.sent, "answered": tally.answered, "rate_per_s": round(load.rate),
        "failed": tally.failed, "failed_on_killed_replica": tally.failed_on_killed,
        "wrong_verdicts": tally.wrong, "answers_without_uid": tally.no_uid,
        "p50_ms": round(statistics.median(lat) * 1000, 1),
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1 if len(lat) > 1 else 0] * 1000, 1),
        "max_ms": round(lat[-1] * 1000, 1),
        "rss_peak_mib": {n: round(v) for n, v in rss.peak.items()},
        "examples": tally.examples[:5],
    }
    return tally


def check(rig: Rig, name: str, tally: Tally) -> None:
    result = rig.results[name]
    assert tally.wrong == 0, result
    assert tally.no_uid == 0, result
    assert tally.failed == 0, result
    assert tally.answered > 0, result
    for mib in result["rss_peak_mib"].values():
        assert mib < CHART_MEMORY_LIMIT_MIB, result


# ------------------------------------------------------------------ the faults
# In file order; each leaves the rig serving for the next.


def test_watch_dropped_mid_stream(rig: Rig) -> None:
    tally = run_phase(rig, "watch dropped", lambda: rig.proxy.drop())
    assert rig.proxy.dropped > 0, "no watch was open through the proxy"
    check(rig, "watch dropped", tally)


def test_apiserver_restart(rig: Rig) -> None:
    [apiserver] = [p for p in rig.cluster.processes if p.name == "kube-apiserver"]

    def restart() -> None:
        apiserver.stop(timeout=20)
        restarted = harness.start_process(apiserver.cmd, rig.cluster.workdir / "kube-apiserver.restart.log",
                                          name="kube-apiserver")
        rig.cluster.processes[rig.cluster.processes.index(apiserver)] = restarted

    tally = run_phase(rig, "apiserver restart", restart, seconds=PHASE_SECONDS + 4)
    check(rig, "apiserver restart", tally)
    for name, webhook in rig.replicas.items():
        _wait(lambda w=webhook, c=rig.endpoints[name].context: _ready(w, c), 90, f"{name} ready again")


def test_certificate_rewritten_in_place(rig: Rig) -> None:
    _, cert_b, key_b = rig.spare
    data = rig.cert_dir / "..data"

    def rewrite() -> None:
        (data / "tls.crt").write_bytes(cert_b.read_bytes())
        time.sleep(0.2)
        (data / "tls.key").write_bytes(key_b.read_bytes())

    # The watcher looks every 10 s: long enough a phase to see the new pair served.
    tally = run_phase(rig, "certificate rewritten in place", rewrite, on=("a",), at=1.0,
                      seconds=13.0)
    check(rig, "certificate rewritten in place", tally)
    served = ssl.get_server_certificate(("127.0.0.1", rig.endpoints["a"].port)).encode()
    assert served.strip() == cert_b.read_bytes().strip()


def test_certificate_swapped_atomically(rig: Rig) -> None:
    work = rig.cert_dir.parent
    ca_a = work / "certs-a" / "a-ca.crt"
    cert_a, key_a = work / "certs-a" / "a.crt", work / "certs-a" / "a.key"
    tally = run_phase(rig, "certificate swapped atomically",
                      lambda: _swap_data(rig.cert_dir, cert_a, key_a, 2), on=("a",), at=1.0,
                      seconds=13.0)
    check(rig, "certificate swapped atomically", tally)
    assert ca_a.exists()
    served = ssl.get_server_certificate(("127.0.0.1", rig.endpoints["a"].port)).encode()
    assert served.strip() == cert_a.read_bytes().strip()


def test_body_flood(rig: Rig) -> None:
    """Eight clients sending 3 MiB reviews back to back at replica a while the load
    runs on both replicas."""
    big = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
           "request": {"uid": "flood", "operation": "CREATE", "namespace": "faults",
                       "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                       "object": {**_deployment(0, "1Gi", True),
                                  "metadata": {"name": "flood", "namespace": "faults",
                                               "annotations": {"x": "y" * (3 * 2**20 - 2000)}}}}}
    body = json.dumps(big).encode()
    assert len(body) <= 3 * 2**20
    stop = threading.Event()
    sent = [0]

    def flood() -> None:
        context = rig.endpoints["a"].context
        while not stop.is_set():
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", rig.endpoints["a"].port,
                                                   context=context, timeout=20)
                conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
                conn.getresponse().read()
                conn.close()
                sent[0] += 1
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)

    flooders = [threading.Thread(target=flood, daemon=True) for _ in range(8)]

    def start() -> None:
        for t in flooders:
            t.start()

    try:
        tally = run_phase(rig, "3 MiB body flood", start, at=0.5, seconds=PHASE_SECONDS + 2)
    finally:
        stop.set()
        for t in flooders:
            t.join(30)
    rig.results["3 MiB body flood"]["flood_bodies"] = sent[0]
    check(rig, "3 MiB body flood", tally)
    assert sent[0] > 0


def test_connection_hoarders(rig: Rig) -> None:
    """Issue 25, class 3: while the load runs, one attacker holds 1,200 connections to
    replica a that never send a ClientHello (more than --max-connections, 1,000),
    re-opening those closed, plus 8 that declare 3 MB bodies and send a byte a second.
    The load's reviews must all be answered (evicted are the silent ones, and the
    trickles hold no body budget)."""
    port = rig.endpoints["a"].port
    stop = threading.Event()
    opened = [0]

    def hoard() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            held = [s for s in held if not _closed(s)]
            while len(held) < 1200 and not stop.is_set():
                try:
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                    opened[0] += 1
                except OSError:
                    break
            time.sleep(0.1)
        for s in held:
            s.close()

    def trickle() -> None:
        context = rig.endpoints["a"].context
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                        context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                    s.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                              b"application/json\r\nContent-Length: 3000000\r\n\r\n")
                    while not stop.is_set():
                        s.sendall(b" ")
                        time.sleep(1.0)
            except OSError:
                time.sleep(0.1)

    threads = [threading.Thread(target=hoard, daemon=True)]
    threads += [threading.Thread(target=trickle, daemon=True) for _ in range(8)]

    def start() -> None:
        for t in threads:
            t.start()

    try:
        tally = run_phase(rig, "connection hoarders", start, at=0.5, seconds=PHASE_SECONDS + 2)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    rig.results["connection hoarders"]["hoarded_connections_opened"] = opened[0]
    check(rig, "connection hoarders", tally)
    assert opened[0] >= 1200


def _closed(s: socket.socket) -> bool:
    """A hoarded connection never receives anything: readable means closed."""
    import select

    try:
        return bool(select.select([s], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def test_one_of_two_replicas_killed(rig: Rig) -> None:
    """Last: it leaves one replica."""
    def kill() -> None:
        rig.endpoints["b"].killed = True
        os.killpg(rig.replicas["b"].process.pid, signal.SIGKILL)

    tally = run_phase(rig, "replica killed", kill)
    check(rig, "replica killed", tally)
    # In flight on b when it died, at most one per load thread (then they move to a,
    # as a Service drops the endpoint): what failurePolicy answers in a cluster.
    assert tally.failed_on_killed <= LOAD_THREADS, rig.results["replica killed"]
