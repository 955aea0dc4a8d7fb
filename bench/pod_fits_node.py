"""Cost of ``pod-fits-node`` (app/scheduling.py, one node at a time) against cluster size.

Run by hand (``.venv/bin/python bench/pod_fits_node.py``), not in the test suite.

The rule function is called in-process on a Deployment for three pods: one the first
node takes, one only every tenth node takes (a GPU request with a toleration and a
zone selector), and one no node takes (every node is checked and the closest named).
Clusters of 10, 1,000 and 5,000 Nodes; the Node list is built once per Node version
(cached), as in the webhook. Prints p50 and p99 per call.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cluster.view import ScopedView, StaticView  # noqa: E402
from app.config import Policy  # noqa: E402
from app.rules.base import Subject  # noqa: E402
from app.rules.namespace import pod_fits_node  # noqa: E402

ROUNDS = 300


def nodes(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        gpu = i % 10 == 9
        out.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"n{i}", "labels": {"zone": f"z{i % 3}"}},
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}] if gpu else []},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110",
                                       "nvidia.com/gpu": "8" if gpu else "0"}},
        })
    return out


def deployment(resources: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "namespace": "a"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "c", "image": "x", "resources": resources}], **(extra or {})}}}}


CASES = {
    "first node fits": deployment({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}),
    "every 10th node fits": deployment(
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi", "nvidia.com/gpu": "4"}},
        {"tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"zone": "z2"}}),
    "no node fits": deployment({"requests": {"cpu": "100", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}),
}


def main() -> None:
    policy = Policy()
    subject = Subject("apps", "v1", "Deployment", namespace="a", name="w")
    for size in (10, 1000, 5000):
        view = ScopedView(StaticView(nodes(size)), frozenset({"Node"}), "pod-fits-node")
        pod_fits_node(subject, CASES["first node fits"], view, policy)  # build the node cache
        for name, obj in CASES.items():
            rounds = ROUNDS if size < 5000 or name != "no node fits" else ROUNDS // 10
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                pod_fits_node(subject, obj, view, policy)
                times.append(time.perf_counter() - start)
            times.sort()
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            print(f"{size:>5} nodes  {name:<22} p50 {statistics.median(times) * 1e3:8.3f} ms"
                  f"  p99 {p99 * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
