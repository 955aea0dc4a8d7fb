"""Small helpers every layer shares: reading nested JSON, comparing and copying it at
any depth, paths for messages, one bounded cache, one warning length, plain numbers."""

from __future__ import annotations

import hashlib
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from decimal import Decimal
from functools import partial
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any, Generic, TypeVar, overload

import orjson

__all__ = [
    "WARNING_LIMIT",
    "Memo",
    "brief",
    "cut",
    "cut_middle",
    "deep_copy",
    "dig",
    "digest",
    "dotted",
    "footprint",
    "plain_number",
    "same",
    "shown",
    "undotted",
    "visible",
]

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


def cut(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit`` and a
    marker with its length: ``abc…[cut: 3,000,000 characters]``. What an object
    holds reaches messages and logs only through this (or :func:`shown`), so a
    megabyte value costs a few hundred bytes to report."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[cut: {len(text):,} characters]"


def cut_middle(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: its beginning and its end (where a
    message says what to change) around ``…[cut: 3,000,000 characters]…``. Applied
    twice, the same."""
    if len(text) <= limit:
        return text
    marker = f"…[cut: {len(text):,} characters]…"
    keep = max(0, limit - len(marker))
    head = (keep + 1) // 2
    return f"{text[:head]}{marker}{text[len(text) - (keep - head):] if keep > head else ''}"


def shown(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut like :func:`cut` past ``limit`` characters."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}…[cut: {len(text):,} characters]"


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def visible(text: str, keep: str = "") -> str:
    """``text`` with every control character (C0, DEL, C1, and the Unicode line and
    paragraph separators) written as its escape (``\\n``, ``\\x1b``): what a user
    wrote in a name or value can neither drive a terminal nor start a line of its own
    (a GitHub workflow command ``::error::…`` in a CI log). ``keep``: characters the
    caller itself uses (a text's own newlines)."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)


def plain_number(value: Decimal) -> str:
    """A decimal without exponent or trailing zeros: ``64000``, ``0.5``."""
    return format(value.normalize(), "f")


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")
_ABSENT = object()


class Memo(Generic[K, V]):
    """A bounded, thread-safe LRU map: what many requests read, computed once.

    Bounded twice: at most ``size`` entries, and at most ``budget`` bytes — each entry
    weighs ``weigh(key, value)``, by default :func:`footprint` of both (the bytes they
    hold, measured, not guessed from the input), and the oldest are evicted first until
    the sum is within the budget; an entry heavier than the whole budget is not kept.
    So a client that chooses what is remembered (a tenant's dry-runs) cannot grow it
    past ``budget``, whatever the size of what it sends. Keys should name what the
    consumer reads (:func:`digest` of the judged part), never an object's identity or a
    version that changes for other reasons. docs/reliability.md lists every memo."""

    def __init__(self, size: int, budget: int, weigh: Callable[[K, V], int] | None = None) -> None:
        self._size = size
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._weigh: Callable[[K, V], int] = weigh if weigh is not None else _weigh_both
        self._budget = budget
        self._weight = 0

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: Any = None) -> Any:
        """The value, or ``default`` when absent (a stored None is a value)."""
        found: Any = self._items.get(key, _ABSENT)  # atomic under the GIL; only writers lock
        if found is _ABSENT:
            return default
        try:  # noqa: SIM105 (contextlib.suppress costs a context manager per hit)
            self._items.move_to_end(key)
        except KeyError:  # evicted meanwhile: still a good answer
            pass
        return found[0]

    def put(self, key: K, value: V, extra: int = 0) -> V:
        """Remember ``value``; ``extra``: bytes it holds out of ``weigh``'s sight (a
        ``ValidationError`` keeps parts of its input inside pydantic-core)."""
        weight = self._weigh(key, value) + extra  # outside the lock: it may walk a large value
        if weight > self._budget:
            return value
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._items[key] = (value, weight)
            self._weight += weight
            while len(self._items) > self._size or self._weight > self._budget:
                _, (_, gone) = self._items.popitem(last=False)
                self._weight -= gone
        return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._weight = 0

    @property
    def weight(self) -> int:
        """The bytes the entries are accounted for (the sum of their weights)."""
        return self._weight

    @property
    def budget(self) -> int:
        return self._budget


def _weigh_both(key: object, value: object) -> int:
    return footprint((key, value))


_OPAQUE = (type, ModuleType, FunctionType, BuiltinFunctionType, MethodType, partial)
"""Shared by everything that refers to them: not part of a value's footprint."""
_LEAVES = (str, bytes, bytearray, int, float, bool, Decimal, type(None))


def footprint(value: object) -> int:
    """The bytes ``value`` holds: ``sys.getsizeof`` of it and of everything it reaches
    through containers, instance dicts and slots (pydantic models, dataclasses), each
    object once. Classes, functions and modules are not counted (shared), nor what a
    C extension keeps out of sight. Iterative: a value of any depth is measured."""
    seen: set[int] = set()
    total = 0
    stack: list[object] = [value]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, _LEAVES):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        else:
            if isinstance(obj, BaseException):
                stack.extend(obj.args)
            attrs = getattr(obj, "__dict__", None)
            if attrs is not None:
                stack.append(attrs)
            for cls in type(obj).__mro__:
                for slot in cls.__dict__.get("__slots__", ()):
                    if slot != "__dict__" and slot != "__weakref__":
                        found = getattr(obj, slot, None)
                        if found is not None:
                            stack.append(found)
    return total


def digest(value: object) -> bytes:
    """16 bytes naming a JSON value by its content (BLAKE2b of its orjson encoding):
    the key a memo remembers a derived value by, so the key is small whatever the
    value's size and an equal value written again is found again. Raises TypeError or
    ``orjson.JSONEncodeError`` (a ``TypeError``) for what orjson cannot encode (non-string
    keys from a YAML file, nesting past 255 levels): remember nothing then."""
    return hashlib.blake2b(orjson.dumps(value), digest_size=16).digest()
