"""Ordinary annotation patches cannot grow the webhook (issue 38, class 3), through the
real kube-apiserver: a namespace with a memory ResourceQuota, a LimitRange that fills
in a sidecar's memory, and DEPLOYMENTS Deployments; then rounds of merge patches of an
annotation to every one of them (real writes, each reviewed by the webhook, whose live
view files every new version), with a dry-run Deployment every DRY_RUN_EVERY patches so
``namespace-memory-composition`` sums the namespace again. The webhook's RSS is taken
after each round until it plateaus.

Before issue 38 the sum's memo (``rules/namespace/memory._derived``, 131,072 entries)
was keyed by each stored object's identity and kept every old version: 48,000
annotation patches on the 30k cluster took RSS from 184 to 398 MiB, past the chart's
384Mi. Numbers: docs/reliability.md, "Memory a tenant cannot grow", class 3."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from builders import container, deployment, eventually, rss_mib
from harness import Cluster, Webhook

DEPLOYMENTS = 1_000
ROUNDS = 6
DRY_RUN_EVERY = 20
THREADS = 4
RSS_BUDGET_MIB = 200
"""The webhook's RSS after any round, far under the chart's 384Mi: the session's small
view plus 1,000 Deployments (~88 MiB measured at the start) and the namespace sums'
memos (32 + 16 + 16 MiB budgets, a fraction of that used here)."""
PLATEAU_MIB = 2
"""Growth allowed over the last round: every version seen before the last round is
gone from the memos, so a round adds nothing (before issue 38: one entry per patch,
~4 MiB a round here)."""
GROWTH_MIB = 4
"""Growth allowed from the first round to the last (before issue 38: ~20 MiB)."""


def sized(i: int, ns: str) -> dict[str, Any]:
    """A Deployment of 1-4 replicas in one of 7 memory sizes, with a sidecar whose
    memory the LimitRange fills in (so the counted pod spec is a copy the memo pays for,
    as on the 30k cluster's namespaces)."""
    memory = f"{1 + i % 7}Gi"
    obj = deployment(f"app-{i}", ns,
                     container("app", requests={"cpu": "250m", "memory": memory},
                               limits={"cpu": "1", "memory": memory}),
                     container("sidecar", requests={"cpu": "50m"}, limits={"cpu": "100m"}),
                     replicas=1 + i % 4)
    obj["metadata"]["annotations"] = {"envelope.test/round": "0"}
    return obj


def charged(indexes: Iterable[int]) -> int:
    """Mi of requests.memory the quota counts for ``sized(i)`` Deployments: replicas x
    (the app's memory + the sidecar's LimitRange default)."""
    return sum((1 + i % 4) * ((1 + i % 7) * 1024 + 256) for i in indexes)


def in_parallel(call: Callable[[int], tuple[int, Any]], count: int) -> list[int]:
    """The HTTP statuses of ``call(0)`` .. ``call(count - 1)``, THREADS at a time."""
    with ThreadPoolExecutor(THREADS) as pool:
        return [status for status, _ in pool.map(call, range(count))]


def test_annotation_patches_do_not_grow_the_webhook(cluster: Cluster, webhook: Webhook,
                                                    namespace: str) -> None:
    cluster.create_resource_quota(namespace, "compute", {"requests.memory": "100Ti",
                                                         "limits.memory": "100Ti"})
    cluster.apply({"apiVersion": "v1", "kind": "LimitRange",
                   "metadata": {"name": "defaults", "namespace": namespace},
                   "spec": {"limits": [{"type": "Container", "default": {"memory": "256Mi"},
                                        "defaultRequest": {"memory": "256Mi"}}]}})
    base = f"/apis/apps/v1/namespaces/{namespace}/deployments"

    def create(i: int) -> tuple[int, Any]:
        return cluster.api("POST", base, sized(i, namespace), timeout=60)

    def patch(r: int, i: int) -> tuple[int, Any]:
        if i % DRY_RUN_EVERY == 0:  # a review that sums the namespace as the view has it now
            status, answer = cluster.api("POST", f"{base}?dryRun=All", sized(DEPLOYMENTS + i, namespace),
                                         timeout=60)
            assert status == 201, (status, str(answer)[:300])
        annotation = {"metadata": {"annotations": {"envelope.test/round": str(r)}}}
        return cluster.api("PATCH", f"{base}/app-{i}", annotation,
                           content_type="application/merge-patch+json", timeout=60)

    assert in_parallel(create, DEPLOYMENTS) == [201] * DEPLOYMENTS
    pid = webhook.process.pid
    samples = [rss_mib(pid)]
    for r in range(1, ROUNDS + 1):
        assert in_parallel(partial(patch, r), DEPLOYMENTS) == [200] * DEPLOYMENTS
        samples.append(rss_mib(pid))
    print(f"webhook RSS (MiB) after creating {DEPLOYMENTS} Deployments and after each round of "
          f"{DEPLOYMENTS} annotation patches: " + ", ".join(f"{s:.1f}" for s in samples))
    # The sums were made, over every Deployment: a dry-run over a small quota is warned with each counted.
    cluster.create_resource_quota(namespace, "small", {"requests.memory": "1Gi"})
    manifest = sized(2 * DEPLOYMENTS, namespace)
    eventually(lambda: "> quota small" in cluster.apply(manifest, "--dry-run=server").stderr, 10,
               "the quota in the view")
    warned = cluster.apply(manifest, "--dry-run=server").stderr
    found = re.search(r"composition\]: (.*), \+(\d+) more, total (\d+)Mi > quota small", warned)
    assert found is not None, warned
    shown, more, total = found.groups()
    assert len(shown.split(", ")) + int(more) == DEPLOYMENTS + 1, warned  # every stored one and this write
    assert int(total) == charged(range(DEPLOYMENTS)) + charged([2 * DEPLOYMENTS]), warned
    assert max(samples) <= RSS_BUDGET_MIB, samples
    assert samples[-1] - samples[-2] <= PLATEAU_MIB, samples
    assert samples[-1] - samples[1] <= GROWTH_MIB, samples
