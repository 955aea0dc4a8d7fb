"""Small helpers every layer shares: reading nested JSON, comparing and copying it at
any depth, paths for messages, one bounded cache, one warning length, plain numbers."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from decimal import Decimal
from typing import Any, Generic, TypeVar

__all__ = ["WARNING_LIMIT", "Memo", "brief", "deep_copy", "dig", "dotted", "plain_number", "same",
           "undotted"]

WARNING_LIMIT = 120
"""Warnings travel as HTTP ``Warning`` headers; kubectl shows them whole below this
many characters."""


def dig(obj: Any, path: Iterable[str | int]) -> Any:
    """``obj[path[0]][path[1]]...``, or None where the shape does not allow it."""
    for part in path:
        if type(obj) is dict:  # on the hot path: no isinstance chain for the common case
            obj = obj.get(part)
        elif isinstance(obj, list) and isinstance(part, int) and 0 <= part < len(obj):
            obj = obj[part]
        else:
            return None
    return obj


def same(a: Any, b: Any) -> bool:
    """``a == b`` for JSON documents of any depth. Python's ``==`` recurses in C and
    raises RecursionError past ~1,000 levels (orjson reads 1,024), so a deep document
    is compared by a loop instead, with the same answers (``1 == 1.0``, key order
    ignored)."""
    try:
        return bool(a == b)
    except RecursionError:
        pass
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            if len(x) != len(y):
                return False
            for key, value in x.items():
                if key not in y:
                    return False
                stack.append((value, y[key]))
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif isinstance(x, dict | list) or isinstance(y, dict | list) or x != y:
            return False
    return True


def deep_copy(obj: Any) -> Any:
    """A deep copy of a JSON document at any depth (dicts, lists, scalars), by a loop:
    ``copy.deepcopy`` and orjson (255 levels when writing) give up on deep ones."""
    if not isinstance(obj, dict | list):
        return obj
    root: Any = {} if isinstance(obj, dict) else []
    stack: list[tuple[Any, Any]] = [(obj, root)]
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, value in items:
            if isinstance(value, dict | list):
                child: Any = {} if isinstance(value, dict) else []
                stack.append((value, child))
            else:
                child = value
            if isinstance(target, dict):
                target[key] = child
            else:
                target.append(child)
    return root


def dotted(path: tuple[Any, ...] | list[Any]) -> str:
    """``("spec", "queues", 2, "name")`` -> ``spec.queues[2].name``."""
    if all(type(p) is str for p in path):
        return ".".join(path)
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def undotted(path: str) -> tuple[str | int, ...]:
    """``spec.queues[2].name`` -> ``("spec", "queues", 2, "name")`` (inverse of :func:`dotted`)."""
    out: list[str | int] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        if name:
            out.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            out.append(int(index) if index.isdigit() else index)
            rest = rest.lstrip("[")
    return tuple(out)


def brief(text: str, limit: int = WARNING_LIMIT) -> str:
    """``text`` under ``limit`` characters, cutting the advice (what follows the last
    ". " or "; " that fits) before cutting words."""
    if len(text) < limit:
        return text
    cut = max(text.rfind(". ", 0, limit + 1), text.rfind("; ", 0, limit + 1))
    return text[:cut] if cut > 0 else text[: limit - 4] + "..."


def plain_number(value: Decimal) -> str:
    """A decimal without exponent or trailing zeros: ``64000``, ``0.5``."""
    return format(value.normalize(), "f")


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_ABSENT = object()


class Memo(Generic[K, V]):
    """A bounded, thread-safe LRU map: what many requests read, computed once. (Pure
    functions of hashable arguments use ``functools.lru_cache`` instead.)"""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, default: Any = None) -> Any:
        """The value, or ``default`` when absent (a stored None is a value)."""
        found = self._items.get(key, _ABSENT)  # atomic under the GIL; only writers lock
        if found is _ABSENT:
            return default
        try:  # noqa: SIM105 (contextlib.suppress costs a context manager per hit)
            self._items.move_to_end(key)
        except KeyError:  # evicted meanwhile: still a good answer
            pass
        return found

    def put(self, key: K, value: V) -> V:
        with self._lock:
            self._items[key] = value
            if len(self._items) > self._size:
                self._items.popitem(last=False)
        return value
