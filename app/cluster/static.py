"""Objects from manifest files: the cluster `envelope check` sees, read as kubectl reads them.

kubectl v1.34 (k8s.io/cli-runtime ``resource/visitor.go``, k8s.io/apimachinery
``util/yaml/decoder.go``) decodes every file with a byte-order-mark override, splits the
stream into documents at ``---`` lines before any YAML parsing, converts each document to
JSON with sigs.k8s.io/yaml (:mod:`app.cluster.yamlk8s`) and skips empty or ``null`` ones;
so does this module (the details: docs/fidelity.md, "YAML as kubectl reads it").

Parsing uses libyaml (PyYAML's C parser) for the syntax and node marks; every object
keeps its file and line, and :meth:`Manifest.line_of` finds a field's line on demand by
parsing that one document again, so loading pays nothing for lines nobody asks about.

Why one module of ~420 lines: files, directories and stdin to documents to objects with
their line marks is one reading, kubectl's visitor order; :meth:`Manifest.line_of`
re-reads a document with the same composer, so it stays next to it.
"""

from __future__ import annotations

import fnmatch
import functools
import gc
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from app.cluster.yamlk8s import PLAIN, YamlValueError, build
from app.k8s.jsonpatch import tokens as pointer_tokens

__all__ = ["LoadError", "Loaded", "Manifest", "Skipped", "decode", "load", "load_manifests"]

SUFFIXES = (".yaml", ".yml", ".json")
#: Directories never walked into: VCS data, virtualenvs, package caches.
SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "venv"})
#: Files that are YAML with apiVersion and kind but not Kubernetes API objects.
KUSTOMIZE_FILES = frozenset({"kustomization.yaml", "kustomization.yml", "Kustomization"})
NOT_API_GROUPS = ("kustomize.config.k8s.io", "config.kubernetes.io")

try:
    from yaml._yaml import CParser as _LibyamlParser  # libyaml, as the PyYAML wheels ship it
    _CParser: type[_LibyamlParser] | None = _LibyamlParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _CParser = None
_BaseResolver = yaml.resolver.BaseResolver


class LoadError(ValueError):
    """A file or document that cannot be read; the message names it."""

    def __init__(self, source: str, message: str, document: int = 0, line: int = 0) -> None:
        where = f"{source}:{line}" if line else source
        doc = f" document {document}:" if document else ""
        super().__init__(f"{where}:{doc} {message}")
        self.source, self.document, self.line, self.problem = source, document, line, message


class _Loader(*((_CParser,) if _CParser else (yaml.reader.Reader, yaml.scanner.Scanner,  # type: ignore[misc]
                                              yaml.parser.Parser, yaml.composer.Composer)),
              _BaseResolver):
    """libyaml's parser and composer; scalars keep their raw text and a tag saying
    whether they were plain, and :func:`app.cluster.yamlk8s.build` resolves them."""

    def __init__(self, stream: str) -> None:
        if _CParser:
            _CParser.__init__(self, stream)
        else:  # PyYAML without libyaml: the same nodes, only slower
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
        _BaseResolver.__init__(self)

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode:
            return PLAIN if implicit[0] else _BaseResolver.DEFAULT_SCALAR_TAG
        return (_BaseResolver.DEFAULT_MAPPING_TAG if kind is MappingNode
                else _BaseResolver.DEFAULT_SEQUENCE_TAG)


def compose(text: str) -> Node | None:
    """The first document's node graph (as go-yaml's Unmarshal reads only the first)."""
    loader = _Loader(text)
    try:
        return loader.get_node() if loader.check_node() else None
    finally:
        loader.dispose()


#: Findings of one object come one after another: parse its document once for them all.
_compose_cached = functools.lru_cache(maxsize=16)(compose)


@dataclass(frozen=True)
class _Document:
    text: str
    first_line: int
    """0-based line of the document's first line in its file."""


@dataclass(frozen=True)
class Manifest:
    source: str
    document: int
    """1-based document number within the file."""
    obj: dict[str, Any]
    line: int = 0
    """1-based line where the object starts (0: unknown)."""
    item: int | None = None
    """Index in the ``items`` of a List document, when the object came from one."""
    _doc: _Document | None = field(default=None, repr=False, compare=False)

    def line_of(self, path: str) -> int:
        """Line of the field at ``path`` (``spec.containers[0].resources.limits.cpu``
        or a JSON pointer), or of the nearest enclosing field that exists."""
        if self._doc is None or not path:
            return self.line
        try:
            node = _compose_cached(self._doc.text)
        except yaml.YAMLError:
            return self.line
        if node is None:
            return self.line
        if self.item is not None:
            node = _child(node, "items")
            node = node.value[self.item] if isinstance(node, SequenceNode) else None
            if node is None:
                return self.line
        return self._doc.first_line + _walk(node, path) + 1


def _child(node: Node, key: str) -> Node | None:
    k: Node
    v: Node
    if isinstance(node, MappingNode):
        for k, v in node.value:
            if isinstance(k, ScalarNode) and k.value == key:
                return v
    return None


_INDEX = re.compile(r"\[(\d+)\]")


