"""The read-only cluster interface rules use.

Rules never do I/O: they read other objects through a view. The webhook's view is
kept current by watches; ``envelope check`` builds one from the input files.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["ClusterView", "StaticView"]


class ClusterView(Protocol):
    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects of ``kind`` (in ``namespace`` when given), as plain dicts."""
        ...

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        ...


class StaticView:
    """A view over a fixed set of objects (manifest files, test fixtures)."""

    def __init__(self, objects: Iterable[dict[str, Any]] = ()) -> None:
        self._by_kind: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        for obj in objects:
            self.add(obj)

    def add(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        self._by_kind.setdefault(str(obj.get("kind")), {})[key] = obj

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        items = self._by_kind.get(kind, {})
        if namespace is None:
            return list(items.values())
        return [o for (ns, _), o in items.items() if ns == namespace]

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._by_kind.get(kind, {}).get((namespace or "", name))
