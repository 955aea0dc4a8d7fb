"""Environment variables as the container sees them (issue 12, class 6).

A port of the kubelet's expansion as of Kubernetes v1.34.12 (ported then):

- ``third_party/forked/golang/expansion/expand.go`` ``Expand``: ``$(NAME)`` is
  replaced by NAME's value when NAME is defined, and left as written when it is
  not; ``$$`` is one literal ``$``; a ``$`` before anything else stays as it is;
  an unterminated ``$(`` stays literal; nothing is nested.
- ``pkg/kubelet/kubelet_pods.go`` ``makeEnvironmentVariables``: the entries of
  ``env`` are evaluated in order into one map, so an entry sees the entries
  before it (and ``envFrom``), and the last entry of a name wins. An entry with
  ``valueFrom`` is not expanded; its value is only known on the node.

Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EnvValue", "Source", "container_env", "expand", "expand_tracked", "references"]

_UNKNOWN = object()


@dataclass(frozen=True)
class Source:
    """Where a ``$(name)`` reference put ``name``'s value: ``value[start:end]``.
    Text there is another variable's (a token, a password): messages name the
    variable, never show the text (issue 25, class 5)."""

    start: int
    end: int
    name: str


def expand(text: str, mapping: Callable[[str], str | None]) -> str:
    """expand.go ``Expand``; ``mapping`` returns None for an undefined name, which
    then stays as ``$(name)``."""
    return expand_tracked(text, mapping)[0]


def expand_tracked(text: str, mapping: Callable[[str], str | None]) -> tuple[str, tuple[Source, ...]]:
    """:func:`expand`, and where in the result each defined reference's value lies
    (empty values included, at their place)."""
    out: list[str] = []
    sources: list[Source] = []
    length = 0
    checkpoint = 0
    cursor = 0
    n = len(text)
    while cursor < n:
        if text[cursor] == "$" and cursor + 1 < n:
            piece = text[checkpoint:cursor]
            out.append(piece)
            length += len(piece)
            read, is_var, advance = _read_variable_name(text, cursor + 1)
            if is_var:
                value = mapping(read)
                if value is None:
                    piece = f"$({read})"
                else:
                    piece = value
                    sources.append(Source(length, length + len(value), read))
            else:
                piece = read
            out.append(piece)
            length += len(piece)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:], tuple(sources)


def references(text: str) -> tuple[str, ...]:
    """The names ``text`` refers to with ``$(NAME)``, in order, once each (``$$(X)`` is
    an escaped literal, not a reference)."""
    found: list[str] = []

    def record(name: str) -> str | None:
        found.append(name)
        return None  # left as written: only the names are wanted

    expand(text, record)
    return tuple(dict.fromkeys(found))


def _read_variable_name(text: str, start: int) -> tuple[str, bool, int]:
    """expand.go ``tryReadVariableName`` on ``text[start:]``."""
    first = text[start]
    if first == "$":
        return "$", False, 1
    if first == "(":
        end = text.find(")", start + 1)
        if end != -1:
            return text[start + 1:end], True, end - start + 1
        return "$(", False, 1
    return "$" + first, False, 1


@dataclass(frozen=True)
class EnvValue:
    """One variable as the container gets it. ``value`` is None when only the node
    knows it (``valueFrom``, or it refers to such a variable); ``unresolved`` names
    the ``$(NAME)`` references left as written because nothing defined NAME
    (with ``envFrom`` in the container the node may still define it)."""

    value: str | None
    unresolved: tuple[str, ...] = ()
    sources: tuple[Source, ...] = field(default=(), compare=False)
    """Where in ``value`` the values of the ``$(NAME)`` references it holds lie."""


def _expand_entry(text: str, values: Mapping[str, object],
                  unresolved: Mapping[str, tuple[str, ...]]
                  ) -> tuple[object, tuple[str, ...], tuple[Source, ...]]:
    """One entry's value (``_UNKNOWN`` when it refers to a value only the node
    knows), the names it refers to that nothing defined, including those left in
    the values it takes from earlier entries (their ``$(X)`` stays in its value),
    and where the values it took lie in it."""
    missing: list[str] = []
    unknown = False

    def lookup(ref: str) -> str | None:
        nonlocal unknown
        if ref not in values:
            missing.append(ref)
            return None
        found = values[ref]
        missing.extend(unresolved.get(ref, ()))
        if found is _UNKNOWN:
            unknown = True
            return ""
        return str(found)

    expanded, sources = expand_tracked(text, lookup)
    return (_UNKNOWN if unknown else expanded), tuple(dict.fromkeys(missing)), sources


def container_env(env: Iterable[Mapping[str, Any]], *,
                  env_from: Mapping[str, str | None] | None = None) -> dict[str, EnvValue]:
    """Every variable of one container's ``env`` as the container sees it.
    ``env_from`` holds what ``envFrom`` sources put there first, when known (None
    for a value only the node knows)."""
    values: dict[str, object] = dict(env_from or {})
    for key, val in list(values.items()):
        if val is None:
            values[key] = _UNKNOWN
    unresolved: dict[str, tuple[str, ...]] = {}
    where: dict[str, tuple[Source, ...]] = {}
    for entry in env:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        name = entry["name"]
        raw = entry.get("value")
        text = raw if isinstance(raw, str) else ""
        missing: tuple[str, ...] = ()
        sources: tuple[Source, ...] = ()
        result: object
        if text:
            result, missing, sources = _expand_entry(text, values, unresolved)
        elif entry.get("valueFrom") is not None:
            result = _UNKNOWN
        else:
            result = ""
        values[name] = result
        unresolved[name] = missing
        where[name] = sources
    return {name: EnvValue(None if v is _UNKNOWN else str(v), unresolved.get(name, ()),
                           where.get(name, ()))
            for name, v in values.items()}
