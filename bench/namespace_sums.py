"""The namespace sums' memory under annotation patches at the documented scale, in process
(issue 38, class 3). Run by hand: ``.venv/bin/python bench/namespace_sums.py``.

A view as the live one keeps it (``trim_workload``: an annotation patch files a new
dict with a new resourceVersion and nothing else changed) of ``--namespaces``
namespaces, each with a memory ResourceQuota and a LimitRange that fills in memory, and
``--deployments`` Deployments (``bench/cluster_memory.py``'s 3-container workloads).
Then ``--patches`` annotation patches, round-robin over the Deployments, each followed
by a review (every rule, ``check_object``) of a new Deployment in the patched
namespace, which sums it again. Prints the process's RSS once every namespace is summed
and every ``--every`` patches, and the sum memos' sizes. The e2e counterpart through
kube-apiserver and the webhook: ``e2e/test_memory_namespace_sums.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import app.rules.namespace.memory as memory  # noqa: E402
from app.cluster.live import trim_whole, trim_workload  # noqa: E402
from app.cluster.view import StaticView  # noqa: E402
from app.core.config import Policy  # noqa: E402
from app.core.engine import check_object  # noqa: E402
from app.core.ruleset import default_ruleset  # noqa: E402
from app.rules.base import Subject  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def main() -> int:
    from cluster_memory import workload  # after sys.path: harness and urllib3 come with it

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, default=30_000)
    parser.add_argument("--namespaces", type=int, default=1_000)
    parser.add_argument("--patches", type=int, default=48_000)
    parser.add_argument("--every", type=int, default=8_000)
    args = parser.parse_args()

    rules, policy = default_ruleset(), Policy()
    trim_deployment, trim_quota, trim_range = (trim_workload("Deployment"), trim_whole("ResourceQuota"),
                                               trim_whole("LimitRange"))
    view = StaticView()
    for n in range(args.namespaces):
        ns = f"team-{n}"
        view.add(trim_quota({"apiVersion": "v1", "kind": "ResourceQuota",
                             "metadata": {"name": "compute", "namespace": ns},
                             "spec": {"hard": {"requests.memory": "2Ti", "limits.memory": "2Ti"}}}))
        view.add(trim_range({"apiVersion": "v1", "kind": "LimitRange",
                             "metadata": {"name": "defaults", "namespace": ns},
                             "spec": {"limits": [{"type": "Container", "max": {"memory": "512Gi"},
                                                  "defaultRequest": {"memory": "256Mi"},
                                                  "default": {"memory": "256Mi"}}]}}))
    def stored(i: int, version: int) -> dict[str, Any]:
        """Deployment ``i`` as the live view files it at ``version`` (annotated then)."""
        obj = workload(i, f"team-{i % args.namespaces}")
        obj["metadata"].update(uid=f"uid-{i}", resourceVersion=str(version))
        obj["metadata"]["annotations"]["churn"] = str(version)  # what the patch wrote
        trimmed = trim_deployment(obj)
        assert trimmed is not None
        return trimmed

    for i in range(args.deployments):
        view.add(stored(i, 1))

    def review(ns: str, k: int) -> None:
        written = workload(args.deployments + k, ns)
        name = written["metadata"]["name"]
        subject = Subject("apps", "v1", "Deployment", "CREATE", ns, name, written, None)
        found = check_object(rules, subject, view, policy)
        assert not found.internal_errors, found.internal_errors

    started = time.monotonic()
    for n in range(args.namespaces):
        review(f"team-{n}", n)
    samples = [{"patches": 0, "rss_mib": rss_mib(), "seconds": round(time.monotonic() - started, 1)}]
    print(json.dumps(samples[-1]), flush=True)
    for k in range(1, args.patches + 1):
        i = (k - 1) % args.deployments
        view.add(stored(i, 1 + k))  # an annotation patch: a new dict, the same spec
        review(f"team-{i % args.namespaces}", k)
        if k % args.every == 0:
            samples.append({"patches": k, "rss_mib": rss_mib(),
                            "seconds": round(time.monotonic() - started, 1), "derived": len(memory._derived),
                            "derived_mib": round(memory._derived.weight / 2**20, 1)})
            print(json.dumps(samples[-1]), flush=True)
    print(json.dumps({"conditions": {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                     "load": os.getloadavg(), "python": sys.version.split()[0]},
                      "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
