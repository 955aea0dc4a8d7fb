"""Shared plumbing of the differential oracles (e2e/test_oracle_*.py): many small
API calls in parallel over one TLS context, and a namespace the Envelope webhook
never sees (label ``envelope.test/isolated``), so what is judged is the API
server's and kube-scheduler's own behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import harness
from harness import Cluster

T = TypeVar("T")
R = TypeVar("R")

WORKERS = 8
"""Parallel API calls: the API server is the bottleneck, not the client."""


def parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]`` over a small thread pool, in order."""
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(fn, items))


def isolated_namespace(cluster: Cluster, prefix: str, *, webhook: bool = False) -> str:
    """A fresh namespace out of the Envelope webhook's path (``webhook=True``: in it)."""
    name = harness.unique_name(prefix, max_length=40)
    labels = {"envelope.test/e2e": "true"}
    if not webhook:
        labels[harness.ISOLATED_NAMESPACE_LABEL] = "true"
    cluster.create_namespace(name, labels=labels)
    return name


def create(cluster: Cluster, namespace: str, plural: str, obj: Mapping[str, Any],
           *, dry_run: bool = False) -> tuple[int, Any]:
    """POST a namespaced core/v1 object; (HTTP status, body)."""
    query = "?dryRun=All" if dry_run else ""
    return cluster.api("POST", f"/api/v1/namespaces/{namespace}/{plural}{query}", obj)


def status_message(body: Any) -> str:
    """The message of an API ``Status`` (or the body as text)."""
    if isinstance(body, Mapping):
        return str(body.get("message", body))
    return str(body)
