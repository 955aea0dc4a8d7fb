"""Throughput and latency of /mutate over HTTPS keep-alive, against a floor route.

Run by hand (`make bench`), not in the test suite. Needs `wrk` (Debian: apt-get install
wrk). Starts one server — Envelope's app plus the floor routes of ``bench/floor.py`` —
and drives it with wrk at concurrency 16 on one
wrk thread, first /floor (reads the body, answers a canned allow: the cost of
uvicorn + TLS + HTTP alone), then /floor-decode (the floor plus decoding the review and
encoding an allow, as every review does before its rules), then /mutate and
/validate with a realistic 3-container Deployment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.serve.tls import write_self_signed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def container(name: str, cpu: str, memory: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "image": f"registry.example.com/platform/{name}:v1.42.7@sha256:{'a' * 64}",
        "args": ["--port", str(port), "--log-format=json", "--metrics"],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": "RESOURCE_LIMITS", "value": f"cpu={cpu},memory={memory}"},
            {"name": "RESOURCE_REQUESTS", "value": f"cpu={cpu},memory={memory}"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.observability:4317"},
        ],
        "resources": {"limits": {"cpu": cpu, "memory": memory, "ephemeral-storage": "2Gi"},
                      "requests": {"memory": memory}},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": port}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app"},
                         {"name": "cache", "mountPath": "/var/cache/app"}],
        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }


def deployment() -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "trainer", "app.kubernetes.io/part-of": "ml-platform",
              "team": "vision"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "team-vision", "labels": labels,
                     "annotations": {"deployment.kubernetes.io/revision": "12"}},
        "spec": {
            "replicas": 3, "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels,
                             "annotations": {"prometheus.io/scrape": "true"}},
                "spec": {
                    "serviceAccountName": "trainer",
                    "containers": [container("trainer", "7", "29Gi", 8080),
                                   container("sidecar-proxy", "500m", "256Mi", 15001),
                                   container("log-shipper", "250m", "128Mi", 2020)],
                    "volumes": [{"name": "config", "configMap": {"name": "trainer"}},
                                {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}}],
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}],
                },
            },
        },
    }


def review_body(case: str = "mutate") -> bytes:
    """The review: ``mutate`` (the Deployment as above), or for ``--nodes`` runs the same
    Deployment placed on the bench nodes (zone z1, no GPU): ``fits`` (a node takes it) or
    ``refused`` (the trainer asks 100 cpu: no node has room, pod-fits-node refuses)."""
    obj = deployment()
    if case in ("fits", "refused"):
        spec = obj["spec"]["template"]["spec"]
        spec["nodeSelector"] = {"zone": "z1"}
        if case == "refused":
            for key in ("limits", "requests"):
                spec["containers"][0]["resources"].setdefault(key, {})["cpu"] = "100"
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                    "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                    "requestKind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "name": "trainer", "namespace": "team-vision", "operation": "CREATE",
                    "userInfo": {"username": "system:serviceaccount:argocd:argocd-application-controller",
                                 "groups": ["system:serviceaccounts", "system:authenticated"]},
                    "object": obj, "oldObject": None, "dryRun": False,
                    "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions",
                                "fieldManager": "argocd-controller"}},
    }).encode()


LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("{body}", "rb"); wrk.body = f:read("*a"); f:close()
"""


