"""Quota objects as the rules read them: raw fields that never fail on malformed input, the
indexes a request looks up instead of listing, and :class:`After` — the view as the write
would leave it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from app.cluster.view import NODE_LABEL, ClusterView, Index
from app.config import Policy
from app.kai import (
    KAI_GROUP,
    KRM_GROUP,
    SPEC_MODELS,
    parse,
    project_namespace,
    queue_name,
)
from app.rules.base import Finding, Subject

DEPARTMENT = (KRM_GROUP, "Department")
PROJECT = (KRM_GROUP, "Project")
NODEPOOL = (KRM_GROUP, "NodePool")
QUEUE = (KAI_GROUP, "Queue")
KINDS = frozenset({DEPARTMENT, PROJECT, NODEPOOL, QUEUE})
TREES = frozenset({DEPARTMENT, PROJECT, QUEUE})
GROUP_OF = {"Department": KRM_GROUP, "Project": KRM_GROUP, "NodePool": KRM_GROUP,
            "Queue": KAI_GROUP, "Node": ""}


@lru_cache(maxsize=256)
def api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def group_of_object(obj: dict[str, Any]) -> str:
    api = obj.get("apiVersion")
    return api_group(api) if isinstance(api, str) else ""


def is_ours(kind: str, obj: Any) -> bool:
    """Same kind name, right API group: a Volcano Queue or an OpenShift Project is not ours."""
    return isinstance(obj, dict) and group_of_object(obj) == GROUP_OF[kind]


def name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def raw_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def raw_entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    queues = raw_spec(obj).get("queues")
    return [q for q in queues if isinstance(q, dict)] if isinstance(queues, list) else []


def text_or_empty(value: Any) -> str:
    return value if isinstance(value, str) else ""


def krm_owned(obj: dict[str, Any]) -> bool:
    """A KAI Queue that KRM generated from a Department or Project (its ownerReference)."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    return isinstance(owners, list) and any(
        isinstance(o, dict) and o.get("kind") in ("Department", "Project")
        and str(o.get("apiVersion", "")).startswith(f"{KRM_GROUP}/") for o in owners)


def index_parent(obj: dict[str, Any]) -> Iterator[str]:
    if is_ours("Project", obj) and text_or_empty(raw_spec(obj).get("parent")):
        yield raw_spec(obj)["parent"]


def index_namespace(obj: dict[str, Any]) -> Iterator[str]:
    if is_ours("Project", obj):
        yield project_namespace(name_of(obj), text_or_empty(raw_spec(obj).get("namespace")))


def index_queue_names(kind: str) -> Callable[[dict[str, Any]], Iterator[str]]:
    def names(obj: dict[str, Any]) -> Iterator[str]:
        if is_ours(kind, obj):
            for entry in raw_entries(obj):
                yield queue_name(text_or_empty(entry.get("name")), name_of(obj),
                                 text_or_empty(entry.get("nodepool")))
    return names


def index_pools(kind: str) -> Callable[[dict[str, Any]], Iterator[str]]:
    def pools(obj: dict[str, Any]) -> Iterator[str]:
        if is_ours(kind, obj):
            yield from {text_or_empty(entry.get("nodepool")) for entry in raw_entries(obj)}
    return pools


def index_pool_label(obj: dict[str, Any]) -> Iterator[str]:
    spec = raw_spec(obj)
    if is_ours("NodePool", obj) and text_or_empty(spec.get("labelKey")):
        yield f"{spec['labelKey']}={text_or_empty(spec.get('labelValue'))}"


def index_queue_parent(obj: dict[str, Any]) -> Iterator[str]:
    if is_ours("Queue", obj) and text_or_empty(raw_spec(obj).get("parentQueue")):
        yield raw_spec(obj)["parentQueue"]


PROJECT_PARENT = Index("Project", "kai-parent", index_parent)
QUEUE_PARENT = Index("Queue", "kai-parent", index_queue_parent)
PROJECT_NAMESPACE = Index("Project", "kai-namespace", index_namespace)
QUEUE_NAME = {kind: Index(kind, "kai-queue-name", index_queue_names(kind))
              for kind in ("Department", "Project")}
POOL = {kind: Index(kind, "kai-nodepool", index_pools(kind)) for kind in ("Department", "Project")}
NODEPOOL_LABEL = Index("NodePool", "kai-label", index_pool_label)
INDEXES = (PROJECT_PARENT, QUEUE_PARENT, PROJECT_NAMESPACE, *QUEUE_NAME.values(), *POOL.values(),
           NODEPOOL_LABEL, NODE_LABEL)


class After:
    """The cluster as the write would leave it: the view, with the subject's cached
    copy replaced by ``obj`` (or gone when ``obj`` is None, on DELETE).

    Only objects of the right API group are returned. Rules read nothing else, so the
    same rule judges a webhook request, a file in ``envelope check`` or an audit.
    """

    def __init__(self, view: ClusterView, subject: Subject, obj: dict[str, Any] | None) -> None:
        self.view = view
        self.kind = subject.kind
        self.obj = obj
        self.name = (name_of(obj) if obj else "") or subject.name
        self._own: dict[Index, frozenset[str]] = {}
        """The subject's own index values, once per index (a lookup per queue entry
        would otherwise recompute them all: quadratic in the entries)."""

    def _own_values(self, index: Index) -> frozenset[str]:
        found = self._own.get(index)
        if found is None:
            found = self._own[index] = frozenset(index.values(self.obj)) if self.obj is not None \
                else frozenset()
        return found

    def _is_subject(self, kind: str, obj: dict[str, Any]) -> bool:
        return kind == self.kind and name_of(obj) == self.name

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        if kind == self.kind and name == self.name:
            return self.obj
        found = self.view.get(kind, name)
        return found if is_ours(kind, found) else None

    def by_index(self, index: Index, value: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.view.by_index(index, value)  # only our group
        kind = index.kind
        if kind != self.kind:
            return found
        found = [o for o in found if not self._is_subject(kind, o)]
        if self.obj is not None and value in self._own_values(index):
            found.append(self.obj)
        return found

    def list(self, kind: str) -> list[dict[str, Any]]:
        """Every object of a kind: used only for NodePools (few) and, for the default
        pool's capacity, Nodes (see :func:`pool_capacity`)."""
        found = [o for o in self.view.list(kind) if is_ours(kind, o) and not self._is_subject(kind, o)]
        if kind == self.kind and self.obj is not None:
            found.append(self.obj)
        return found


def spec_input(kind: str, obj: dict[str, Any]) -> Any:
    spec = obj.get("spec")
    if spec is None and kind in ("Department", "Project"):
        return {"queues": []}  # the CRDs require queues only inside a spec
    return spec


def typed_spec(kind: str, obj: dict[str, Any] | None) -> Any:
    """The object's typed spec, or None when it does not parse (``kai-schema`` says why)."""
    if not isinstance(obj, dict):
        return None
    spec, _ = parse(SPEC_MODELS[(GROUP_OF[kind], kind)], spec_input(kind, obj))
    return spec


def spec(subject: Subject, obj: dict[str, Any]) -> Any:
    """What the quota rules judge: an UPDATE that leaves ``spec`` alone is not judged."""
    return obj.get("spec")


def generated_queue(subject: Subject, obj: dict[str, Any] | None) -> bool:
    """A KAI Queue that KRM generates: its Department or Project was judged instead."""
    return subject.kind == "Queue" and krm_owned(obj or subject.old or {})


RuleFn = Callable[[Subject, dict[str, Any], ClusterView, Policy], list[Finding]]
Check = Callable[["After", dict[str, Any]], list[Finding]]
