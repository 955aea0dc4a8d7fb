"""One LIST of the cluster context `envelope check --kubeconfig` judges manifests against.

The manifests come from files; the objects they are judged against come from a live
cluster, read once, page by page: exactly the kinds the rules read (what the webhook
watches, ``app.k8s.kinds`` and ``Rule.reads``), trimmed as the webhook's live view trims
them, so a manifest meets the cluster the webhook would judge it against (a ReplicaSet
of a Deployment is counted through its Deployment, as the webhook counts it). A
manifest replaces the cluster's object of the same (group, kind), namespace and name:
it is the change under review.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.cluster.kube import ApiError, KubeClient, pages
from app.cluster.live import Resource
from app.k8s.kinds import KINDS, Kind, read_kinds, ref_of

__all__ = ["Snapshot", "context_kinds", "merge", "snapshot"]


def context_kinds(reads: Iterable[str]) -> tuple[Kind, ...]:
    """The kinds to list for rules that read ``reads`` (view names)."""
    return read_kinds(reads)


@dataclass
class Snapshot:
    objects: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Objects listed per kind (view name); a CRD that is not installed is absent."""
    problems: list[str] = field(default_factory=list)


def snapshot(client: KubeClient, kinds: Iterable[Kind], page_size: int = 500,
             timeout: float = 30) -> Snapshot:
    """LIST every kind (paginated), trimmed as the live view keeps it. A CRD that is not
    installed (404) is skipped; any other failure is a problem: a partial context would
    judge wrongly."""
    out = Snapshot()
    for kind in kinds:
        resource = Resource.of(kind)
        listed: list[dict[str, Any]] = []
        try:
            for body in pages(client, kind.path, page_size, timeout):
                for item in body.get("items") or []:
                    item.setdefault("apiVersion", kind.api_version)
                    item.setdefault("kind", kind.kind)
                    trimmed = resource.trim(item)
                    if trimmed is not None:
                        listed.append(trimmed)
        except ApiError as exc:
            if exc.status == 404 and kind.optional:
                continue
            out.problems.append(f"cannot list {kind.name} ({kind.path}): {exc}")
            continue
        except Exception as exc:  # connection refused, TLS, timeouts
            out.problems.append(f"cannot list {kind.name} ({kind.path}): "
                                f"{type(exc).__name__}: {exc}")
            break
        out.objects.extend(listed)
        out.counts[kind.name] = len(listed)
    return out


def _key(obj: dict[str, Any]) -> tuple[tuple[str, str], str, str]:
    found = obj.get("metadata")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    return (ref_of(obj), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def merge(cluster: Iterable[dict[str, Any]], manifests: Iterable[dict[str, Any]]
          ) -> list[dict[str, Any]]:
    """The view's objects: the cluster's, with the manifests in place of the cluster's
    objects of the same (group, kind), namespace and name."""
    files = list(manifests)
    replaced = {_key(obj) for obj in files}
    kept: list[dict[str, Any]] = []
    observed: dict[tuple[tuple[str, str], str, str], Any] = {}
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


OBSERVED_STATUS = frozenset(k.ref for k in KINDS if k.status)
"""Kinds (group, kind) whose status ``merge`` keeps from the cluster for a file that has
none: those whose status the live view keeps (``app.k8s.kinds.Kind.status``)."""