def wrk(url: str, script: Path, seconds: int, connections: int, timeout: int = 2) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                          "--timeout", f"{timeout}s", "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert m, out
        return float(m[1]) * unit[m[2]]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    timeouts = re.search(r"timeout (\d+)", out)
    done = re.search(r"(\d+) requests in", out)
    return {"rps": rps, "p50": pct("50"), "p99": pct("99"),
            "non2xx": float(errors[1]) if errors else 0.0,
            "timeouts": float(timeouts[1]) if timeouts else 0.0,
            "requests": float(done[1]) if done else 0.0}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def capacity(base: str, scripts: dict[str, Path], args: argparse.Namespace, pid: int) -> int:
    """/validate of one replica with ``--nodes`` Nodes in its view: an admission and a
    pod-fits-node refusal, each through the real HTTP handler. Besides wrk's figures,
    the server's CPU seconds per review (from /proc): ``1 / that`` is what the replica
    answers per second with its core to itself, whatever else the machine runs."""
    print(f"/validate, {args.nodes} Nodes in the view, concurrency {args.connections}, "
          f"{args.seconds}s per case, server log level {args.log_level}")
    print("| case | reviews/s | p50 ms | p99 ms | non-2xx | timeouts | server CPU ms/review "
          "| reviews/s per core |")
    print("|---|---|---|---|---|---|---|---|")
    for case, script in scripts.items():
        wrk(base + "/validate", script, 3, args.connections)  # warm up
        before = cpu_seconds(pid)
        # The API server's webhook timeout (10 s by default): an answer later than that
        # is a failed write, counted by wrk as a timeout.
        r = wrk(base + "/validate", script, args.seconds, args.connections, timeout=10)
        per = (cpu_seconds(pid) - before) / max(r["requests"], 1)
        print(f"| {case} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['non2xx']:.0f} "
              f"| {r['timeouts']:.0f} | {per * 1e3:.2f} | {1 / per if per else 0:.0f} |", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--nodes", type=int, default=0,
                        help="capacity run: /validate with this many Nodes in the view (fits and refused)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("bench: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="envelope-bench-"))
    certs = write_self_signed(tmp)
    body = review_body()
    (tmp / "body.json").write_bytes(body)
    script = tmp / "post.lua"
    script.write_text(LUA.format(body=tmp / "body.json"))
    scripts = {}
    for case in ("fits", "refused"):
        (tmp / f"{case}.json").write_bytes(review_body(case))
        scripts[case] = tmp / f"{case}.lua"
        scripts[case].write_text(LUA.format(body=tmp / f"{case}.json"))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parent / "floor.py"), "--host", "127.0.0.1",
         "--port", str(port), "--cert-file", str(certs.cert), "--key-file", str(certs.key),
         "--log-level", args.log_level, "--nodes", str(args.nodes)],
        stdout=subprocess.DEVNULL, stderr=(tmp / "server.log").open("wb"))
    try:
        for _ in range(100):
            ok = subprocess.run(["curl", "-sf", "--cacert", str(certs.ca),
                                 f"https://127.0.0.1:{port}/healthz"], capture_output=True)
            if ok.returncode == 0:
                break
            time.sleep(0.1)
        base = f"https://127.0.0.1:{port}"
        if args.nodes:
            return capacity(base, scripts, args, server.pid)
        wrk(base + "/mutate", script, 3, args.connections)  # warm up

        def timed(route: str) -> dict[str, float]:
            """wrk's figures and the server's CPU µs per review (from /proc)."""
            before = cpu_seconds(server.pid)
            r = wrk(base + route, script, args.seconds, args.connections)
            r["cpu_us"] = (cpu_seconds(server.pid) - before) / max(r["requests"], 1) * 1e6
            return r

        floor, decode, mutate, validate = (timed(route) for route in (
            "/floor", "/floor-decode", "/mutate", "/validate"))
    finally:
        server.terminate()
        server.wait(15)
    print(f"body: {len(body)} bytes, concurrency {args.connections}, {args.seconds}s per route, "
          f"server log level {args.log_level}")
    print("| route | reviews/s | p50 ms | p99 ms | non-2xx | server CPU µs/review |")
    print("|---|---|---|---|---|---|")
    for name, r in (("/floor", floor), ("/floor-decode", decode), ("/mutate", mutate),
                    ("/validate", validate)):
        print(f"| {name} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['non2xx']:.0f} "
              f"| {r['cpu_us']:.0f} |")
    print(f"floor-decode / floor throughput: {decode['rps'] / floor['rps']:.2f}x")
    print(f"mutate / floor throughput: {mutate['rps'] / floor['rps']:.2f}x")
    print(f"validate / floor throughput: {validate['rps'] / floor['rps']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
