"""``envelope fix``: rewrite manifest files so they are what Envelope would store.

Each object is judged as ``envelope check`` judges it (:class:`app.core.frontdoor.FrontDoor`
over a :class:`~app.cluster.view.StaticView` of every input file), and the mutate
phase's RFC 6902 patch is applied to the *text*, not to a re-serialised document: the
file is composed with the parser ``check`` reads it with (libyaml's node marks, see
:mod:`app.cluster.static`), the node each operation names is found, and only its bytes
change (``replace``: the scalar's span in its own style; ``remove``: the key's line(s),
or the pair and one comma in flow style; ``add``: a new line at the siblings'
indentation, or ``, key: value``). Before anything is written the new text is read back
as ``check`` reads it and must give exactly the old objects with their patches applied;
a file where that fails is refused, never written. What each edit writes, what is
refused (templates, merge keys) and why: docs/gitops.md, "envelope fix".

Why one module of ~970 lines: every function here works on the same three things, the
libyaml marks of one document's nodes, the text they point into and one JSON-pointer
operation, and each edit (replace, remove, add) must leave text that the read-back at the
end turns into the same objects plus the patch. Split, that one invariant would span
modules that only make sense read together.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from app.cluster.fieldschema import default_schema
from app.cluster.static import (
    Loaded,
    Manifest,
    Skipped,
    _walk_dir,
    compose,
    decode,
    load_text,
    split_documents,
)
from app.cluster.view import StaticView
from app.cluster.yamlk8s import YamlValueError, build
from app.core.config import MemoryBelowLimit, Mode, Policy
from app.core.frontdoor import DEFAULT_NAMESPACE, FrontDoor, Judged, placed
from app.core.ruleset import RuleSet
from app.k8s.jsonpatch import escape
from app.k8s.jsonpatch import tokens as pointer_tokens
from app.k8s.util import visible

__all__ = ["MEMORY_ACTIONS", "FileFix", "FixError", "apply_patch", "fix_paths", "fix_text",
           "patch_items", "patch_text", "patches", "run_fix", "with_memory_action"]

def template_advice(source: str) -> str:
    """Why a file that does not read as YAML and holds ``{{`` is refused: it looks like an
    unrendered template. A rendered stream (a post-renderer's input) holds ``{{`` only
    inside string values (Jinja chat templates, alert templates), which read fine; so
    this is said only when the text does not read, and never recommends the command that
    was just run."""
    if source == "<stdin>":
        return ("the input does not read as YAML and holds '{{', as an unrendered template "
                "does: give `envelope fix -` the rendered output (`helm template` renders "
                "a chart; as `helm install --post-renderer` it receives rendered manifests)")
    return ("the file does not read as YAML and holds '{{', as a Helm template does: for a "
            "Helm chart fix its values files instead, or fix the rendered output (`helm "
            "template … | envelope fix -`, or `envelope fix -` as a `helm install "
            "--post-renderer`); render other templates first and fix what they produce")


MEMORY_ACTIONS = ("raise-request", "lower-limit")
"""``envelope fix --memory``: what to write where a memory request is below its limit."""


def with_memory_action(policy: Policy, action: str | None) -> Policy:
    """The policy ``envelope fix`` judges with: ``memory-below-limit`` in every namespace
    with ``action`` (and enforced), or nowhere when no action is given — never implicit,
    whatever the policy's ``memoryBelowLimit`` says."""
    if action is None:
        return policy.model_copy(update={"memory_below_limit": None})
    choice = MemoryBelowLimit.model_validate({"action": action, "namespaces": ["*"]})
    return policy.model_copy(update={"memory_below_limit": choice,
                                     "rules": {**policy.rules, "memory-below-limit": Mode.ENFORCE}})


class FixError(ValueError):
    """An operation that cannot be written into the text without re-serialising it."""


# --- the patch on objects (RFC 6902 add/remove/replace: what app.k8s.jsonpatch.diff emits) ---

def _tokens(pointer: str) -> list[str]:
    try:
        return pointer_tokens(pointer)
    except ValueError as exc:
        raise FixError(str(exc)) from None


def _step(doc: Any, token: str) -> Any:
    if isinstance(doc, list):
        return doc[int(token)]
    return doc[token]


def apply_patch(doc: Any, patch: Iterable[dict[str, Any]]) -> Any:
    """``doc`` with ``patch`` applied (a deep copy; ``doc`` is not changed)."""
    out = json.loads(json.dumps(doc))
    for op in patch:
        tokens = _tokens(op["path"])
        if not tokens:
            if op["op"] in ("add", "replace"):
                out = json.loads(json.dumps(op["value"]))
                continue
            raise FixError("cannot remove the whole document")
        parent = out
        for token in tokens[:-1]:
            parent = _step(parent, token)
        last = tokens[-1]
        if op["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        elif op["op"] in ("add", "replace"):
            value = json.loads(json.dumps(op["value"]))
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if op["op"] == "add":
                    parent.insert(index, value)
                else:
                    parent[index] = value
            else:
                parent[last] = value
        else:
            raise FixError(f"unsupported patch operation {op['op']!r}")
    return out


# --- rendering values as YAML text ------------------------------------------------------

def _reads_as(snippet: str, expected: Any) -> bool:
    """Whether the one-key document ``snippet`` reads (as kubectl reads it) as ``expected``."""
    try:
        node = compose(snippet)
        return node is not None and build(node) == expected
    except (yaml.YAMLError, YamlValueError, RecursionError):
        return False


_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff\ufffe\uffff]")
"""What JSON leaves raw but a YAML stream may not hold (YAML 1.2 "c-printable"; go-yaml's
and PyYAML's readers refuse it): written inside double quotes as a ``\\u`` escape with
four hex digits (U+0085 as ``\\u0085``)."""


def _quoted(value: Any) -> str:
    """A double-quoted YAML scalar (JSON's escapes are YAML's), every character a YAML
    reader accepts: a name with control characters reads back as itself."""
    text = json.dumps(value, ensure_ascii=False)
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _scalar(value: Any, *, flow: bool, json_style: bool, style: str | None = None) -> str:
    """``value`` (a JSON scalar) as YAML text: plain when it reads back as the same value,
    else in the quoting ``style`` given (``'`` or ``"``), else double-quoted."""
    if not isinstance(value, str) or json_style:
        return _quoted(value)
    if style == "'" and "\n" not in value and value.isprintable():
        return "'" + value.replace("'", "''") + "'"
    if not style and value and value.strip() == value and "\n" not in value and "#" not in value:
        probe = f"k: {{x: {value}}}" if flow else f"k: {value}"
        if _reads_as(probe, {"k": {"x": value}} if flow else {"k": value}):
            return value
    return _quoted(value)


def _key(key: str, *, json_style: bool) -> str:
    if json_style:
        return _quoted(key)
    if key and ":" not in key and key.strip() == key and _reads_as(f"{key}: 1", {key: 1}):
        return key
    return _quoted(key)


def _flow(value: Any, *, json_style: bool) -> str:
    if isinstance(value, dict):
        pairs = ", ".join(f"{_key(k, json_style=json_style)}: {_flow(v, json_style=json_style)}"
                          for k, v in value.items())
        return "{" + pairs + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v, json_style=json_style) for v in value) + "]"
    return _scalar(value, flow=True, json_style=json_style)


def _block_pair(key: str, value: Any, indent: int, step: int, nl: str) -> str:
    """``key: value`` as block YAML lines starting at column ``indent`` (no final newline)."""
    pad = " " * indent
    head = f"{pad}{_key(key, json_style=False)}:"
    if isinstance(value, dict) and value:
        return head + nl + nl.join(_block_pair(k, v, indent + step, step, nl)
                                   for k, v in value.items())
    if isinstance(value, list) and value:
        items = []
        for v in value:
            if isinstance(v, dict) and v:
                lines = [_block_pair(k, x, indent + step + 2, step, nl) for k, x in v.items()]
                lines[0] = " " * (indent + step) + "- " + lines[0].lstrip(" ")
                items.append(nl.join(lines))
            else:
                items.append(" " * (indent + step) + "- " + _flow(v, json_style=False))
        return head + nl + nl.join(items)
    if isinstance(value, dict | list):
        return head + " " + _flow(value, json_style=False)
    return head + " " + _scalar(value, flow=False, json_style=False)


# --- finding nodes ---------------------------------------------------------------------

@dataclass
class _Located:
    parent: Node
    key: Node | None
    """The key node when the parent is a mapping."""
    node: Node | None
    """The value node; None for an add of a key that is not there."""
    index: int | None = None


def _pair_of(mapping: MappingNode, token: str) -> tuple[Node, Node] | None:
    found = None
    for k, v in mapping.value:
        if isinstance(k, ScalarNode) and k.value == "<<":
            raise FixError("the mapping uses a merge key (<<); fix it by hand")
        if isinstance(k, ScalarNode) and k.value == token:
            found = (k, v)  # the last of duplicates, as go-yaml's map keeps it
    return found


def _shared(root: Node) -> set[int]:
    """The nodes reached more than once: an anchor (``&x``) and its aliases (``*x``)."""
    seen: set[int] = set()
    shared: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            shared.add(id(node))
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            todo.extend(n for pair in node.value for n in pair)
        elif isinstance(node, SequenceNode):
            todo.extend(node.value)
    return shared


ALIAS = "the value is shared through a YAML anchor (&) and alias (*): changing it here " \
        "would change every place that refers to it; fix it by hand"


def _locate(root: Node, tokens: list[str], shared: set[int] | None = None) -> _Located:
    """The node ``tokens`` name under ``root``; ``shared``: the nodes reached more than
    once in the whole document (a List item's node may be aliased from another item)."""
    if shared is None:
        shared = _shared(root)
    node: Node = root
    for token in tokens[:-1]:
        if id(node) in shared:
            raise FixError(ALIAS)
        if isinstance(node, MappingNode):
            pair = _pair_of(node, token)
            if pair is None:
                raise FixError(f"no key {token!r} in the text")
            node = pair[1]
        elif isinstance(node, SequenceNode) and token.isdigit() and int(token) < len(node.value):
            node = node.value[int(token)]
        else:
            raise FixError(f"cannot follow {token!r} in the text")
    last = tokens[-1]
    if id(node) in shared:
        raise FixError(ALIAS)
    if isinstance(node, MappingNode):
        pair = _pair_of(node, last)
        if pair is not None and id(pair[1]) in shared:
            raise FixError(ALIAS)
        return _Located(node, pair[0] if pair else None, pair[1] if pair else None)
    if isinstance(node, SequenceNode):
        if last == "-":
            return _Located(node, None, None, len(node.value))
        i = int(last)
        return _Located(node, None, node.value[i] if i < len(node.value) else None, i)
    raise FixError("the parent is not a mapping or a list in the text")


# --- text surgery -------------------------------------------------------------------------

def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def _line_end(text: str, i: int) -> int:
    """Index just past the newline of the line holding ``i`` (or the text's end)."""
    j = text.find("\n", i)
    return len(text) if j < 0 else j + 1


def _content_end(text: str, node: Node) -> int:
    """Index just past the node's last character that is not a blank or a line break
    (a block collection's end mark is where the next token starts)."""
    end: int = node.end_mark.index
    while end > node.start_mark.index and text[end - 1] in " \t\r\n":
        end -= 1
    return end


def _is_alias(key: Node, value: Node) -> bool:
    """Whether ``value`` is written here as an alias (``*name``): the composer hands back
    the anchored node, whose marks point at the anchor, which YAML puts before any of its
    aliases, so the value "starts" before its own key ends."""
    return value.start_mark.index < key.end_mark.index


_ALIAS_END = frozenset(" \t\r\n,[]{}")


def _alias_end(text: str, key: Node) -> int:
    """Index just past the ``*name`` written as the value of ``key``."""
    i = _colon_after(text, key)
    while i < len(text) and text[i] in " \t":
        i += 1
    if not text.startswith("*", i):
        raise FixError("an alias (*) that is not where its key's value is; fix it by hand")
    i += 1
    while i < len(text) and text[i] not in _ALIAS_END:
        i += 1
    return i


def _value_end(text: str, key: Node, value: Node, *, flow: bool) -> int:
    """Index just past the text of ``key``'s value in *this* place: an alias's own
    ``*name``, never the anchored node it names (issue 37: ``memory: *mem`` under
    requests with ``&mem`` under limits placed a new request under limits)."""
    if _is_alias(key, value):
        return _alias_end(text, key)
    return int(value.end_mark.index) if flow else _content_end(text, value)


def _rest_is_comment(text: str, i: int) -> bool:
    """Whether only blanks or a comment follow ``i`` on its line."""
    rest = text[i:_line_end(text, i)].strip()
    return not rest or rest.startswith("#")


def _only_on_line(text: str, i: int) -> bool:
    return not text[_line_start(text, i):i].strip()


def _colon_after(text: str, key: Node) -> int:
    i = text.index(":", key.end_mark.index)
    return i + 1


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _indent_step(text: str, mapping: MappingNode) -> int:
    """Indentation of nested block mappings in this document (2 when none is nested)."""
    for k, v in mapping.value:
        if isinstance(v, MappingNode) and not v.flow_style and v.value and not _is_alias(k, v):
            step: int = v.value[0][0].start_mark.column - mapping.value[0][0].start_mark.column
            if step > 0:
                return step
    return 2


def _is_json_style(text: str, mapping: MappingNode) -> bool:
    keys = [k for k, _ in mapping.value if isinstance(k, ScalarNode)]
    return bool(keys) and all(k.style == '"' for k in keys)


def _splice(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _remove(text: str, at: _Located) -> str:
    parent, key, node = at.parent, at.key, at.node
    if node is None:
        raise FixError("nothing to remove")
    if isinstance(parent, SequenceNode):
        raise FixError("removing a list item is not supported in place")
    assert isinstance(parent, MappingNode) and key is not None
    pairs = parent.value
    i = next(n for n, (k, _) in enumerate(pairs) if k is key)
    if len(pairs) == 1:
        if parent.flow_style:
            return _splice(text, parent.start_mark.index, parent.end_mark.index, "{}")
        raise _EmptyBlock()
    if parent.flow_style:
        if i + 1 < len(pairs):
            return _splice(text, key.start_mark.index, pairs[i + 1][0].start_mark.index, "")
        prev_end = _value_end(text, pairs[i - 1][0], pairs[i - 1][1], flow=True)
        return _splice(text, prev_end, node.end_mark.index, "")
    start, end = key.start_mark.index, _content_end(text, node)
    if _only_on_line(text, start) and _rest_is_comment(text, end):
        return _splice(text, _line_start(text, start), _line_end(text, end), "")
    if i + 1 < len(pairs):
        return _splice(text, start, pairs[i + 1][0].start_mark.index, "")
    raise FixError("the key shares its line with another; fix it by hand")


class _EmptyBlock(FixError):
    """Removing the only pair of a block mapping: the mapping's own key becomes ``{}``."""


def _remove_only_pair(text: str, holder: _Located, at: _Located) -> str:
    """``limits:\\n  cpu: 1`` -> ``limits: {}``: the pair's lines go, and the mapping that
    held it is written as the empty mapping the patch leaves."""
    assert at.key is not None and at.node is not None
    start, end = at.key.start_mark.index, _content_end(text, at.node)
    if not (_only_on_line(text, start) and _rest_is_comment(text, end)):
        raise FixError("the key shares its line with another; fix it by hand")
    out = _splice(text, _line_start(text, start), _line_end(text, end), "")
    if holder.key is not None:
        colon = _colon_after(out, holder.key)
        return _splice(out, colon, colon, " {}")
    raise FixError("an emptied mapping inside a list; fix it by hand")


def _add(text: str, at: _Located, token: str, value: Any, reuse: dict[str, str]) -> str:
    parent = at.parent
    if isinstance(parent, SequenceNode):
        raise FixError("adding a list item is not supported in place")
    assert isinstance(parent, MappingNode)
    # keys written as JSON ("key") get JSON; an empty {} follows the document's style
    json_style = _is_json_style(text, parent) if parent.value else _doc_is_json(text)
    if parent.flow_style:
        rendered = _reused(value, reuse, flow=True) or _flow(value, json_style=json_style)
        pair = f"{_key(token, json_style=json_style)}: {rendered}"
        if not parent.value:
            return _splice(text, parent.start_mark.index, parent.end_mark.index, "{" + pair + "}")
        last_key, last_value = parent.value[-1]
        end = _value_end(text, last_key, last_value, flow=True)
        if last_key.start_mark.line != parent.start_mark.line:
            nl = _newline(text)
            return _splice(text, end, end, "," + nl + " " * last_key.start_mark.column + pair)
        return _splice(text, end, end, ", " + pair)
    if not parent.value:
        raise FixError("an empty block mapping")
    nl = _newline(text)
    first_key = parent.value[0][0]
    indent = first_key.start_mark.column
    reused = _reused(value, reuse, flow=False)
    if reused is not None:
        lines = f"{' ' * indent}{_key(token, json_style=False)}: {reused}"
    else:
        lines = _block_pair(token, value, indent, _indent_step(text, parent), nl)
    last_key, last_value = parent.value[-1]
    end = _value_end(text, last_key, last_value, flow=False)
    if not _rest_is_comment(text, end):
        raise FixError("the mapping's last line holds more than its value; fix it by hand")
    at_line = _line_end(text, end)
    if at_line == len(text) and not text.endswith("\n"):
        return text + nl + lines
    return _splice(text, at_line, at_line, lines + nl)


def _doc_is_json(text: str) -> bool:
    return text.lstrip().startswith(("{", "["))


def _reused(value: Any, reuse: dict[str, str], *, flow: bool) -> str | None:
    """The text a removed scalar of the same value was written with, when it reads back
    as ``value`` in its new place."""
    if isinstance(value, dict | list):
        return None
    raw = reuse.get(json.dumps(value))
    if raw is None:
        return None
    probe = f"k: {{x: {raw}}}" if flow else f"k: {raw}"
    return raw if _reads_as(probe, {"k": {"x": value}} if flow else {"k": value}) else None


def _replace(text: str, at: _Located, value: Any) -> str:
    node = at.node
    if node is None:
        raise FixError("nothing to replace")
    if isinstance(node, ScalarNode) and not isinstance(value, dict | list):
        if node.style in ("|", ">"):
            raise FixError("a block scalar; fix it by hand")
        flow = isinstance(at.parent, MappingNode | SequenceNode) and bool(at.parent.flow_style)
        json_style = flow and _doc_is_json(text)
        rendered = _scalar(value, flow=flow, json_style=json_style, style=node.style)
        start, end = node.start_mark.index, node.end_mark.index
        if start == end and at.key is not None:  # an empty value: `key:`
            colon = _colon_after(text, at.key)
            return _splice(text, colon, colon, " " + rendered)
        return _splice(text, start, end, rendered)
    json_style = _doc_is_json(text)
    rendered = _flow(value, json_style=json_style)
    if isinstance(node, ScalarNode) and node.start_mark.index == node.end_mark.index \
            and at.key is not None:
        colon = _colon_after(text, at.key)
        return _splice(text, colon, colon, " " + rendered)
    if isinstance(node, ScalarNode) or getattr(node, "flow_style", False):
        return _splice(text, node.start_mark.index, node.end_mark.index, rendered)
    raise FixError("replacing a block collection is not supported in place")


def patch_text(text: str, patch: list[dict[str, Any]], item: int | None = None) -> str:
    """One YAML or JSON document's text with ``patch`` written into it (``item``: the
    object is ``items[item]`` of a List document). Raises :class:`FixError`."""
    if item is not None:
        out, failed = patch_items(text, {item: patch})
        if failed:
            raise failed[item]
        return out
    reuse: dict[str, str] = {}
    grouped = _patch_by_item(text, patch) if len(patch) > 2 else None
    if grouped is not None:
        text, patch = grouped
    for op in patch:
        root = compose(text)
        if root is None:
            raise FixError("an empty document")
        text = _apply_op(text, root, op, reuse)
    return text


def _item_of(root: Node, tokens: list[str]) -> tuple[tuple[str, ...], Node] | None:
    """The first list item on the way to ``tokens`` (its path and node) when the
    operation is inside it (not on the list or the item itself)."""
    node: Node = root
    for k, token in enumerate(tokens[:-1]):
        if isinstance(node, SequenceNode):
            if node.flow_style or not token.isdigit() or int(token) >= len(node.value):
                return None  # a flow list's items are not lines of their own
            return (tuple(tokens[:k + 1]), node.value[int(token)]) if k + 1 < len(tokens) else None
        if not isinstance(node, MappingNode):
            return None
        pair = _pair_of(node, token)
        if pair is None:
            return None
        node = pair[1]
    return None


def _patch_by_item(text: str, patch: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]] | None:
    """The operations inside list items (a container's, a queue entry's) written item by
    item, each item cut out as a document of its own and composed once per operation
    on it alone, last item first so the offsets of the others hold: ``fix`` and
    ``krm-fn`` linear in the operations of one object (issue 38, class 7: a Deployment
    of 1,000 containers recomposed the whole document for each of its 2,000
    operations, 162 s). Operations on different items commute; those outside every
    item are returned to be applied after, in their order. None (apply one by one)
    when that would not give the same text: an operation on a list that holds
    an item or on an ancestor of one, anchors and aliases, or an item that cannot be
    cut out."""
    root = compose(text)
    if root is None:
        return None
    try:
        paths = [_tokens(op["path"]) for op in patch]
    except (FixError, KeyError, TypeError):
        return None
    groups: dict[tuple[str, ...], tuple[Node, list[dict[str, Any]]]] = {}
    rest: list[tuple[list[str], dict[str, Any]]] = []
    for tokens, op in zip(paths, patch, strict=True):
        found = _item_of(root, tokens) if tokens else None
        if found is None:
            rest.append((tokens, op))
            continue
        prefix, node = found
        groups.setdefault(prefix, (node, []))[1].append(
            {**op, "path": "/" + "/".join(escape(t) for t in tokens[len(prefix):])})
    if not groups:
        return None
    for tokens, _ in rest:
        for prefix in groups:
            n = len(tokens)
            if tuple(tokens) == prefix[:n] or (n == len(prefix) and tuple(tokens[:-1]) == prefix[:-1]
                                               and tokens[-1] != "-"):
                return None
    if _shared(root):  # an anchor may be defined in one item and aliased in another
        return None
    cuts = []
    for node, ops in groups.values():
        cut = _item_text(text, node)
        if cut is None:
            return None
        cuts.append((cut, ops))
    for (start, end, column, item), ops in sorted(cuts, key=lambda c: c[0][0], reverse=True):
        new = patch_text(item + "\n", ops)
        lines = new.removesuffix("\n").split("\n")
        lines[1:] = [" " * column + line if line else line for line in lines[1:]]
        text = text[:start] + "\n".join(lines) + text[end:]
    return text, [op for _, op in rest]


def _apply_op(text: str, root: Node, op: dict[str, Any], reuse: dict[str, str],
              shared: set[int] | None = None) -> str:
    tokens = _tokens(op["path"])
    if not tokens:
        raise FixError("the patch replaces the whole object")
    at = _locate(root, tokens, shared)
    kind = op["op"]
    if kind == "remove":
        node = at.node
        if isinstance(node, ScalarNode) and node.style not in ("|", ">"):
            built = build(node)
            reuse.setdefault(json.dumps(built), text[node.start_mark.index:node.end_mark.index])
        try:
            return _remove(text, at)
        except _EmptyBlock:
            holder = _locate(root, tokens[:-1], shared) if len(tokens) > 1 else _Located(root, None, root)
            return _remove_only_pair(text, holder, at)
    if kind == "add" and at.node is None and isinstance(at.parent, MappingNode):
        return _add(text, at, tokens[-1], op["value"], reuse)
    if kind in ("replace", "add"):
        return _replace(text, at, op["value"])
    raise FixError(f"unsupported patch operation {kind!r}")


_ERRORS = (FixError, yaml.YAMLError, YamlValueError, StopIteration, ValueError, IndexError,
           KeyError)


def _item_text(text: str, node: Node) -> tuple[int, int, int, str] | None:
    """(start, end, column, text) of one list item written as a document of its own (its
    lines after the first dedented by its column); None when its lines do not all carry
    that indentation, so dedenting would not be exact."""
    start, end, column = node.start_mark.index, _content_end(text, node), node.start_mark.column
    lines = text[start:end].split("\n")
    pad = " " * column
    out = [lines[0]]
    for line in lines[1:]:
        if not line:
            out.append(line)
        elif line.startswith(pad) and line.strip():
            out.append(line[column:])
        else:
            return None
    return start, end, column, "\n".join(out)


def _patch_item_in_place(text: str, patch: list[dict[str, Any]], item: int) -> str:
    """``items[item]`` patched within the whole document, composed again for each
    operation (the slow way, for items that cannot be cut out as documents)."""
    reuse: dict[str, str] = {}
    for op in patch:
        root = compose(text)
        pair = _pair_of(root, "items") if isinstance(root, MappingNode) else None
        if root is None or pair is None or not isinstance(pair[1], SequenceNode) \
                or item >= len(pair[1].value):
            raise FixError("the List's items are not where they were")
        text = _apply_op(text, pair[1].value[item], op, reuse, _shared(root))
    return text


def patch_items(text: str, patches: dict[int, list[dict[str, Any]]]
                ) -> tuple[str, dict[int, Exception]]:
    """A document whose ``items`` (a List, a KRM ResourceList) get ``patches[i]`` each:
    the document is composed once and each item's text is patched as a document of its
    own, last item first (so the offsets of the others hold). Returns the text and the
    items that could not be patched (left as they were), with why."""
    failed: dict[int, Exception] = {}
    root = compose(text)
    pair = _pair_of(root, "items") if isinstance(root, MappingNode) else None
    items = pair[1] if pair else None
    if not isinstance(items, SequenceNode):
        return text, {i: FixError("the List's items are not where they were") for i in patches}
    aliased = root is not None and bool(_shared(root))
    for i in sorted(patches, reverse=True):
        if not patches[i]:
            continue
        if i >= len(items.value):
            failed[i] = FixError("the List's items are not where they were")
            continue
        node = items.value[i]
        # an item cut out as a document of its own loses the anchors and aliases that
        # tie it to other items: with any in the document, patch it in place
        found = _item_text(text, node) if not items.flow_style and not aliased else None
        if found is None:  # a flow list, or lines not indented alike: in the whole document
            try:
                text = _patch_item_in_place(text, patches[i], i)
            except _ERRORS as exc:
                failed[i] = exc
            continue
        start, end, column, item = found
        try:  # as a document of its own, the item ends with its line
            new = patch_text(item + "\n", patches[i])
        except _ERRORS as exc:
            failed[i] = exc
            continue
        lines = new.removesuffix("\n").split("\n")
        lines[1:] = [" " * column + line if line else line for line in lines[1:]]
        text = text[:start] + "\n".join(lines) + text[end:]
    return text, failed


# --- files ----------------------------------------------------------------------------

@dataclass
class FileFix:
    source: str
    original: str
    fixed: str
    objects: int = 0
    changed: int = 0
    """Objects whose patch was written."""
    problems: list[str] = field(default_factory=list)
    """Why the file is refused (nothing is written when there is any)."""
    skipped: list[str] = field(default_factory=list)
    """Objects left as they are because ``envelope check`` refuses them for their fields."""

    @property
    def changes(self) -> bool:
        return self.fixed != self.original

    def diff(self) -> str:
        name = self.source
        return "".join(difflib.unified_diff(self.original.splitlines(keepends=True),
                                            self.fixed.splitlines(keepends=True),
                                            name, name))


def _documents(text: str) -> list[tuple[int, int, str]]:
    """(start offset, first line, text) of every document, as :func:`split_documents`
    splits them."""
    out = []
    pos = 0
    for first_line, chunk, problem in split_documents(text):
        if problem or not chunk:
            continue
        start = text.index(chunk, pos)
        out.append((start, first_line, chunk))
        pos = start + len(chunk)
    return out


def _loaded(text: str, source: str) -> Loaded:
    """The file's objects as ``envelope check`` reads them: a file none of whose documents
    is an API object (a values file, CI configuration) has none, and is left alone."""
    out = Loaded()
    load_text(text, source, out, skip_non_objects=source != "<stdin>")
    return out


def _load_problems(source: str, text: str, loaded: Loaded) -> list[str]:
    """Why a file that does not read is refused: the reader's errors, and the template
    advice when the text holds ``{{`` (it comes first: it says what to do)."""
    problems = [str(e) for e in loaded.errors]
    if problems and "{{" in text:
        problems.insert(0, f"{source}: {template_advice(source)}")
    return problems


def _refusal(source: str, m: Manifest, exc: Exception) -> str:
    name = (m.obj.get("metadata") or {}).get("name")
    return (f"{source}:{m.line}: {m.obj.get('kind')} {name}: cannot write the change in place "
            f"({exc}); nothing written")


def fix_text(text: str, source: str, patches: list[list[dict[str, Any]]]) -> FileFix:
    """``text`` with ``patches[i]`` written into the i-th object :func:`load_text` reads
    from it, verified by reading the result back."""
    result = FileFix(source, text, text)
    loaded = _loaded(text, source)
    if loaded.errors:
        result.problems = _load_problems(source, text, loaded)
        return result
    manifests = loaded.manifests
    result.objects = len(manifests)
    if len(patches) != len(manifests):
        raise ValueError(f"{len(patches)} patches for {len(manifests)} objects")
    if not any(patches):
        return result
    documents = {first_line: (start, chunk) for start, first_line, chunk in _documents(text)}
    edits: dict[int, str] = {}  # document first line -> its new text
    expected = []
    lists: dict[int, list[tuple[Manifest, list[dict[str, Any]]]]] = {}
    for m, patch in zip(manifests, patches, strict=True):
        expected.append(apply_patch(m.obj, patch) if patch else m.obj)
        if not patch:
            continue
        assert m._doc is not None
        first_line = m._doc.first_line
        if m.item is not None:
            lists.setdefault(first_line, []).append((m, patch))
            continue
        try:
            edits[first_line] = patch_text(m._doc.text, patch)
        except _ERRORS as exc:
            result.problems.append(_refusal(source, m, exc))
            continue
        result.changed += 1
    for first_line, entries in lists.items():
        doc_text = documents[first_line][1]
        new, failed = patch_items(doc_text, {m.item: p for m, p in entries if m.item is not None})
        result.problems += [_refusal(source, m, failed[m.item]) for m, _ in entries
                            if m.item in failed]
        result.changed += sum(m.item not in failed for m, _ in entries)
        edits[first_line] = new
    if result.problems:
        return result
    pieces, pos = [], 0
    for first_line, new in sorted(edits.items(), key=lambda e: documents[e[0]][0]):
        start, chunk = documents[first_line]
        pieces += [text[pos:start], new]
        pos = start + len(chunk)
    pieces.append(text[pos:])
    fixed = "".join(pieces)
    back = _loaded(fixed, source)
    if back.errors or [m.obj for m in back.manifests] != expected:
        result.problems = [f"{source}: the rewritten file does not read back as the objects "
                           f"with their patches (a bug of envelope fix; please report it); "
                           f"nothing written"]
        return result
    result.fixed = fixed
    return result


# --- judging ----------------------------------------------------------------------------

def patch_for(judged: Judged) -> list[dict[str, Any]]:
    """The mutate phase's patch of one judged object, as ``envelope check`` computes it;
    none for what the API server refuses before admission, a rule that crashed, or an
    object judged in another form than its file's (a current-format ActorTemplate: no
    actor rule mutates, and a patch of its ``ate.dev`` form would not apply to the file)."""
    result = judged.evaluation
    if result.internal_errors or judged.converted:
        return []
    if any(f.rule == "quantities" and f.severity == "error" for f in result.findings):
        return []
    return list(result.patch or [])


def patches(manifests: list[Manifest], rules: RuleSet, policy: Policy,
            context: Iterable[dict[str, Any]] = ()) -> list[list[dict[str, Any]]]:
    # In the namespace kubectl applies an object written without one to, as `envelope
    # check` places it (offline: default): that namespace's objects and exceptions apply.
    objects = [placed(o, DEFAULT_NAMESPACE) for o in (*context, *(m.obj for m in manifests))]
    door = FrontDoor(rules, StaticView(objects, rules.indexes), policy, objects=objects)
    return [patch_for(door.judge(m.obj)) for m in manifests]


@dataclass
class _Input:
    source: str
    text: str
    problem: str = ""


def _inputs(paths: list[str], exclude: tuple[str, ...], stdin: str | None,
            skipped: list[Skipped]) -> list[_Input]:
    out: list[_Input] = []
    for path in paths:
        if path == "-":
            out.append(_Input("<stdin>", stdin if stdin is not None else decode(sys.stdin.buffer.read())))
            continue
        p = Path(path)
        holder = Loaded()
        files = list(_walk_dir(p, exclude, holder)) if p.is_dir() else [p]
        skipped.extend(holder.skipped)
        for f in files:
            try:
                data = f.read_bytes()
            except OSError as exc:
                out.append(_Input(str(f), "", f"{f}: cannot read: {exc.strerror or exc}"))
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = decode(data)
                out.append(_Input(str(f), text, f"{f}: not UTF-8 text; envelope fix writes "
                                                 f"UTF-8 files only"))
                continue
            if text.startswith("\ufeff"):
                out.append(_Input(str(f), text[1:], f"{f}: starts with a byte-order mark; "
                                                    f"envelope fix writes files without one"))
                continue
            out.append(_Input(str(f), text))
    return out


def fix_paths(paths: list[str], rules: RuleSet, policy: Policy, *,
              exclude: Iterable[str] = (), stdin: str | None = None) -> tuple[list[FileFix], list[Skipped]]:
    """Every input file and what ``envelope fix`` would make of it. The rules see the
    objects of all the files together, as ``envelope check`` does."""
    skipped: list[Skipped] = []
    inputs = _inputs(paths, tuple(exclude), stdin, skipped)
    per_file: list[tuple[_Input, list[Manifest], list[str]]] = []
    for inp in inputs:
        loaded = _loaded(inp.text, inp.source) if not inp.problem else Loaded()
        problems = [inp.problem] if inp.problem else _load_problems(inp.source, inp.text, loaded)
        per_file.append((inp, loaded.manifests, problems))
    refused = {id(m): why for _, ms, problems in per_file if not problems for m in ms
               if (why := field_refusal(m))}
    everything = [m for _, ms, problems in per_file if not problems for m in ms
                  if id(m) not in refused]
    all_patches = patches(everything, rules, policy)
    by_id = {id(m): p for m, p in zip(everything, all_patches, strict=True)}
    results = []
    for inp, manifests, problems in per_file:
        if problems:
            results.append(FileFix(inp.source, inp.text, inp.text, len(manifests), 0, problems))
            continue
        result = fix_text(inp.text, inp.source, [by_id.get(id(m), []) for m in manifests])
        result.skipped = [refused[id(m)] for m in manifests if id(m) in refused]
        results.append(result)
    return results, skipped


def field_refusal(m: Manifest) -> str:
    """Why ``envelope check`` refuses this object for its fields (strict field validation,
    as ``kubectl apply`` does by default; ``app.cluster.fieldschema``), or ``""``: such an object
    is neither patched nor part of the view the rules judge the others against."""
    problems = default_schema().check(m.obj)
    if not problems:
        return ""
    name = (m.obj.get("metadata") or {}).get("name") if isinstance(m.obj.get("metadata"), dict) else None
    first = problems[0]
    said = first.message if first.path in first.message else f"{first.path}: {first.message}"
    more = f"; and {len(problems) - 1} more" if len(problems) > 1 else ""
    return (f"{m.source}:{m.line}: {m.obj.get('kind')} {name}: not changed: `envelope check` "
            f"refuses it for its fields, as kubectl apply does ({said}{more}); fix the field, "
            f"then run envelope fix again")


def run_fix(paths: list[str], rules: RuleSet, policy: Policy, *, mode: str = "write",
            exclude: Iterable[str] = ()) -> int:
    """``envelope fix``. ``mode``: write (in place; ``-`` to stdout), diff (print a unified
    diff, write nothing) or check (write nothing). Exit 0: done, or nothing to change
    (write); 1: some file would change (diff, check); 2: a file was refused or unreadable."""
    results, _ = fix_paths(paths, rules, policy, exclude=exclude)
    refused = [r for r in results if r.problems]
    changing = [r for r in results if r.changes and not r.problems]
    for r in results:
        for problem in r.problems:
            print(f"envelope fix: {visible(str(problem))}", file=sys.stderr)
        for note in r.skipped:
            print(f"envelope fix: {visible(str(note))}", file=sys.stderr)
        if r.problems:
            continue
        if r.source == "<stdin>" and mode == "write":
            sys.stdout.write(r.fixed)
            continue
        if not r.changes:
            continue
        if mode == "diff":
            sys.stdout.write(r.diff())
        elif mode == "check":
            print(f"envelope fix: {visible(r.source)}: {r.changed} object(s) would change", file=sys.stderr)
        else:
            Path(r.source).write_text(r.fixed, encoding="utf-8", newline="")
            print(f"envelope fix: {visible(r.source)}: {r.changed} object(s) changed", file=sys.stderr)
    objects = sum(r.objects for r in results)
    verb = "changed" if mode == "write" else "would change"
    print(f"envelope fix: {len(results)} file(s), {objects} object(s): "
          f"{sum(r.changed for r in changing)} object(s) in {len(changing)} file(s) {verb}"
          + (f", {len(refused)} file(s) refused" if refused else ""), file=sys.stderr)
    if not results:
        print(f"envelope fix: no manifest files found in {visible(' '.join(paths))}", file=sys.stderr)
        return 2
    if refused:
        return 2
    return 1 if changing and mode in ("diff", "check") else 0

