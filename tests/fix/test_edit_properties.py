"""``envelope fix`` over generated manifests written in many styles: the rewritten file
reads back as the objects with Envelope's patch applied (by the ``jsonpatch`` library,
not by Envelope), every line outside what the patch touches is byte-identical, and a
second run changes nothing."""

from __future__ import annotations

import difflib
import json
from random import Random
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from app.cluster.static import Loaded, compose, load_text
from app.cluster.yamlk8s import build
from app.core.config import Policy, load_policy
from app.core.ruleset import default_ruleset
from app.fix.edit import fix_text, patches, with_memory_action
from tests.conftest import workload
from tests.helpers.workloads import KINDS, containers

RULES = default_ruleset()
POLICY = load_policy(None, None, RULES)


@st.composite
def objects(draw: st.DrawFn, apart: bool = False) -> dict[str, Any]:
    kind = draw(st.sampled_from(KINDS))
    obj = workload(kind, draw(containers("c", apart)), draw(containers("init", apart)) or None)
    if draw(st.booleans()):
        obj["metadata"]["labels"] = {"app": "web", "tier": draw(st.sampled_from(["a", "b c"]))}
    return obj


# --- writing YAML in a drawn style --------------------------------------------------------

def _reads(snippet: str, expected: Any) -> bool:
    try:
        node = compose(snippet)
        return node is not None and build(node) == expected
    except Exception:
        return False


def scalar(rnd: Random, value: Any, flow: bool) -> str:
    if not isinstance(value, str):
        return json.dumps(value)
    style = rnd.choice(["plain", "single", "double"])
    probe = f"k: {{x: {value}}}" if flow else f"k: {value}"
    if style == "plain" and value and _reads(probe, {"k": {"x": value}} if flow else {"k": value}):
        return value
    if style == "single":
        return "'" + value.replace("'", "''") + "'"
    return json.dumps(value)


def flow(rnd: Random, value: Any) -> str:
    if isinstance(value, dict):
        sep = rnd.choice([", ", ",  ", ","])
        inner = sep.join(f"{k}: {flow(rnd, v)}" for k, v in value.items())
        return "{" + inner + "}" if rnd.random() < 0.5 or not inner else "{ " + inner + " }"
    if isinstance(value, list):
        return "[" + ", ".join(flow(rnd, v) for v in value) + "]"
    return scalar(rnd, value, True)


def comment(rnd: Random) -> str:
    return rnd.choice(["", "", "  # why", "   # aligned: note"])


def block_map(rnd: Random, value: dict[str, Any], indent: int, step: int) -> list[str]:
    lines = []
    width = max((len(k) for k in value), default=0)
    align = rnd.random() < 0.5
    for key, v in value.items():
        pad = " " * (width - len(key) + 1) if align else " "
        if rnd.randint(0, 5) == 0:
            lines.append(" " * indent + "# a comment line")
        head = " " * indent + f"{key}:"
        if isinstance(v, dict) and v and rnd.randint(0, 3):
            lines.append(head + comment(rnd))
            lines += block_map(rnd, v, indent + step, step)
        elif isinstance(v, list) and v and all(isinstance(i, dict) and i for i in v) \
                and rnd.randint(0, 3):
            lines.append(head + comment(rnd))
            dash = indent + rnd.choice([0, step])
            for item in v:
                if rnd.randint(0, 4) == 0:
                    lines.append(" " * dash + "- " + flow(rnd, item))
                    continue
                inner = block_map(rnd, item, dash + 2, step)
                first = next(i for i, line in enumerate(inner) if not line.lstrip().startswith("#"))
                inner[first] = " " * dash + "- " + inner[first][dash + 2:]
                lines += inner[first:] if first else inner
        else:
            lines.append(head + pad + flow(rnd, v) if isinstance(v, dict | list)
                         else head + pad + scalar(rnd, v, False) + comment(rnd))
    return lines


