"""Shared plumbing of the differential oracles (e2e/test_oracle_*.py): many small
API calls in parallel over one TLS context, and a namespace the Envelope webhook
never sees (label ``envelope.test/isolated``), so what is judged is the API
server's and kube-scheduler's own behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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


PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


@contextmanager
def global_default_priority_class(cluster: Cluster, name: str, value: int = 500) -> Iterator[dict[str, Any]]:
    """A PriorityClass with ``globalDefault: true`` for the block (the Priority admission
    plugin gives it to every Pod created without a class), deleted after it: the session's
    other tests create Pods too, and only one global default may exist at a time."""
    body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "globalDefault": True}
    status, got = cluster.api("POST", PRIORITY_CLASSES, body)
    assert status == 201, got
    try:
        yield body
    finally:
        status, got = cluster.api("DELETE", f"{PRIORITY_CLASSES}/{name}")
        assert status in (200, 404), got


def priority_classes(cluster: Cluster) -> list[dict[str, Any]]:
    """Every PriorityClass of the cluster (the built-in ``system-*`` ones too), as the
    webhook's view holds them."""
    status, got = cluster.api("GET", PRIORITY_CLASSES)
    assert status == 200, got
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", **item}
            for item in got.get("items") or []]  # a LIST's items carry no kind
