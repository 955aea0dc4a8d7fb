"""The read-only cluster interface rules use.

Rules never do I/O: they read other objects through a view. The webhook's view is
kept current by watches (``live.py``); ``envelope check`` builds one from the input
files. Both are a :class:`Store`: objects by kind and (namespace, name), plus
indexes — like client-go's Indexers — so a rule can ask "the Projects under
Department d" without scanning every Project.
"""

from __future__ import annotations

import builtins
import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Protocol

from app.k8s.kinds import name_of, ref_of

__all__ = ["NODE_LABEL", "ClusterView", "Index", "ScopedView", "StaticView", "Store",
           "UndeclaredRead"]

Key = tuple[str, str]

#: Versions come from one counter for every Store, so a version names one state of one
#: kind in one store: caches may key on it alone (an id() of a view can be reused).
_CHANGES = itertools.count(1)


@dataclass(frozen=True)
class Index:
    """A lookup a rule needs instead of a list: objects of ``kind`` by the values
    ``fn`` yields for them. Declared as a constant next to the rules that use it; a
    store builds it the first time it is asked for (or at start, when a rule set hands
    its indexes to the view) and keeps it current on every change."""

    kind: str
    name: str
    fn: Callable[[dict[str, Any]], Iterable[str]] = field(compare=False)

    def values(self, obj: dict[str, Any]) -> list[str]:
        try:
            return list(self.fn(obj))
        except (AttributeError, TypeError, KeyError):
            return []  # malformed objects are indexed nowhere


