"""One LIST of the cluster context `envelope check --kubeconfig` judges manifests against.

The manifests come from files; the objects they are judged against (Nodes,
LimitRanges, ResourceQuotas, KAI trees, WorkerPools) come from a live cluster, read
once, page by page. A manifest replaces the cluster's object of the same kind,
namespace and name: it is the change under review.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.cluster.kube import ApiError, KubeClient, loads

__all__ = ["CONTEXT", "Snapshot", "merge", "snapshot"]

#: (kind, collection path, optional CRD): what a reviewer's check needs from the cluster.
CONTEXT: tuple[tuple[str, str, bool], ...] = (
    ("Node", "/api/v1/nodes", False),
    ("LimitRange", "/api/v1/limitranges", False),
    ("ResourceQuota", "/api/v1/resourcequotas", False),
    ("NodePool", "/apis/kai.resources/v1alpha1/nodepools", True),
    ("Department", "/apis/kai.resources/v1alpha1/departments", True),
    ("Project", "/apis/kai.resources/v1alpha1/projects", True),
    ("Queue", "/apis/scheduling.run.ai/v2/queues", True),
    ("WorkerPool", "/apis/ate.dev/v1alpha1/workerpools", True),
)


@dataclass
class Snapshot:
    objects: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Objects listed per kind; a CRD that is not installed is absent."""
    problems: list[str] = field(default_factory=list)


def snapshot(client: KubeClient, context: Iterable[tuple[str, str, bool]] = CONTEXT,
             page_size: int = 500, timeout: float = 30) -> Snapshot:
    """LIST every context kind (paginated). A CRD that is not installed (404) is
    skipped; any other failure is a problem: a partial context would judge wrongly."""
    out = Snapshot()
    for kind, path, optional in context:
        token = ""
        listed = 0
        try:
            while True:
                fields = {"limit": page_size, **({"continue": token} if token else {})}
                response = client.get(path, fields, timeout)
                body = loads(response.data)
                version = body.get("apiVersion", "v1")
                for item in body.get("items") or []:
                    item.setdefault("apiVersion", version)
                    item.setdefault("kind", kind)
                    out.objects.append(item)
                    listed += 1
                token = (body.get("metadata") or {}).get("continue") or ""
                if not token:
                    break
        except ApiError as exc:
            if exc.status == 404 and optional:
                continue
            out.problems.append(f"cannot list {kind} ({path}): {exc}")
            continue
        except Exception as exc:  # connection refused, TLS, timeouts
            out.problems.append(f"cannot list {kind} ({path}): {type(exc).__name__}: {exc}")
            break
        out.counts[kind] = listed
    return out


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def merge(cluster: Iterable[dict[str, Any]], manifests: Iterable[dict[str, Any]]
          ) -> list[dict[str, Any]]:
    """The view's objects: the cluster's, with the manifests in place of the cluster's
    objects of the same kind, namespace and name."""
    files = list(manifests)
    replaced = {_key(obj) for obj in files}
    kept: list[dict[str, Any]] = []
    observed: dict[tuple[str, str, str], Any] = {}
    for obj in cluster:
        key = _key(obj)
        if key not in replaced:
            kept.append(obj)
        elif key[0] in OBSERVED_STATUS and obj.get("status"):
            observed[key] = obj["status"]
    # A file never holds what a controller observed: a KAI Queue written without a status
    # keeps the cluster's (its usage, app/rules/quotas/usage.py).
    files = [{**obj, "status": observed[_key(obj)]}
             if _key(obj) in observed and not obj.get("status") else obj for obj in files]
    return [*kept, *files]


OBSERVED_STATUS = frozenset({"Queue"})
"""Kinds whose status ``merge`` keeps from the cluster for a file that has none."""
