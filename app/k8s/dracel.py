"""The CEL subset of DRA device selectors decided exactly (``selectors[].cel.expression``
of a DeviceClass and of a request): ``device.driver``, ``device.attributes["<domain>"].<name>``
and ``device.attributes["<domain>"]["<name>"]`` (string, int and bool attributes)
compared with ``==`` / ``!=`` to literals or to each other, combined with ``&&``, ``||``,
``!`` and parentheses, with CEL's error semantics (a missing attribute is an error;
``false && error`` is false, ``true || error`` true). Anything else (``in``, functions,
``capacity``, arithmetic, a version attribute) is "cannot decide": every device may
match, so a pod is never refused for it (docs/fidelity.md, "DRA scheduling oracle").

Expressions are compiled once into closures (``_COMPILED``, bounded); ``app/k8s/dra.py``
asks :func:`cel_references` what a selector reads and :func:`cel_match` whether a device
matches.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import cast

from app.k8s.util import Memo, footprint

__all__ = ["cel_match", "cel_references"]


_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<int>-?[0-9]+)(?![0-9.eEuU])|"""
                    r"""(?P<id>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>==|!=|&&|\|\||[!()\[\].]))""")


class _Unsupported(Exception):
    """The expression is outside the subset: cannot decide."""


_ERR = object()
"""A CEL evaluation error (a missing attribute, a comparison of different types)."""

Expr = Callable[[str, Mapping[str, object]], object]


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Unsupported(text[pos:])
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _unquote(raw: str) -> str:
    body = raw[1:-1]
    if "\\" in body:
        if re.search(r"\\[^\\\"']", body):
            raise _Unsupported(raw)  # escapes beyond \\ \" \' are not decided
        body = re.sub(r"\\(.)", r"\1", body)
    return body


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.refs: set[str] = set()

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            raise _Unsupported(str(tok))
        self.pos += 1
        return tok[1]

    def parse(self) -> Expr:
        expr = self.or_()
        if self.peek() is not None:
            raise _Unsupported(str(self.peek()))
        return expr

    def or_(self) -> Expr:
        parts = [self.and_()]
        while self.peek() == ("op", "||"):
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else _logic(parts, True)

    def and_(self) -> Expr:
        parts = [self.unary()]
        while self.peek() == ("op", "&&"):
            self.take()
            parts.append(self.unary())
        return parts[0] if len(parts) == 1 else _logic(parts, False)

    def unary(self) -> Expr:
        if self.peek() == ("op", "!"):
            self.take()
            inner = self.unary()
            return lambda d, a: _ERR if not isinstance(v := inner(d, a), bool) else not v
        return self.comparison()

    def comparison(self) -> Expr:
        if self.peek() == ("op", "("):
            self.take()
            left = self.or_()
            self.take(")")
        else:
            left = self.operand()
        tok = self.peek()
        if tok in (("op", "=="), ("op", "!=")):
            self.take()
            right = self.operand()
            return _compare(left, right, tok[1] == "==")
        return left

    def operand(self) -> Expr:
        kind, value = self.peek() or ("", "")
        if kind == "str":
            self.take()
            text = _unquote(value)
            return lambda d, a: text
        if kind == "int":
            self.take()
            number = int(value)
            return lambda d, a: number
        if kind == "id" and value in ("true", "false"):
            self.take()
            flag = value == "true"
            return lambda d, a: flag
        if kind == "op" and value == "(":
            self.take()
            inner = self.or_()
            self.take(")")
            return inner
        self.take("device")
        self.take(".")
        member = self.take(kind="id")
        if member == "driver":
            self.refs.add("driver")
            return lambda d, a: d
        if member != "attributes":
            raise _Unsupported(member)
        self.take("[")
        domain = _unquote(self.take(kind="str"))
        self.take("]")
        if self.peek() == ("op", "."):
            self.take()
            name = self.take(kind="id")
        else:
            self.take("[")
            name = _unquote(self.take(kind="str"))
            self.take("]")
        key = f"{domain}/{name}"
        self.refs.add(key)
        return lambda d, a: a.get(key, _ERR)


def _logic(parts: list[Expr], is_or: bool) -> Expr:
    def run(d: str, a: Mapping[str, object]) -> object:
        error = False
        for part in parts:
            v = part(d, a)
            if not isinstance(v, bool):
                error = True
            elif v is is_or:
                return is_or  # true || x, false && x: decided whatever x is
        return _ERR if error else not is_or

    return run


def _compare(left: Expr, right: Expr, equal: bool) -> Expr:
    def run(d: str, a: Mapping[str, object]) -> object:
        x, y = left(d, a), right(d, a)
        if x is _ERR or y is _ERR or type(x) is not type(y):
            return _ERR  # CEL: no such key / no matching overload
        return (x == y) is equal

    return run


_COMPILED: Memo[str, tuple[Expr, frozenset[str]] | None] = Memo(
    1024, 4 * 2**20, lambda expression, _: footprint(expression) + 48 * len(expression))
"""Compiled expressions by their text, at most 4 MiB: a compiled expression is closures,
which ``footprint`` cannot see into; tracemalloc measures ~40 bytes a character."""
_NOT_COMPILED = object()


def _compiled(expression: str) -> tuple[Expr, frozenset[str]] | None:
    found = _COMPILED.get(expression, _NOT_COMPILED)
    if found is not _NOT_COMPILED:
        return cast("tuple[Expr, frozenset[str]] | None", found)
    try:
        parser = _Parser(expression)
        compiled: tuple[Expr, frozenset[str]] | None = (parser.parse(), frozenset(parser.refs))
    except (_Unsupported, RecursionError, ValueError):
        compiled = None
    return _COMPILED.put(expression, compiled)


def cel_references(expression: str | None) -> frozenset[str] | None:
    """What the expression reads of a device (``driver``, ``<domain>/<name>``), or None
    when it is outside the subset."""
    found = _compiled(expression) if expression is not None else None
    return None if found is None else found[1]


def cel_match(expression: str | None, driver: str, attributes: Mapping[str, object]) -> bool | None:
    """True/False when the expression is in the subset and evaluates without an error
    (``attributes``: ``<domain>/<name>`` -> str, int or bool); None: cannot decide."""
    found = _compiled(expression) if expression is not None else None
    if found is None:
        return None
    value = found[0](driver, attributes)
    return value if isinstance(value, bool) else None
