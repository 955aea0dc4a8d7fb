"""KAI quota trees through the real API server (our CRDs in e2e/crds/): a consistent
tenancy applies; over-promising is refused at apply and at --dry-run=server."""

from __future__ import annotations

import time
from typing import Any

import harness
from builders import KAI, department, gpu_node, nodepool, project, resources  # noqa: F401
from harness import Cluster, Webhook


def test_quota_tree_is_judged_at_apply(cluster: Cluster, webhook: Webhook) -> None:
    tag = harness.unique_name("q", max_length=12)
    pool, dept = f"{tag}-h100", f"{tag}-research"
    gpu_node(cluster, f"{tag}-gpu-1", tag, 8)
    gpu_node(cluster, f"{tag}-gpu-2", tag, 8)
    tenancy = [nodepool(pool, tag), department(dept, pool, 12),
               project(f"{tag}-llm", dept, pool, 8), project(f"{tag}-asr", dept, pool, 4)]
    # A consistent tenancy applies cleanly (the webhook learns the pool and nodes by watch;
    # objects are applied in dependency order, as a GitOps tool would).
    for obj in tenancy:
        apply_eventually(cluster, obj)

    grow = project(f"{tag}-asr", dept, pool, 5)
    out = cluster.apply(grow, "--dry-run=server", check=False)
    assert out.returncode != 0
    assert "projects are guaranteed 13 cards in total but the department has 12 cards" in out.stderr
    out = cluster.apply(grow, check=False)
    assert out.returncode != 0 and "1 card" in out.stderr
    stored = cluster.kubectl_json("get", "projects.kai.resources", f"{tag}-asr")
    assert stored["spec"]["queues"][0]["resources"]["gpu"]["deserved"] == 4

    out = cluster.apply(department(dept, pool, 10), check=False)  # below its projects' 12
    assert out.returncode != 0 and "12 cards" in out.stderr and "10 cards" in out.stderr

    out = cluster.apply(department(dept, pool, 20), check=False)  # more than the pool's 16 cards
    assert out.returncode != 0 and "16 cards" in out.stderr


def apply_eventually(cluster: Cluster, obj: dict[str, Any], timeout: float = 15.0) -> None:
    """Apply, retrying while the webhook's cache has not yet seen what ``obj`` refers to."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.apply(obj, check=False)
        if out.returncode == 0:
            return
        assert time.monotonic() < deadline, out.stderr
        time.sleep(0.5)