@st.composite
def manifest_files(draw: st.DrawFn, apart: bool = False) -> tuple[str, list[dict[str, Any]]]:
    objs = draw(st.lists(objects(apart), min_size=1, max_size=3))
    style = draw(st.randoms(use_true_random=False))  # layout choices: cheap, and reproducible
    if len(objs) == 1 and style.randint(0, 3) == 0:
        indent = style.choice([None, 1, 2, 4])
        return json.dumps(objs[0], indent=indent) + "\n", objs
    step = style.choice([2, 4])
    if style.randint(0, 4) == 0:  # a List document: the objects are its items
        lines = block_map(style, {"apiVersion": "v1", "kind": "List", "items": objs}, 0, step)
        return "\n".join(lines) + "\n", objs
    docs = []
    for obj in objs:
        lines = block_map(style, obj, 0, step)
        docs.append("\n".join(lines) + "\n")
    head = style.choice(["", "---\n", "# generated\n---\n"])
    return head + "---\n".join(docs), objs


# --- which lines a patch may touch ----------------------------------------------------------

def _lines(node: Node) -> set[int]:
    end = node.end_mark.line - (1 if node.end_mark.column == 0 and node.end_mark.line
                                > node.start_mark.line else 0)
    return set(range(node.start_mark.line, end + 1))


def touched_lines(doc_text: str, first_line: int, patch: list[dict[str, Any]],
                  item: int | None = None) -> set[int]:
    """Lines of the original file an operation may change: the pair it removes or replaces
    (and the key holding its mapping, which may become ``key: {}``), the flow mapping it
    adds to, or the line a block mapping's new pair follows."""
    root = compose(doc_text)
    if item is not None:
        assert isinstance(root, MappingNode)
        items = next(v for k, v in root.value if k.value == "items")
        root = items.value[item]
    out: set[int] = set()
    for op in patch:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"][1:].split("/")]
        node, holder_key = root, None
        for token in tokens[:-1]:
            if isinstance(node, MappingNode):
                pair = next(((k, v) for k, v in node.value if k.value == token), None)
                assert pair is not None
                holder_key, node = pair
            else:
                assert isinstance(node, SequenceNode)
                node = node.value[int(token)]
        assert isinstance(node, MappingNode)
        if holder_key is not None:
            out.add(holder_key.start_mark.line)
        pair = next(((k, v) for k, v in node.value if k.value == tokens[-1]), None)
        if node.flow_style:
            out |= _lines(node)
        elif pair is not None:
            out |= _lines(pair[0]) | _lines(pair[1])
        if pair is None and node.value:
            out |= _lines(node.value[-1][1])
    return {first_line + n for n in out}


def _read(text: str) -> Loaded:
    out = Loaded()
    load_text(text, "gen.yaml", out, skip_non_objects=False)
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifest_files())
def test_fix_writes_exactly_the_patch(case: tuple[str, list[dict[str, Any]]]) -> None:
    _writes_exactly_the_patch(case, POLICY)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifest_files(apart=True), st.sampled_from(["raise-request", "lower-limit"]))
def test_fix_memory_writes_exactly_the_patch(case: tuple[str, list[dict[str, Any]]],
                                             action: str) -> None:
    """``envelope fix --memory``: the same, over memory requests apart from their limits."""
    _writes_exactly_the_patch(case, with_memory_action(POLICY, action))


def _writes_exactly_the_patch(case: tuple[str, list[dict[str, Any]]], policy: Policy) -> None:
    text, objs = case
    loaded = _read(text)
    assert not loaded.errors, loaded.errors
    assert [m.obj for m in loaded.manifests] == objs  # the generator writes what it means
    found = patches(loaded.manifests, RULES, policy)
    result = fix_text(text, "gen.yaml", found)
    assert not result.problems, (result.problems, text)
    again = _read(result.fixed)
    assert [m.obj for m in again.manifests] == [
        jsonpatch.apply_patch(o, p) for o, p in zip(objs, found, strict=True)]
    allowed: set[int] = set()
    for m, p in zip(loaded.manifests, found, strict=True):
        if p:
            assert m._doc is not None
            allowed |= touched_lines(m._doc.text, m._doc.first_line, p, m.item)
    old, new = text.splitlines(keepends=True), result.fixed.splitlines(keepends=True)
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            assert set(range(i1, i2)) <= allowed, (tag, old[i1:i2], text, result.fixed)
    assert result.changed == sum(bool(p) for p in found)
    # idempotent: the fixed file needs no change
    assert not any(patches(again.manifests, RULES, policy))
    assert fix_text(result.fixed, "gen.yaml", [[] for _ in again.manifests]).fixed == result.fixed


# --- anchors and aliases (issue 37) ------------------------------------------------------

