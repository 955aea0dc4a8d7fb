"""RFC 6902 JSON Patch from an original and a changed document.

Like controller-runtime's ``PatchResponseFromRaw``: rules change a copy, and the
patch is the precise difference — ``remove``/``add``/``replace`` at the exact JSON
pointer, nothing unrelated touched.
"""

from __future__ import annotations

from typing import Any

__all__ = ["diff"]


def _escape(token: object) -> str:
    text = str(token)
    if "~" in text or "/" in text:
        return text.replace("~", "~0").replace("/", "~1")
    return text


def diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """The operations that turn ``old`` into ``new``."""
    if type(old) is not type(new):
        return [{"op": "replace", "path": path, "value": new}]
    if isinstance(old, dict):
        ops: list[dict[str, Any]] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": path + "/" + _escape(key)})
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": path + "/" + _escape(key), "value": value})
            elif old[key] is not value and old[key] != value:
                # identity first (parts a copier shared), then C-speed equality
                ops.extend(diff(old[key], value, path + "/" + _escape(key)))
        return ops
    if isinstance(old, list):
        if len(old) != len(new):
            return [{"op": "replace", "path": path, "value": new}]
        ops = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a is not b and a != b:
                ops.extend(diff(a, b, f"{path}/{i}"))
        return ops
    if old != new:
        return [{"op": "replace", "path": path, "value": new}]
    return []
