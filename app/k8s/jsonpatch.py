"""RFC 6902 JSON Patch from an original and a changed document, and RFC 6901 JSON
Pointers (the one place their ``~0``/``~1`` escaping is written).

Like controller-runtime's ``PatchResponseFromRaw``: rules change a copy, and the
patch is the precise difference — ``remove``/``add``/``replace`` at the exact JSON
pointer, nothing unrelated touched. The walk is a loop, not recursion, so a document
of any depth gets its patch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["diff", "escape", "path_of", "tokens", "unescape"]


def escape(token: object) -> str:
    """One reference token of a JSON Pointer (RFC 6901: ``~`` as ``~0``, ``/`` as ``~1``)."""
    text = str(token)
    if "~" in text or "/" in text:
        return text.replace("~", "~0").replace("/", "~1")
    return text


def unescape(token: str) -> str:
    """The key a reference token names (``~1`` before ``~0``, as RFC 6901 says)."""
    return token.replace("~1", "/").replace("~0", "~")


def tokens(pointer: str) -> list[str]:
    """The unescaped tokens of a pointer: ``/a/b~1c`` -> ``["a", "b/c"]``; ``""`` (the
    whole document) -> ``[]``. Raises ValueError for text that is not a pointer."""
    if not pointer:
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"not a JSON pointer: {pointer!r}")
    return [unescape(t) for t in pointer[1:].split("/")]


def path_of(pointer: str) -> tuple[str | int, ...]:
    """A pointer as a path of keys and list indexes (tokens of digits are indexes)."""
    return tuple(int(t) if t.isdigit() else t for t in tokens(pointer))



def _differs(a: Any, b: Any) -> bool:
    """Identity first (parts a copier shared), then C-speed equality. Too deep for that,
    "maybe": the walk goes down and finds what differs (asking ``same`` at every level
    instead would cost the square of the depth)."""
    if a is b:
        return False
    try:
        return bool(a != b)
    except RecursionError:
        return True


def diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """The operations that turn ``old`` into ``new``, in document order."""
    ops: list[dict[str, Any]] = []
    # Work items, last first: an operation to emit, or a (old, new, path) to compare.
    todo: list[dict[str, Any] | tuple[Any, Any, str]] = [(old, new, path)]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            ops.append(item)
            continue
        a, b, where = item
        if type(a) is not type(b):
            ops.append({"op": "replace", "path": where, "value": b})
        elif isinstance(a, dict):
            later: list[dict[str, Any] | tuple[Any, Any, str]] = [
                {"op": "remove", "path": where + "/" + escape(key)} for key in a if key not in b]
            for key, value in b.items():
                if key not in a:
                    later.append({"op": "add", "path": where + "/" + escape(key), "value": value})
                elif _differs(a[key], value):
                    later.append((a[key], value, where + "/" + escape(key)))
            todo.extend(reversed(later))
        elif isinstance(a, list):
            if len(a) != len(b):
                ops.append({"op": "replace", "path": where, "value": b})
            else:
                todo.extend(reversed([(x, y, f"{where}/{i}")
                                      for i, (x, y) in enumerate(zip(a, b, strict=True))
                                      if _differs(x, y)]))
        elif a != b:
            ops.append({"op": "replace", "path": where, "value": b})
    return ops