def _walk(node: Node, path: str) -> int:
    """0-based line of the deepest field along ``path`` (its key's line); dotted keys
    may themselves hold dots (``limits.nvidia.com/gpu``): the longest key that fits wins."""
    line = node.start_mark.line
    if path.startswith("/"):
        for part in pointer_tokens(path):
            if isinstance(node, SequenceNode) and part.isdigit() and int(part) < len(node.value):
                node = node.value[int(part)]
                line = node.start_mark.line
                continue
            pair = _pair(node, lambda key, part=part: key == part)
            if pair is None:
                break
            line, node = pair[0].start_mark.line, pair[1]
        return line
    rest = path
    while rest:
        rest = rest.lstrip(".")
        m = _INDEX.match(rest)
        if m:
            index = int(m.group(1))
            if not isinstance(node, SequenceNode) or index >= len(node.value):
                break
            node, rest = node.value[index], rest[m.end():]
            line = node.start_mark.line
            continue
        pair = _pair(node, lambda key, here=rest: here.startswith(key)
                     and here[len(key):len(key) + 1] in ("", ".", "["))
        if pair is None:
            break
        line, node, rest = pair[0].start_mark.line, pair[1], rest[len(pair[0].value):]
    return line


def _pair(node: Node, fits: Any) -> tuple[Node, Node] | None:
    """The (key, value) of a mapping whose key fits; the longest key when several do."""
    best = None
    if isinstance(node, MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, ScalarNode) else None
            if key and fits(key) and (best is None or len(key) > len(best[0].value)):
                best = (k, v)
    return best


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class Loaded:
    manifests: list[Manifest] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    """Files and directories left out, and why (not Kubernetes objects, excluded, ...)."""
    charts: list[str] = field(default_factory=list)
    """Helm chart directories found (their ``templates/`` are skipped: render them)."""


def decode(data: bytes) -> str:
    """Bytes to text as kubectl's ``unicode.BOMOverride(unicode.UTF8.NewDecoder())``."""
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8", "replace")
    if data.startswith(b"\xff\xfe"):
        return data[2:].decode("utf-16-le", "replace")
    if data.startswith(b"\xfe\xff"):
        return data[2:].decode("utf-16-be", "replace")
    return data.decode("utf-8", "replace")


_SEPARATOR = re.compile(r"^---([^\n]*)$", re.M)


def split_documents(text: str) -> Iterator[tuple[int, str, str | None]]:
    """(first line, text, problem) per document, split the way kubectl's YAMLReader does:
    empty chunks (two separators in a row) are not documents; a ``---`` line followed by
    anything but a comment is a document of its own that only holds that problem."""
    start = line = 0
    for m in _SEPARATOR.finditer(text):
        chunk = text[start:m.start()]
        if chunk:
            yield line, chunk, None
        line += chunk.count("\n")
        rest = m.group(1).strip()
        if rest and not rest.startswith("#"):
            yield line, "", f"invalid YAML document separator: {rest}"
        line += 1
        start = m.end() + 1
    if start < len(text):
        yield line, text[start:], None


def _is_object(doc: Any) -> bool:
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc


def _objects(doc: Any, node: Node, source: str, index: int, document: _Document,
             out: Loaded) -> Iterator[Manifest]:
    line = document.first_line + node.start_mark.line + 1
    if not isinstance(doc, dict):
        what = "a list" if isinstance(doc, list) else f"the scalar {doc!r}"[:80]
        out.errors.append(LoadError(source, f"expected a Kubernetes object, got {what}",
                                    index, line))
        return
    kind = doc.get("kind")
    if (isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list)
            and "apiVersion" in doc):
        items = _child(node, "items")
        for i, item in enumerate(doc["items"]):
            item_node = items.value[i] if isinstance(items, SequenceNode) else node
            item_line = document.first_line + item_node.start_mark.line + 1
            problem = _identity_problem(item)
            if problem:
                line = document.first_line + _walk(item_node, problem[1]) + 1
                out.errors.append(LoadError(source, f"items[{i}]: {problem[0]}", index, line))
                continue
            yield Manifest(source, index, item, item_line, i, document)
        return
    problem = _identity_problem(doc)
    if problem:
        line = document.first_line + _walk(node, problem[1]) + 1
        out.errors.append(LoadError(source, problem[0], index, line))
        return
    yield Manifest(source, index, doc, line, None, document)


def _identity_problem(doc: Any) -> tuple[str, str] | None:
    """What is wrong with an object's apiVersion or kind, and which of the two."""
    if not isinstance(doc, dict):
        return "expected a Kubernetes object", ""
    for key in ("apiVersion", "kind"):
        value = doc.get(key)
        if value is None or value == "":
            return f"{key} is {'missing' if key not in doc else 'empty'}", key
        if not isinstance(value, str):
            return f"{key} must be a string, got {type(value).__name__} {value!r}"[:120], key
    return None