def _value_scalars(node: Node, under: bool, out: list[Node]) -> None:
    """The scalar values of mappings inside a ``resources`` mapping, in text order."""
    if isinstance(node, MappingNode):
        for k, v in node.value:
            inside = under or k.value == "resources"
            if inside and isinstance(v, ScalarNode) and v.style not in ("|", ">") and under:
                out.append(v)
            _value_scalars(v, inside, out)
    elif isinstance(node, SequenceNode):
        for v in node.value:
            _value_scalars(v, under, out)


def anchored(rnd: Random, text: str) -> str:
    """``text`` with equal resource quantities written once with an anchor (``&aN``) and
    then as aliases (``*aN``), document by document, as a person writing request == limit
    might."""
    out = []
    for doc in text.split("---\n"):
        root = compose(doc) if doc.strip() else None
        scalars: list[Node] = []
        if root is not None:
            _value_scalars(root, False, scalars)
        groups: dict[str, list[Node]] = {}
        for s in scalars:
            groups.setdefault(doc[s.start_mark.index:s.end_mark.index], []).append(s)
        edits: list[tuple[int, int, str]] = []
        for n, nodes in enumerate(groups.values()):
            if len(nodes) < 2 or not rnd.randint(0, 3):
                continue
            first, *rest = nodes
            edits.append((first.start_mark.index, first.start_mark.index, f"&a{n} "))
            edits += [(s.start_mark.index, s.end_mark.index, f"*a{n}") for s in rest]
        for start, end, new in sorted(edits, reverse=True):
            doc = doc[:start] + new + doc[end:]
        out.append(doc)
    return "---\n".join(out)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifest_files(), st.randoms(use_true_random=False))
def test_fix_with_anchors_writes_the_patch_or_refuses_clearly(
        case: tuple[str, list[dict[str, Any]]], rnd: Random) -> None:
    """Aliased quantities never make ``fix`` write a value into the anchor's place: the
    result reads back as the patch applied, or the file is refused because the patch
    changes a value shared through an anchor (never "a bug of envelope fix")."""
    plain, objs = case
    if plain.lstrip().startswith(("{", "[")):
        return  # JSON has no anchors
    text = anchored(rnd, plain)
    loaded = _read(text)
    assert not loaded.errors, loaded.errors
    assert [m.obj for m in loaded.manifests] == objs
    found = patches(loaded.manifests, RULES, POLICY)
    result = fix_text(text, "gen.yaml", found)
    if result.problems:
        assert all("shared through a YAML anchor" in p for p in result.problems), \
            (result.problems, text)
        return
    again = _read(result.fixed)
    assert [m.obj for m in again.manifests] == [
        jsonpatch.apply_patch(o, p) for o, p in zip(objs, found, strict=True)], (text, result.fixed)
    assert not any(patches(again.manifests, RULES, POLICY))


def test_fix_places_a_request_beside_an_alias_not_at_its_anchor() -> None:
    """Issue 37 class 5, the exact shape: ``memory: &mem 1Gi`` under limits and
    ``memory: *mem`` under requests; the CPU limit moves to ``requests``."""
    text = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: shop\n"
        "spec:\n  selector:\n    matchLabels: {app: web}\n  template:\n"
        "    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n"
        "      - name: web\n        image: nginx\n        resources:\n          limits:\n"
        "            cpu: 500m\n            memory: &mem 1Gi\n          requests:\n"
        "            memory: *mem\n")
    loaded = _read(text)
    found = patches(loaded.manifests, RULES, POLICY)
    assert any(op["path"].endswith("/requests/cpu") for op in found[0]), found
    result = fix_text(text, "gen.yaml", found)
    assert not result.problems, result.problems
    assert ("          limits:\n            memory: &mem 1Gi\n          requests:\n"
            "            memory: *mem\n            cpu: 500m\n") in result.fixed, result.fixed
    # the same in flow style: the pair goes after the alias, inside the braces
    flow_text = text.replace("          limits:\n            cpu: 500m\n            memory: &mem 1Gi\n"
                             "          requests:\n            memory: *mem\n",
                             "          limits: {cpu: 500m, memory: &mem 1Gi}\n"
                             "          requests: {memory: *mem}\n")
    loaded = _read(flow_text)
    result = fix_text(flow_text, "gen.yaml", patches(loaded.manifests, RULES, POLICY))
    assert not result.problems, result.problems
    assert "requests: {memory: *mem, cpu: 500m}" in result.fixed, result.fixed
