"""Objects from manifest files: the cluster `envelope check` sees."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["LoadError", "Manifest", "load_manifests"]

SUFFIXES = (".yaml", ".yml", ".json")
#: libyaml's safe loader when PyYAML was built with it (the wheels are): 4x faster.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class LoadError(ValueError):
    """A file or document that cannot be read; the message names it."""


@dataclass(frozen=True)
class Manifest:
    source: str
    document: int
    """1-based document number within the file."""
    obj: dict[str, Any]


def _files(path: str) -> Iterator[tuple[str, str]]:
    if path == "-":
        yield "<stdin>", sys.stdin.read()
        return
    p = Path(path)
    if p.is_dir():
        found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SUFFIXES)
        for f in found:
            yield str(f), f.read_text()
        return
    try:
        yield str(p), p.read_text()
    except OSError as exc:
        raise LoadError(f"{path}: cannot read: {exc.strerror}") from None


def _objects(doc: Any, source: str, index: int) -> Iterator[dict[str, Any]]:
    if not isinstance(doc, dict):
        raise LoadError(f"{source}: document {index}: expected a Kubernetes object, "
                        f"got {type(doc).__name__}")
    if doc.get("kind", "").endswith("List") and isinstance(doc.get("items"), list):
        for item in doc["items"]:
            yield from _objects(item, source, index)
        return
    for key in ("apiVersion", "kind"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise LoadError(f"{source}: document {index}: {key} is missing")
    yield doc


def load_manifests(paths: list[str]) -> list[Manifest]:
    out: list[Manifest] = []
    for source, text in (f for path in paths for f in _files(path)):
        try:
            docs = list(yaml.load_all(text, Loader=_LOADER))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise LoadError(f"{source}:{where} not valid YAML: "
                            f"{getattr(exc, 'problem', None) or exc}") from None
        for i, doc in enumerate(docs, start=1):
            if doc is None:
                continue
            out.extend(Manifest(source, i, obj) for obj in _objects(doc, source, i))
    return out
