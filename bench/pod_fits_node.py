"""Cost of ``pod-fits-node`` against cluster size: p50 and p99 per review.

Run by hand (``.venv/bin/python bench/pod_fits_node.py``), not in the test suite.

The rule function is called in-process (its ScopedView, as the engine gives it) on a
Deployment, for admissions and refusals:

- "first node fits": any node takes it;
- "every 10th node fits": a GPU request with a toleration and a zone selector;
- "pinned to one host": ``nodeSelector`` on ``kubernetes.io/hostname`` (the node
  named is judged on its own);
- "no node fits (refused)": every node (class) is judged and the closest named;
- "tainted away (refused)": no node admits the placement (the reasons are listed).

Nodes look like a cloud's: 12 labels each, ``kubernetes.io/hostname`` unique per node,
3 zones, 2 instance types, every tenth a tainted GPU node (6 node classes at any
size). Wall time and the thread's CPU time are both shown: on a shared machine the wall
p99 is mostly the time other processes held the core. ``--shapes N`` gives every node
one of N allocatable sizes instead: the worst case, where classes are many (capped at
``MAX_NODE_GROUPS`` per review).

``--dra``: the GPU nodes' GPUs are DRA devices instead (issue 27 items 3 and 5): no
``nvidia.com/gpu`` allocatable, one ResourceSlice of 8 devices (each with a unique
``uuid`` attribute, as NVIDIA's driver publishes) per GPU node, a DeviceClass mapping
``nvidia.com/gpu``, every other GPU node's first two devices held by a ResourceClaim, and
two more cases: a pod whose claim template asks 4 H100s (fits) and one asking 9 (refused).
The first review after a change of Nodes, ResourceSlices or ResourceClaims splits the
classes by their devices (shown as "split"); the rounds after it reuse it.

``--status-reports N`` (with ``--dra``; issue 38, class 4): before each review, N Nodes
send a status report (a new resourceVersion and heartbeat, kept as the live view keeps
it: ``trim_node``) and one ResourceClaim is relabelled — writes that change nothing the
split reads. Before issue 38 each of them resplit the devices.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cluster.live import trim_node  # noqa: E402
from app.cluster.view import ScopedView, StaticView  # noqa: E402
from app.core.config import Policy  # noqa: E402
from app.rules import namespace  # noqa: E402
from app.rules.base import Subject  # noqa: E402
from app.rules.namespace import pod_fits_node  # noqa: E402


def nodes(n: int, shapes: int = 0, dra: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        gpu = i % 10 == 9
        name = f"ip-10-0-{i // 250}-{i % 250}.ec2.internal"
        cpu = str(64 + (i % shapes)) if shapes else "64"
        out.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "zone": f"z{i % 3}",
                "topology.kubernetes.io/zone": f"eu-west-1{'abc'[i % 3]}",
                "topology.kubernetes.io/region": "eu-west-1",
                "node.kubernetes.io/instance-type": "p4d.24xlarge" if gpu else "m6i.16xlarge",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                "eks.amazonaws.com/nodegroup": "gpu" if gpu else "general",
                "eks.amazonaws.com/capacityType": "ON_DEMAND",
                "node.kubernetes.io/role": "worker"}},
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}] if gpu else []},
            "status": {"allocatable": {"cpu": cpu, "memory": "256Gi", "pods": "110",
                                       "ephemeral-storage": "100Gi",
                                       "nvidia.com/gpu": "8" if gpu and not dra else "0"}},
        })
        if dra and gpu:
            out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                        "metadata": {"name": f"{name}-gpu"},
                        "spec": {"driver": DRIVER, "nodeName": name,
                                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                                 "devices": [{"name": f"gpu-{d}", "attributes": {
                                     "model": {"string": "H100"}, "uuid": {"string": f"GPU-{i}-{d}"}}}
                                     for d in range(8)]}})
            if i % 20 == 9:
                out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": f"held-{i}", "namespace": "a"},
                            "spec": {"devices": {"requests": []}},
                            "status": {"allocation": {"devices": {"results": [
                                {"request": "r", "driver": DRIVER, "pool": name, "device": f"gpu-{d}"}
                                for d in range(2)]}}}})
    if dra:
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
                    "spec": {"extendedResourceName": "nvidia.com/gpu",
                             "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}})
        for want in (4, 9):
            out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                        "metadata": {"name": f"h100-{want}", "namespace": "a"},
                        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                            "deviceClassName": "gpu", "count": want, "selectors": [{"cel": {
                                "expression": f'device.attributes["{DRIVER}"].model == "H100"'}}]}}]}}}})
    return out


DRIVER = "gpu.nvidia.com"


def deployment(resources: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "namespace": "a"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "c", "image": "x", "resources": resources}], **(extra or {})}}}}


SMALL = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
CASES = {
    "first node fits": deployment(SMALL),
    "every 10th node fits": deployment(
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi", "nvidia.com/gpu": "4"}},
        {"tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"zone": "z2"}}),
    "pinned to one host": deployment(
        SMALL, {"nodeSelector": {"kubernetes.io/hostname": "ip-10-0-3-17.ec2.internal"}}),
    "no node fits (refused)": deployment(
        {"requests": {"cpu": "100", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}),
    "tainted away (refused)": deployment(
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi", "nvidia.com/gpu": "4"}}),
}


def claiming(want: int) -> dict[str, Any]:
    obj = deployment(SMALL, {"tolerations": [{"key": "gpu", "operator": "Exists"}],
                             "resourceClaims": [{"name": "g", "resourceClaimTemplateName": f"h100-{want}"}]})
    return obj


DRA_CASES = {"DRA claim of 4 H100 fits": claiming(4), "DRA claim of 9 (refused)": claiming(9)}


def p(times: list[float], pct: int) -> float:
    """The ``pct`` percentile of ``times``, in ms (p50: the median)."""
    ordered = sorted(times)
    if pct == 50:
        return statistics.median(ordered) * 1e3
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10,1000,5000")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--shapes", type=int, default=0, help="distinct allocatable sizes (0: 12 classes)")
    parser.add_argument("--dra", action="store_true", help="GPUs as DRA devices (ResourceSlices)")
    parser.add_argument("--status-reports", type=int, default=0,
                        help="Node status reports and claim relabels before each review")
    args = parser.parse_args()
    policy = Policy()
    subject = Subject("apps", "v1", "Deployment", namespace="a", name="w")
    indexes = getattr(namespace, "INDEXES", ())
    for size in (int(s) for s in args.sizes.split(",")):
        objects = nodes(size, args.shapes, args.dra)
        store = StaticView(objects, indexes)
        writes = _status_reports(store, objects, args.status_reports)
        view = ScopedView(store, pod_fits_node.rule.reads, "pod-fits-node")  # type: ignore[attr-defined]
        pod_fits_node(subject, CASES["first node fits"], view, policy)  # warm any cache
        cases = {**CASES, **(DRA_CASES if args.dra else {})}
        if args.dra:
            for name in ("every 10th node fits", "DRA claim of 4 H100 fits"):
                start_cpu = time.thread_time()
                pod_fits_node(subject, cases[name], view, policy)
                print(f"{size:>5} nodes  split by devices ({name}): "
                      f"{(time.thread_time() - start_cpu) * 1e3:.1f} ms cpu, once per change", flush=True)
        for name, obj in cases.items():
            findings = pod_fits_node(subject, obj, view, policy)
            verdict = "refused" if any(f.severity == "error" for f in findings) else \
                "warned" if findings else "allowed"
            wall, cpu = [], []
            for _ in range(args.rounds):
                writes()
                start, start_cpu = time.perf_counter(), time.thread_time()
                pod_fits_node(subject, obj, view, policy)
                cpu.append(time.thread_time() - start_cpu)
                wall.append(time.perf_counter() - start)
            print(f"{size:>5} nodes  {name:<24} {verdict:<8} wall p50 {p(wall, 50):8.3f} "
                  f"p99 {p(wall, 99):8.3f}  cpu p50 {p(cpu, 50):8.3f} p99 {p(cpu, 99):8.3f} ms", flush=True)


def _status_reports(store: StaticView, objects: list[dict[str, Any]], n: int) -> Any:
    """Writes that change nothing a rule reads: ``n`` Node status reports (a new
    resourceVersion, kept by the live view) and one claim's labels, per call."""
    node_list = [o for o in objects if o["kind"] == "Node"]
    claims = [o for o in objects if o["kind"] == "ResourceClaim"]
    tick = iter(range(1, 1 << 62))

    def writes() -> None:
        if not n:
            return
        version = next(tick)
        for i in range(n):
            node = node_list[(version * n + i) % len(node_list)]
            reported = {**node, "metadata": {**node["metadata"], "resourceVersion": str(version)},
                        "status": {**node["status"], "conditions": [
                            {"type": "Ready", "status": "True", "lastHeartbeatTime": str(version)}]}}
            store.add(trim_node(reported))
        if claims:
            claim = claims[version % len(claims)]
            store.add({**claim, "metadata": {**claim["metadata"], "labels": {"tick": str(version)}}})

    return writes


if __name__ == "__main__":
    main()
