"""Quota objects as the rules read them: raw fields that never fail on malformed input, the
indexes a request looks up instead of listing, and :class:`After` — the view as the write
would leave it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, Protocol

from app.cluster.after import AfterWrite
from app.cluster.view import NODE_LABEL, ClusterView, Index
from app.core.config import Policy
from app.crds.kai import (
    KAI_GROUP,
    KRM_GROUP,
    SPEC_MODELS,
    node_cards,
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


class Owners(Protocol):
    """Where a Queue's owner is looked up: a view, or :class:`After`."""

    def get(self, kind: str, name: str) -> dict[str, Any] | None: ...


def krm_owned(obj: dict[str, Any], view: Owners) -> bool:
    """A KAI Queue that KRM generated from a Department or Project: an ownerReference to
    one that exists in ``view`` with that uid.

    ownerReferences are claims: whoever may write a Queue may write one naming any
    Department, so the reference alone does not switch a rule off. The owner's uid is
    a fact the writer cannot choose (the API server assigns it); a Department or
    Project without a uid (a file given to ``envelope check``) matches by name."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    if not isinstance(owners, list):
        return False
    for o in owners:
        if not (isinstance(o, dict) and o.get("kind") in ("Department", "Project")
                and str(o.get("apiVersion", "")).startswith(f"{KRM_GROUP}/")
                and isinstance(o.get("name"), str)):
            continue
        owner = view.get(o["kind"], o["name"])
        if not is_ours(o["kind"], owner):
            continue
        owner_meta = owner.get("metadata") if isinstance(owner, dict) else None
        uid = owner_meta.get("uid") if isinstance(owner_meta, dict) else None
        if not uid or uid == o.get("uid"):
            return True
    return False


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
def index_node_cards(node: dict[str, Any]) -> list[str]:
    """What a pool's capacity reads of a Node besides its labels: its group and cards."""
    return [f"{group_of_object(node)} {node_cards(node)}"]


NODE_CARDS = Index("Node", "kai-cards", index_node_cards)
"""Its index version moves when a Node's cards or group change (or a Node comes or
goes), not on a status report: capacities are counted again only then."""
INDEXES = (PROJECT_PARENT, QUEUE_PARENT, PROJECT_NAMESPACE, *QUEUE_NAME.values(), *POOL.values(),
           NODEPOOL_LABEL, NODE_LABEL, NODE_CARDS)


class After(AfterWrite):
    """The cluster as the write would leave it (``app.cluster.after.AfterWrite``): the
    view, with the subject's cached copy replaced by ``obj`` (or gone when ``obj`` is
    None, on DELETE). KAI kinds are cluster-scoped: kind and name say which is written.

    Only objects of the right API group are returned. Rules read nothing else, so the
    same rule judges a webhook request, a file in ``envelope check`` or an audit.
    """

    def __init__(self, view: ClusterView, subject: Subject, obj: dict[str, Any] | None) -> None:
        super().__init__(view, subject.kind, (name_of(obj) if obj else "") or subject.name, obj,
                         namespaced=False, keep=is_ours)


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


def generated_queue(subject: Subject, obj: dict[str, Any] | None, view: ClusterView) -> bool:
    """A KAI Queue that KRM generates: its Department or Project was judged instead
    (:func:`krm_owned`: the owner must exist)."""
    return subject.kind == "Queue" and krm_owned(obj or subject.old or {}, view)


RuleFn = Callable[[Subject, dict[str, Any], ClusterView, Policy], list[Finding]]
Check = Callable[["After", dict[str, Any]], list[Finding]]
