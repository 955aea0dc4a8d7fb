"""A tenant's dry-runs cannot grow the webhook (issue 38, class 1), through the real
kube-apiserver: distinct ActorTemplates, each carrying a 2.8 MB env value, sent as
``POST …/actortemplates?dryRun=All`` (nothing is stored), in rounds until the
webhook's RSS plateaus. Before issue 38 the placement memo kept 256 decoded templates
whatever their size: 150 such dry-runs took a webhook from 107 to 532 MiB, past the
chart's 384Mi limit. Numbers: docs/reliability.md, "Memory a tenant cannot grow"."""

from __future__ import annotations

import json
import os
from typing import Any

from builders import rss_mib
from harness import Cluster, Webhook

ROUNDS = 3
PER_ROUND = 50
ENV_BYTES = 2_800_000
RSS_BUDGET_MIB = 250
"""The webhook's RSS after any round, well under the chart's 384Mi: a small view
(~80 MiB), the decoder's and placement's memos (16 + 4 MiB, measured), and the
allocator's keep of the reviews just decoded (a 2.8 MB object is ~6 MB of review)."""
PLATEAU_MIB = 40
"""Growth allowed from the second round to the last: the memos are full after the first."""


def template(name: str, ns: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"sandboxClass": "microvm", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                     "snapshotsConfig": {"location": "gs://snapshots/agents"},
                     "containers": [{"name": "agent", "image": "registry.example/agent@sha256:" + "a" * 64,
                                     "env": [{"name": "BLOB", "value": value}]}]}}


def test_distinct_large_dry_runs_do_not_grow_the_webhook(cluster: Cluster, webhook: Webhook,
                                                          namespace: str) -> None:
    cluster.apply({"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
                   "metadata": {"name": "workers", "namespace": namespace},
                   "spec": {"replicas": 2, "sandboxClass": "microvm",
                            "ateomImage": "registry.example/ateom@sha256:" + "b" * 64,
                            "template": {"resources": {"limits": {"cpu": "4", "memory": "8Gi"}}}}})
    pid = webhook.process.pid
    path = f"/apis/ate.dev/v1alpha1/namespaces/{namespace}/actortemplates?dryRun=All"
    filler = os.urandom(ENV_BYTES // 2).hex()
    samples = [rss_mib(pid)]
    for r in range(ROUNDS):
        for i in range(PER_ROUND):
            n = r * PER_ROUND + i
            body = json.dumps(template(f"big-{n}", namespace, f"{n:06d}" + filler[6:])).encode()
            status, answer = cluster.api("POST", path, raw=body, timeout=60)
            assert status == 201, (status, str(answer)[:300])  # judged and allowed, not stored
        samples.append(rss_mib(pid))
    print(f"webhook RSS (MiB) before and after each round of {PER_ROUND}: "
          + ", ".join(f"{s:.0f}" for s in samples))
    stored = cluster.api("GET", f"/apis/ate.dev/v1alpha1/namespaces/{namespace}/actortemplates")[1]
    assert stored["items"] == []  # dry-runs: nothing was stored
    assert max(samples) <= RSS_BUDGET_MIB, samples
    assert samples[-1] - samples[2] <= PLATEAU_MIB, samples