def _node_labels(node: dict[str, Any]) -> list[str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return [f"{k}={v}" for k, v in labels.items()] if isinstance(labels, dict) else []


#: Nodes by ``key=value`` label pair: shared by node-fit (nodeSelector) and KAI node
#: pools (labelKey/labelValue), so the pairs are indexed once.
NODE_LABEL = Index("Node", "label", _node_labels)


class ClusterView(Protocol):
    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of ``kind`` (in ``namespace`` when given), as plain dicts."""
        ...

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        ...

    def by_index(self, index: Index, value: str) -> builtins.list[dict[str, Any]]:
        """Objects of ``index.kind`` for which the index yields ``value``."""
        ...

    def problems(self, kinds: Iterable[str] | None = None) -> builtins.list[str]:
        """Why what the view holds of ``kinds`` cannot be trusted now (empty: it can)."""
        ...

    def version(self, kind: str, namespace: str | None = None) -> int:
        """Changes on every change to ``kind``, unique across views (0: never had any):
        lets a rule cache what it derives, keyed by the version alone. With
        ``namespace``: on every change to ``kind`` in that namespace (and every re-list of
        the kind), so what a rule derives from one namespace outlives changes elsewhere."""
        ...

    def count(self, kind: str) -> int:
        """How many objects of ``kind`` the view holds."""
        ...

    def partial(self, kind: str) -> bool:
        """Whether objects of ``kind`` may exist that the view does not hold: true for
        manifest files (they hold what the author put in them), false for a cluster's
        watches or LISTs. A rule may read an empty kind as "none" only when not partial."""
        ...

    def index_version(self, index: Index) -> int:
        """Changes when what ``index`` yields changes: an object of its kind added or
        removed, or yielding other values (and on every re-list of the kind); not when
        an object changes only in what the index does not read (a Node's status report,
        a claim's labels). Unique across views, like ``version``: what a rule derives
        from the indexed parts alone may be remembered by it."""
        ...

    def index_counts(self, index: Index) -> dict[str, int]:
        """Every value ``index`` yields, with how many objects yield it (a class index:
        one entry per class, not per object)."""
        ...

    def index_names(self, index: Index, value: str) -> builtins.list[str]:
        """The names of the objects for which ``index`` yields ``value`` (cheaper than
        ``by_index`` when only names are needed)."""
        ...


def kind_key(obj: dict[str, Any]) -> str:
    """Where the store files ``obj``: the view name of its (group, kind)
    (``app.k8s.kinds.name_of``), one to one with (group, kind) — ``NodePool`` is KAI's,
    ``NodePool.karpenter.sh`` Karpenter's, ``Queue.scheduling.volcano.sh`` not KAI's
    Queue. Keyed by that name rather than the pair, so a read (``view.list("Node")``)
    costs no lookup."""
    return name_of(*ref_of(obj))


def _key(obj: dict[str, Any]) -> Key:
    """(namespace, name); malformed metadata (from a hand-written file) keys as ("", "")."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return ("", "")
    namespace, name = meta.get("namespace"), meta.get("name")
    return (namespace if isinstance(namespace, str) else "", name if isinstance(name, str) else "")


class Store:
    """Objects by kind and key, with indexes kept up to date on every change. A kind is
    its view name (``app.k8s.kinds``: one name per (group, kind)); an object added without
    one is filed by its apiVersion and kind (:func:`kind_key`).

    Safe for one writer thread per kind (a watch) and many readers: writes take a lock,
    reads return new lists, and a re-list swaps the whole kind at once.
    """

    def __init__(self, objects: Iterable[dict[str, Any]] = (), indexes: Iterable[Index] = ()) -> None:
        self._lock = threading.Lock()
        self._by_kind: dict[str, dict[Key, dict[str, Any]]] = {}
        self._by_ns: dict[str, dict[str, dict[Key, dict[str, Any]]]] = {}
        self._index_of: dict[str, tuple[Index, ...]] = {}
        self._indexes: dict[Index, dict[str, dict[Key, dict[str, Any]]]] = {}
        self._versions: dict[str, int] = {}
        self._ns_versions: dict[tuple[str, str], int] = {}
        """The version of the last change of a kind in one namespace."""
        self._relisted: dict[str, int] = {}
        """The version of the last ``replace`` of a kind (every namespace changed)."""
        self._counts: dict[Index, tuple[int, dict[str, int]]] = {}
        self._index_versions: dict[Index, int] = {}
        for index in indexes:
            self._build(index)
        for obj in objects:
            self.add(obj)

    def _build(self, index: Index) -> dict[str, dict[Key, dict[str, Any]]]:
        with self._lock:
            table = self._indexes.get(index)
            if table is None:
                table = self._indexes[index] = _table(index, self._by_kind.get(index.kind, {}))
                self._index_of[index.kind] = (*self._index_of.get(index.kind, ()), index)
                self._index_versions[index] = next(_CHANGES)
            return table

    def add(self, obj: dict[str, Any], kind: str | None = None) -> None:
        kind = kind or kind_key(obj)
        key = _key(obj)
        with self._lock:
            old = self._by_kind.get(kind, {}).get(key)
            if old is not None and old == obj:
                return  # e.g. a re-list's unchanged object
            self._versions[kind] = self._ns_versions[(kind, key[0])] = version = next(_CHANGES)
            self._by_kind.setdefault(kind, {})[key] = obj
            if old is not None:
                self._by_ns.get(kind, {}).get(key[0], {}).pop(key, None)
            self._by_ns.setdefault(kind, {}).setdefault(key[0], {})[key] = obj
            for index in self._index_of.get(kind, ()):
                table = self._indexes[index]
                before = index.values(old) if old is not None else []
                after = index.values(obj)
                _drop(table, key, before)
                for value in after:
                    table.setdefault(value, {})[key] = obj
                if before != after:  # a Node's status report leaves its class and labels
                    self._index_versions[index] = version

    def remove(self, kind: str, name: str, namespace: str | None = None) -> None:
        key = (namespace or "", name)
        with self._lock:
            old = self._by_kind.get(kind, {}).pop(key, None)
            if old is not None:
                self._by_ns.get(kind, {}).get(key[0], {}).pop(key, None)
                self._versions[kind] = self._ns_versions[(kind, key[0])] = version = next(_CHANGES)
                for index in self._index_of.get(kind, ()):
                    before = index.values(old)
                    _drop(self._indexes[index], key, before)
                    if before:
                        self._index_versions[index] = version

    def replace(self, kind: str, objects: Iterable[dict[str, Any]]) -> None:
        """Swap every object of ``kind`` at once (after a re-list): the new tables are
        built aside and swapped under the lock, so a reader sees the old set or the new
        one, never a half."""
        by_key: dict[Key, dict[str, Any]] = {}
        by_ns: dict[str, dict[Key, dict[str, Any]]] = {}
        for obj in objects:
            key = _key(obj)
            by_key[key] = obj
            by_ns.setdefault(key[0], {})[key] = obj
        # The index tables are built aside too (a class index parses every object): the
        # lock, which index_counts takes, is held only for the swap.
        built = {index: _table(index, by_key) for index in self._index_of.get(kind, ())}
        with self._lock:
            self._by_kind[kind] = by_key
            self._by_ns[kind] = by_ns
            for index in self._index_of.get(kind, ()):
                found = built.get(index)
                self._indexes[index] = found if found is not None else _table(index, by_key)
            self._versions[kind] = self._relisted[kind] = version = next(_CHANGES)
            for index in self._index_of.get(kind, ()):
                self._index_versions[index] = version

    def version(self, kind: str, namespace: str | None = None) -> int:
        if namespace is None:
            return self._versions.get(kind, 0)
        return max(self._ns_versions.get((kind, namespace), 0), self._relisted.get(kind, 0))

    def index_version(self, index: Index) -> int:
        if index not in self._indexes:
            self._build(index)
        return self._index_versions[index]

    def problems(self, kinds: Iterable[str] | None = None) -> list[str]:
        return []

    def count(self, kind: str) -> int:
        return len(self._by_kind.get(kind, {}))

    def partial(self, kind: str) -> bool:
        return False  # a cluster's view: what it was given of a kind is all of it

    def index_counts(self, index: Index) -> dict[str, int]:
        """Read-only: the same dict is handed to every caller until what the index yields
        changes (copied once per change, not once per review or Node status report)."""
        cached = self._counts.get(index)
        version = self._index_versions.get(index, 0)
        if cached is not None and cached[0] == version:
            return cached[1]
        if index not in self._indexes:
            self._build(index)
        with self._lock:  # a watch thread may be changing it (or swapping it, on a re-list)
            table = self._indexes[index]
            version = self._index_versions[index]
            counts = dict(zip(table.keys(), map(len, table.values()), strict=True))
        self._counts[index] = (version, counts)
        return counts

    def index_names(self, index: Index, value: str) -> list[str]:
        table = self._indexes.get(index)
        if table is None:
            table = self._build(index)
        return list(map(itemgetter(1), list(table.get(value, {}))))

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            return list(self._by_kind.get(kind, {}).values())
        return list(self._by_ns.get(kind, {}).get(namespace, {}).values())

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._by_kind.get(kind, {}).get((namespace or "", name))

    def by_index(self, index: Index, value: str) -> builtins.list[dict[str, Any]]:
        table = self._indexes.get(index)
        if table is None:
            table = self._build(index)
        return list(table.get(value, {}).values())


def _drop(table: dict[str, dict[Key, dict[str, Any]]], key: Key, values: list[str]) -> None:
    for value in values:
        members = table.get(value)
        if members is not None:
            members.pop(key, None)
            if not members:
                del table[value]  # a value nothing yields any more is not kept


def _table(index: Index, by_key: dict[Key, dict[str, Any]]) -> dict[str, dict[Key, dict[str, Any]]]:
    table: dict[str, dict[Key, dict[str, Any]]] = {}
    for key, obj in by_key.items():
        for value in index.values(obj):
            table.setdefault(value, {})[key] = obj
    return table


class StaticView(Store):
    """A view over a fixed set of objects (manifest files, test fixtures). ``complete``:
    the kinds it holds all of (listed from a cluster: ``check --kubeconfig``); of any
    other kind, files may leave out what exists (``partial``). None: every kind is
    complete (a fixture standing for a whole cluster)."""

    def __init__(self, objects: Iterable[dict[str, Any]] = (), indexes: Iterable[Index] = (),
                 complete: Iterable[str] | None = None) -> None:
        super().__init__(objects, indexes)
        self._complete = None if complete is None else frozenset(complete)

    def partial(self, kind: str) -> bool:
        return self._complete is not None and kind not in self._complete


class UndeclaredRead(LookupError):
    """A rule read a kind it did not declare in ``reads``: a bug in the rule. Tests see
    the exception; the webhook answers it as an internal error (per the failure mode)."""


class ScopedView:
    """What one rule may see of a view: the kinds it declared, nothing else."""

    __slots__ = ("_kinds", "_rule", "_view")

    def __init__(self, view: ClusterView, kinds: frozenset[str], rule: str) -> None:
        self._view = view
        self._kinds = kinds
        self._rule = rule

    def _check(self, kind: str) -> None:
        if kind not in self._kinds:
            declared = ", ".join(sorted(self._kinds)) or "nothing"
            raise UndeclaredRead(f"rule {self._rule} read {kind} but declares reads of {declared}")

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        self._check(kind)
        return self._view.list(kind, namespace)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self._check(kind)
        return self._view.get(kind, name, namespace)

    def by_index(self, index: Index, value: str) -> builtins.list[dict[str, Any]]:
        self._check(index.kind)
        return self._view.by_index(index, value)

    def problems(self, kinds: Iterable[str] | None = None) -> builtins.list[str]:
        return self._view.problems(self._kinds if kinds is None else kinds)

    def version(self, kind: str, namespace: str | None = None) -> int:
        self._check(kind)
        return self._view.version(kind, namespace)

    def count(self, kind: str) -> int:
        self._check(kind)
        return self._view.count(kind)

    def partial(self, kind: str) -> bool:
        self._check(kind)
        return self._view.partial(kind)

    def index_version(self, index: Index) -> int:
        self._check(index.kind)
        return self._view.index_version(index)

    def index_counts(self, index: Index) -> dict[str, int]:
        self._check(index.kind)
        return self._view.index_counts(index)

    def index_names(self, index: Index, value: str) -> builtins.list[str]:
        self._check(index.kind)
        return self._view.index_names(index, value)
