"""The read-only cluster interface rules use.

Rules never do I/O: they read other objects through a view. The webhook's view is
kept current by watches (``live.py``); ``envelope check`` builds one from the input
files. Both are a :class:`Store`: objects by kind and (namespace, name), plus
indexes — like client-go's Indexers — so a rule can ask "the Projects under
Department d" without scanning every Project.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = ["INDEXES", "NODE_LABEL", "ClusterView", "StaticView", "Store", "register_index"]

Indexer = Callable[[dict[str, Any]], Iterable[str]]
Key = tuple[str, str]

#: Versions come from one counter for every Store, so a version names one state of one
#: kind in one store: caches may key on it alone (an id() of a view can be reused).
_CHANGES = itertools.count(1)

#: (kind, index name) -> function giving the index values of an object.
INDEXES: dict[tuple[str, str], Indexer] = {}


def register_index(kind: str, name: str, fn: Indexer) -> None:
    """Declare an index; rule modules call this at import time."""
    INDEXES[(kind, name)] = fn


def _node_labels(node: dict[str, Any]) -> list[str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return [f"{k}={v}" for k, v in labels.items()] if isinstance(labels, dict) else []


#: Nodes by ``key=value`` label pair: shared by node-fit (nodeSelector) and KAI node
#: pools (labelKey/labelValue), so the pairs are indexed once.
NODE_LABEL = "label"
register_index("Node", NODE_LABEL, _node_labels)


class ClusterView(Protocol):
    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of ``kind`` (in ``namespace`` when given), as plain dicts."""
        ...

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        ...

    def by_index(self, kind: str, index: str, value: str) -> list[dict[str, Any]]:
        """Objects of ``kind`` whose ``index`` function yields ``value``."""
        ...

    def problems(self, kinds: Iterable[str] | None = None) -> list[str]:
        """Why what the view holds of ``kinds`` cannot be trusted now (empty: it can)."""
        ...

    def version(self, kind: str) -> int:
        """Changes on every change to ``kind``, unique across views (0: never had any):
        lets a rule cache what it derives, keyed by the version alone."""
        ...

    def count(self, kind: str) -> int:
        """How many objects of ``kind`` the view holds."""
        ...


def _key(obj: dict[str, Any]) -> Key:
    """(namespace, name); malformed metadata (from a hand-written file) keys as ("", "")."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return ("", "")
    namespace, name = meta.get("namespace"), meta.get("name")
    return (namespace if isinstance(namespace, str) else "", name if isinstance(name, str) else "")


class Store:
    """Objects by kind and key, with indexes kept up to date on every change.

    Safe for one writer thread (a watch) and many readers: writes take a lock,
    reads return new lists.
    """

    def __init__(self, objects: Iterable[dict[str, Any]] = ()) -> None:
        self._lock = threading.Lock()
        self._by_kind: dict[str, dict[Key, dict[str, Any]]] = {}
        self._by_ns: dict[str, dict[str, dict[Key, dict[str, Any]]]] = {}
        self._indexes: dict[tuple[str, str], dict[str, dict[Key, dict[str, Any]]]] = {}
        self._versions: dict[str, int] = {}
        for obj in objects:
            self.add(obj)

    def _index_values(self, kind: str, obj: dict[str, Any]) -> Iterable[tuple[str, str]]:
        for (k, name), fn in INDEXES.items():
            if k == kind:
                try:
                    values = list(fn(obj))
                except (AttributeError, TypeError, KeyError):
                    values = []  # malformed objects are indexed nowhere
                for value in values:
                    yield name, value

    def _unlink(self, kind: str, key: Key, obj: dict[str, Any]) -> None:
        self._by_ns.get(kind, {}).get(key[0], {}).pop(key, None)
        for name, value in self._index_values(kind, obj):
            self._indexes.get((kind, name), {}).get(value, {}).pop(key, None)

    def add(self, obj: dict[str, Any], kind: str | None = None) -> None:
        kind = kind or str(obj.get("kind"))
        key = _key(obj)
        with self._lock:
            old = self._by_kind.get(kind, {}).get(key)
            if old is not None:
                if old == obj:
                    return  # e.g. a Node heartbeat: nothing a rule reads changed
                self._unlink(kind, key, old)
            self._versions[kind] = next(_CHANGES)
            self._by_kind.setdefault(kind, {})[key] = obj
            self._by_ns.setdefault(kind, {}).setdefault(key[0], {})[key] = obj
            for name, value in self._index_values(kind, obj):
                self._indexes.setdefault((kind, name), {}).setdefault(value, {})[key] = obj

    def remove(self, kind: str, name: str, namespace: str | None = None) -> None:
        key = (namespace or "", name)
        with self._lock:
            old = self._by_kind.get(kind, {}).pop(key, None)
            if old is not None:
                self._unlink(kind, key, old)
                self._versions[kind] = next(_CHANGES)

    def replace(self, kind: str, objects: Iterable[dict[str, Any]]) -> None:
        """Swap every object of ``kind`` (after a re-list)."""
        with self._lock:
            for key, old in list(self._by_kind.get(kind, {}).items()):
                self._unlink(kind, key, old)
            self._by_kind[kind] = {}
            self._versions[kind] = next(_CHANGES)
        for obj in objects:
            self.add(obj, kind)

    def version(self, kind: str) -> int:
        return self._versions.get(kind, 0)

    def problems(self, kinds: Iterable[str] | None = None) -> list[str]:
        return []

    def count(self, kind: str) -> int:
        return len(self._by_kind.get(kind, {}))

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            return list(self._by_kind.get(kind, {}).values())
        return list(self._by_ns.get(kind, {}).get(namespace, {}).values())

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._by_kind.get(kind, {}).get((namespace or "", name))

    def by_index(self, kind: str, index: str, value: str) -> list[dict[str, Any]]:
        if (kind, index) not in INDEXES:
            raise KeyError(f"no index {index!r} registered for {kind}")
        return list(self._indexes.get((kind, index), {}).get(value, {}).values())


class StaticView(Store):
    """A view over a fixed set of objects (manifest files, test fixtures)."""
