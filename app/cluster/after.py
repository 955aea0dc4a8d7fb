"""The cluster as one write would leave it: the view, with the written object in place
of its cached copy (gone when the write deletes it).

The one place a rule overlays the object it judges on what the cluster holds: the KAI
quota trees (``rules/quotas/objects.py`` ``After``), the namespace's memory
(``rules/namespace/memory.py``) and a WorkerPool's templates (``rules/actors.py``). The same
reads then judge a webhook request, a file in ``envelope check`` and an object of an
audit, where the view already holds the object being judged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from app.cluster.view import ClusterView, Index

__all__ = ["AfterWrite"]


def _meta(obj: dict[str, Any], key: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else ""


class AfterWrite:
    """``view`` after a write of ``obj`` (None: deleted) as the ``kind`` object
    ``namespace``/``name``. ``namespaced=False``: the kind is cluster-scoped and only
    kind and name say which object is written (a file may give it a namespace).
    ``keep``: which of the view's objects ``get`` and ``list`` return (the written object
    always is); by default all of them."""

    def __init__(self, view: ClusterView, kind: str, name: str, obj: dict[str, Any] | None, *,
                 namespace: str = "", namespaced: bool = True,
                 keep: Callable[[str, dict[str, Any]], bool] | None = None) -> None:
        self.view = view
        self.kind = kind
        self.name = name
        self.namespace = namespace
        self.obj = obj
        self._namespaced = namespaced
        self._keep = keep
        self._own: dict[Index, frozenset[str]] = {}
        """The written object's own index values, once per index (a lookup per queue
        entry would otherwise recompute them all: quadratic in the entries)."""

    def writes(self, kind: str, name: str, namespace: str = "") -> bool:
        """Is this the object the write replaces?"""
        return kind == self.kind and name == self.name and (
            not self._namespaced or namespace == self.namespace)

    def is_written(self, kind: str, obj: dict[str, Any]) -> bool:
        return self.writes(kind, _meta(obj, "name"), _meta(obj, "namespace"))

    def replaced(self, kind: str, found: Iterable[dict[str, Any]], belongs: bool) -> list[dict[str, Any]]:
        """What one read of the view returned (``found``, objects of ``kind``), as the
        write leaves it: without the written object's cached copy, and with the written
        object when ``belongs`` (it is what the read asks for)."""
        out = [o for o in found if not self.is_written(kind, o)]
        if belongs and kind == self.kind and self.obj is not None:
            out.append(self.obj)
        return out

    def _own_values(self, index: Index) -> frozenset[str]:
        found = self._own.get(index)
        if found is None:
            found = self._own[index] = frozenset(index.values(self.obj)) if self.obj is not None \
                else frozenset()
        return found

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        if self.writes(kind, name, namespace or ""):
            return self.obj
        found = self.view.get(kind, name, namespace)
        return found if found is None or self._keep is None or self._keep(kind, found) else None

    def by_index(self, index: Index, value: str) -> list[dict[str, Any]]:
        """An index files only the objects it is built for (``keep`` is not asked)."""
        found = self.view.by_index(index, value)
        if index.kind != self.kind:
            return found
        return self.replaced(index.kind, found, value in self._own_values(index))

    # ``list`` last: in the class body its name hides the builtin from later annotations.
    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        belongs = namespace is None or not self._namespaced or namespace == self.namespace
        found = self.view.list(kind, namespace)
        if self._keep is not None:
            found = [o for o in found if self._keep(kind, o)]
        return self.replaced(kind, found, belongs)
