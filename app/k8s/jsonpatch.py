"""RFC 6902 JSON Patch from an original and a changed document.

Like controller-runtime's ``PatchResponseFromRaw``: rules change a copy, and the
patch is the precise difference — ``remove``/``add``/``replace`` at the exact JSON
pointer, nothing unrelated touched. The walk is a loop, not recursion, so a document
of any depth gets its patch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["diff"]


def _escape(token: object) -> str:
    text = str(token)
    if "~" in text or "/" in text:
        return text.replace("~", "~0").replace("/", "~1")
    return text


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
                {"op": "remove", "path": where + "/" + _escape(key)} for key in a if key not in b]
            for key, value in b.items():
                if key not in a:
                    later.append({"op": "add", "path": where + "/" + _escape(key), "value": value})
                elif _differs(a[key], value):
                    later.append((a[key], value, where + "/" + _escape(key)))
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
