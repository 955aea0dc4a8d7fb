"""Structured JSON logs, one object a line.

Every line, from the admission log and from the logging machinery alike, is bounded:
each field passes through :func:`capped` here, so what a request carries (a 3 MB
name, uid or namespace, an exception quoting an object) costs a few KiB of log at
most (issue 25, class 5). A cut value ends with ``…[cut: N characters]``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from app.k8s.util import cut

__all__ = ["FIELD_LIMITS", "LINE_LIMIT", "admission_log", "capped", "setup_logging"]

FIELD_LIMITS: dict[str, int] = {
    "uid": 128,         # Kubernetes uids are 36 characters
    "name": 253,        # the longest object name Kubernetes admits (a DNS subdomain)
    "namespace": 63,    # a DNS label
    "kind": 63,
    "user": 256,
    "message": 1024,    # a denial: the rules' words
    "msg": 1024,
    "exception": 4096,  # a traceback; each of its lines is cut at 512 characters as well
}
"""How many characters of a field a log line keeps, by field name."""
_OTHER = 256
"""For any other string (a field, a list item, a mapping key or value)."""
_ITEMS = 16
"""Items kept of a list or mapping; the rest is counted."""
_DEPTH = 4
_FIELDS = 64
"""Fields kept of a line (an admission line has fifteen)."""
LINE_LIMIT = 16 * 1024
"""Bytes a log line can take. Fields at their limits usually fit; a line that does not
(many long fields, characters JSON escapes six bytes wide) is written again with its
short scalars only, naming the fields it dropped (:func:`_encoded`)."""


def capped(value: Any, limit: int = _OTHER, depth: int = 0) -> Any:
    """``value`` as a log line may hold it: strings cut at ``limit`` characters, lists
    and mappings at :data:`_ITEMS` items (a last item counts the rest), nesting at
    :data:`_DEPTH`, anything else that JSON cannot hold by its (cut) ``str``."""
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):  # JSON as orjson writes it holds 64 bits
        return value if -2**63 <= value < 2**64 else f"[an integer of {value.bit_length()} bits]"
    if isinstance(value, str):
        return cut(value, limit)
    if depth >= _DEPTH:
        return f"[{type(value).__name__}]"
    if isinstance(value, dict):
        out = {cut(str(k), _OTHER): capped(v, _OTHER, depth + 1)
               for k, v in list(value.items())[:_ITEMS]}
        if len(value) > _ITEMS:
            out["…"] = f"{len(value) - _ITEMS:,} more"
        return out
    if isinstance(value, list | tuple):
        if len(value) <= _ITEMS and all(type(v) is str and len(v) <= _OTHER for v in value):
            return value  # rule ids, the usual list
        items = [capped(v, _OTHER, depth + 1) for v in value[:_ITEMS]]
        if len(value) > _ITEMS:
            items.append(f"…[{len(value) - _ITEMS:,} more]")
        return items
    return cut(str(value), limit)


def _capped_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Each field capped (:func:`capped`). On the hot path: one line per review, so the
    usual short strings and numbers take a type check and a length."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if len(out) >= _FIELDS:
            break
        if type(key) is not str or len(key) > _OTHER:
            key = cut(str(key), _OTHER)
        kind = type(value)
        if kind is str:
            limit = FIELD_LIMITS.get(key, _OTHER)
            out[key] = value if len(value) <= limit else cut(value, limit)
        elif kind is bool or kind is float or value is None or (
                kind is int and -2**63 <= value < 2**64):
            out[key] = value
        else:
            out[key] = capped(value, FIELD_LIMITS.get(key, _OTHER))
    return out


_FIRST = ("ts", "level", "logger", "msg", "uid", "decision", "kind", "namespace", "name",
          "operation", "endpoint")
"""What a line cut down to its short scalars keeps first."""


def _encoded(data: dict[str, Any]) -> bytes:
    """``data`` as one JSON line of at most :data:`LINE_LIMIT` bytes."""
    line = orjson.dumps(data, default=str)
    if len(line) <= LINE_LIMIT:
        return line
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    first = [key for key in _FIRST if key in data]
    for key in [*first, *(key for key in data if key not in _FIRST)]:
        value = data[key]
        if len(kept) < 16 and (value is None or isinstance(value, bool | int | float)):
            kept[cut(key, 64)] = value
        elif len(kept) < 16 and isinstance(value, str):
            kept[cut(key, 64)] = cut(value, 64)
        else:
            dropped.append(key)
    kept["cut"] = cut(f"a line of {len(line):,} bytes; dropped: {', '.join(dropped)}", 256)
    return orjson.dumps(kept, default=str)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                                "logger": record.name,
                                "msg": cut(record.getMessage(), FIELD_LIMITS["msg"])}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(_capped_fields(fields))
        uid = getattr(record, "uid", None)
        if uid:
            data["uid"] = capped(uid, FIELD_LIMITS["uid"])
        if record.exc_info:
            text = self.formatException(record.exc_info)
            data["exception"] = cut("\n".join(cut(line, 512) for line in text.split("\n")),
                                    FIELD_LIMITS["exception"])
        return _encoded(data).decode()


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    admission_log.enabled = root.isEnabledFor(logging.INFO)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


class AdmissionLog:
    """One JSON line per review, written straight to stderr.

    The same shape as the formatter's lines, without the logging machinery, which
    cost a fifth of a review's time on the hot path.
    """

    def __init__(self) -> None:
        self.enabled = True

    def write(self, fields: dict[str, Any]) -> None:
        line = _encoded({"ts": round(time.time(), 3), "level": "info",
                         "logger": "envelope.admission", "msg": "admission",
                         **_capped_fields(fields)})
        stream = sys.stderr
        try:
            stream.buffer.write(line + b"\n")
            stream.buffer.flush()
        except (AttributeError, ValueError):  # no binary buffer (captured) or closed
            stream.write(line.decode() + "\n")


admission_log = AdmissionLog()
