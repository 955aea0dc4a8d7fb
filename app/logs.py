"""Structured JSON logs, one object a line."""

from __future__ import annotations

import logging
import sys

import orjson

__all__ = ["setup_logging"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                "logger": record.name, "msg": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(fields)
        uid = getattr(record, "uid", None)
        if uid:
            data["uid"] = uid
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(data, default=str).decode()


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
