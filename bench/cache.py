"""Admission cost with a big cluster cached vs an empty one, and what the cache weighs.

Run by hand (`make bench-cache`). In-process: fills a Store with trimmed objects
exactly as the live informers keep them (5,000 Nodes, 10,000 Deployments in 1,000
namespaces, a ResourceQuota and LimitRange per namespace), then times the
mutate + validate evaluation of a realistic Deployment against it and against an
empty Store. Memory is measured with tracemalloc (bytes the cached objects hold)
and as the process's RSS growth.
"""

from __future__ import annotations

import argparse
import copy
import gc
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from webhook import deployment  # noqa: E402

from app.cluster.live import trim_node, trim_whole, trim_workload  # noqa: E402
from app.cluster.view import Store  # noqa: E402
from app.core.config import Policy  # noqa: E402
from app.core.engine import evaluate  # noqa: E402
from app.core.frontdoor import subject_of  # noqa: E402
from app.core.ruleset import default_ruleset  # noqa: E402

RULES = default_ruleset()

GPU = "nvidia.com/gpu.product"


def node(i: int) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": f"node-{i}", "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": f"zone-{i % 3}",
              "node.kubernetes.io/instance-type": "gpu-8x" if i % 2 else "cpu-64",
              GPU: "NVIDIA-H100-80GB-HBM3" if i % 2 else "none"}
    labels.update({f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true"
                   for f in ("AVX", "AVX2", "AVX512F", "FMA3", "SSE4", "AESNI")})
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i}", "labels": labels, "resourceVersion": str(i),
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24",
                     "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}] if i % 2 else []},
            "status": {"allocatable": {"cpu": "63", "memory": "500Gi", "pods": "110",
                                       "nvidia.com/gpu": "8" if i % 2 else "0"},
                       "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}] * 5,
                       "images": [{"names": [f"registry/image-{j}:v1"], "sizeBytes": 10**8}
                                  for j in range(20)]}}


def workload(i: int, ns: str) -> dict[str, Any]:
    obj = deployment()
    obj["metadata"] = {"name": f"app-{i}", "namespace": ns, "resourceVersion": str(i)}
    obj["spec"]["replicas"] = 1 + i % 4
    return obj


def fill(store: Store, nodes: int, workloads: int, namespaces: int) -> dict[str, int]:
    """Fill the store; returns the bytes each kind holds (tracemalloc)."""
    held = {}
    tracemalloc.start()
    store.replace("Node", [trim_node(node(i)) for i in range(nodes)])
    held["Node"] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    tracemalloc.start()
    trim = trim_workload("Deployment")
    store.replace("Deployment", [trim(workload(i, f"team-{i % namespaces}"))
                                 for i in range(workloads)])
    quota, limits = trim_whole("ResourceQuota"), trim_whole("LimitRange")
    store.replace("ResourceQuota", [quota({"metadata": {"name": "mem", "namespace": f"team-{n}"},
                                           "spec": {"hard": {"requests.memory": "10Ti"}}})
                                    for n in range(namespaces)])
    held["Deployment, ResourceQuota, LimitRange"] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held
    store.replace("LimitRange", [limits({"metadata": {"name": "defaults", "namespace": f"team-{n}"},
                                         "spec": {"limits": [{"type": "Container",
                                                              "default": {"cpu": "16"}}]}})
                                 for n in range(namespaces)])
    held["Deployment, ResourceQuota, LimitRange"] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held


def time_admission(store: Store, rounds: int) -> list[float]:
    policy = Policy()
    obj = workload(0, "team-7")
    obj["metadata"]["name"] = "incoming"
    samples = []
    for _ in range(rounds):
        subject = subject_of(copy.deepcopy(obj))
        started = time.perf_counter()
        evaluate(RULES, subject, store, policy, "mutate")
        evaluate(RULES, subject, store, policy, "validate")
        samples.append(time.perf_counter() - started)
    return samples


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--workloads", type=int, default=10000)
    parser.add_argument("--namespaces", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()

    empty = Store(indexes=RULES.indexes)
    time_admission(empty, 300)
    base = time_admission(empty, args.rounds)

    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    big = Store(indexes=RULES.indexes)
    held = fill(big, args.nodes, args.workloads, args.namespaces)
    gc.collect()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    time_admission(big, 300)
    loaded = time_admission(big, args.rounds)

    print(f"mutate+validate of a 3-container Deployment, {args.rounds} rounds, in-process")
    print("| cache | p50 us | p99 us |")
    print("|---|---|---|")
    print(f"| empty | {pct(base, .5):.0f} | {pct(base, .99):.0f} |")
    print(f"| {args.nodes} Nodes, {args.workloads} Deployments, {args.namespaces} namespaces "
          f"| {pct(loaded, .5):.0f} | {pct(loaded, .99):.0f} |")
    print(f"ratio p50 {statistics.median(loaded) / statistics.median(base):.2f}x, "
          f"p99 {pct(loaded, .99) / pct(base, .99):.2f}x")
    print(f"cache memory (tracemalloc, objects still held): {args.nodes} Nodes "
          f"{held['Node'] / 2**20:.1f} MiB ({held['Node'] * 1000 / args.nodes / 2**20:.2f} MiB per "
          f"1,000 nodes); {args.workloads} Deployments + {args.namespaces} quotas and LimitRanges "
          f"{held['Deployment, ResourceQuota, LimitRange'] / 2**20:.1f} MiB; "
          f"process RSS growth {(rss_after - rss_before) / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