def load_text(text: str, source: str, out: Loaded, *, skip_non_objects: bool = True) -> None:
    """Every document of one file into ``out``. A file none of whose documents has
    apiVersion and kind is not a manifest (a Helm values file, CI configuration): it is
    skipped, when ``skip_non_objects``, rather than refused."""
    # Each document's node graph is dropped as soon as its objects and lines are read:
    # kept for the whole file, 50,000 documents (15 MB) peaked at 1,081 MiB (issue 38).
    parsed: list[tuple[Any, list[Manifest]]] = []
    errors: list[LoadError] = []
    found = Loaded()  # the objects' own problems (identity), reported after the parse errors
    for index, (first_line, chunk, problem) in enumerate(split_documents(text), start=1):
        if problem:
            errors.append(LoadError(source, problem, index, first_line + 1))
            continue
        try:
            node = compose(chunk)
            if node is None:
                continue
            doc = build(node)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = first_line + mark.line + 1 if mark else 0
            errors.append(LoadError(source, f"not valid YAML: {exc.problem or exc.context}",
                                    index, line))
            continue
        except (yaml.YAMLError, YamlValueError) as exc:
            line = first_line + getattr(exc, "line", 0) + 1
            errors.append(LoadError(source, f"cannot convert to JSON as kubectl does: {exc}",
                                    index, line))
            continue
        if doc is None:
            continue
        parsed.append((doc, [] if _not_api(doc) else
                       list(_objects(doc, node, source, index, _Document(chunk, first_line), found))))
    if (skip_non_objects and not errors and parsed
            and not any(_is_object(doc) and not _not_api(doc) for doc, _ in parsed)):
        out.skipped.append(Skipped(source, "no document has apiVersion and kind"))
        return
    if skip_non_objects and not errors and not parsed:
        out.skipped.append(Skipped(source, "no documents"))
        return
    out.errors.extend(errors)
    out.errors.extend(found.errors)
    for _, manifests in parsed:
        out.manifests.extend(manifests)


def _not_api(doc: Any) -> bool:
    version = doc.get("apiVersion") if isinstance(doc, dict) else None
    return isinstance(version, str) and version.split("/")[0] in NOT_API_GROUPS


def _excluded(path: str, rel: str, patterns: Iterable[str]) -> bool:
    name = os.path.basename(path)
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(path, p)
               or fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(rel, p.rstrip("/") + "/*")
               for p in patterns)


def _walk_dir(root: Path, exclude: tuple[str, ...], out: Loaded) -> Iterator[Path]:
    for here, dirs, files in os.walk(root):
        base = Path(here)
        keep = []
        for d in sorted(dirs):
            path = base / d
            rel = path.relative_to(root).as_posix()
            if d.startswith(".") or d in SKIPPED_DIRS:
                out.skipped.append(Skipped(str(path), "directory not walked"))
            elif _excluded(str(path), rel, exclude):
                out.skipped.append(Skipped(str(path), "excluded"))
            elif d == "templates" and "Chart.yaml" in files:
                out.skipped.append(Skipped(str(path), "Helm chart templates (render them first)"))
                out.charts.append(str(base))
            else:
                keep.append(d)
        dirs[:] = keep
        for name in sorted(files):
            path = base / name
            if not name.endswith(SUFFIXES):
                continue
            if _excluded(str(path), path.relative_to(root).as_posix(), exclude):
                out.skipped.append(Skipped(str(path), "excluded"))
            elif name in KUSTOMIZE_FILES:
                out.skipped.append(Skipped(str(path), "a kustomization, not an API object"))
            else:
                yield path


def load(paths: Iterable[str], exclude: Iterable[str] = ()) -> Loaded:
    """Every object in ``paths`` (files, directories, ``-`` for stdin), every problem
    found on the way, and what was skipped. Never raises for bad input."""
    out = Loaded()
    patterns = tuple(exclude)
    # Loading only allocates (a million containers for a large tenancy) and frees no
    # cycles: collections during it would walk the growing heap again and again.
    enabled = gc.isenabled()
    gc.disable()
    try:
        _load_paths(paths, patterns, out)
    finally:
        if enabled:
            gc.enable()
    return out


def _load_paths(paths: Iterable[str], patterns: tuple[str, ...], out: Loaded) -> None:
    for path in paths:
        if path == "-":
            load_text(decode(sys.stdin.buffer.read()), "<stdin>", out, skip_non_objects=False)
            continue
        p = Path(path)
        if p.is_dir():
            files = list(_walk_dir(p, patterns, out))
        elif _excluded(path, path, patterns):
            out.skipped.append(Skipped(path, "excluded"))
            continue
        else:
            files = [p]
        for f in files:
            try:
                data = f.read_bytes()
            except OSError as exc:
                out.errors.append(LoadError(str(f), f"cannot read: {exc.strerror or exc}"))
                continue
            load_text(decode(data), str(f), out)


def load_manifests(paths: list[str]) -> list[Manifest]:
    """The objects in ``paths``; :class:`LoadError` (naming every problem) if any."""
    loaded = load(paths)
    if loaded.errors:
        raise LoadError(loaded.errors[0].source,
                        "\n".join(str(e) for e in loaded.errors)[len(loaded.errors[0].source) + 2:])
    return loaded.manifests
