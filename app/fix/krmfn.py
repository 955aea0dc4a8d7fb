"""``envelope krm-fn``: Envelope's mutations as a KRM function (kustomize, kpt).

The KRM Functions Specification (kubernetes-sigs/kustomize ``cmd/config/docs/api-conventions/
functions-spec.md``): the function reads one ``config.kubernetes.io/v1`` ``ResourceList``
on stdin — ``items`` (the resources), ``functionConfig`` (its own configuration object)
— and writes the ResourceList back on stdout, with the items transformed and
``results`` saying what it did (``message``, ``severity`` error/warning/info,
``resourceRef``, ``field.path``); a non-zero exit fails the pipeline.

Each item is judged as ``envelope check`` judges a manifest (:mod:`app.core.frontdoor`; a
current-format ActorTemplate too), against a view of all the items (the objects the build
produces together), and its mutate-phase patch is written into the ResourceList's text
with the same surgery as ``envelope fix`` (:func:`app.fix.edit.patch_text`): the rest of
the stream is passed through as it came, and the result is read back and compared with
the patched objects before it is written.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from yaml.nodes import MappingNode, SequenceNode

from app.cluster.static import compose, decode
from app.cluster.view import StaticView
from app.cluster.yamlk8s import YamlValueError, build
from app.core.config import Policy
from app.core.frontdoor import DEFAULT_NAMESPACE, FrontDoor, placed
from app.core.ruleset import RuleSet
from app.fix.edit import _add, _Located, apply_patch, patch_for, patch_items
from app.k8s.util import visible

__all__ = ["process", "run_krm_fn"]

RESOURCE_LIST = ("config.kubernetes.io/v1", "ResourceList")


def _meta(obj: dict[str, Any], key: str = "metadata") -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _ref(obj: dict[str, Any]) -> dict[str, str]:
    meta = _meta(obj)
    ref = {"apiVersion": str(obj.get("apiVersion", "")), "kind": str(obj.get("kind", "")),
           "name": str(meta.get("name") or "")}
    if meta.get("namespace"):
        ref["namespace"] = str(meta["namespace"])
    return ref


def _file(obj: dict[str, Any]) -> dict[str, Any] | None:
    """Where kustomize/kpt say the item came from (``internal.config.kubernetes.io/path``)."""
    notes = _meta(_meta(obj), "annotations")
    path = notes.get("internal.config.kubernetes.io/path") or notes.get("config.kubernetes.io/path")
    if not isinstance(path, str):
        return None
    index = notes.get("internal.config.kubernetes.io/index") or notes.get("config.kubernetes.io/index")
    out: dict[str, Any] = {"path": path}
    if isinstance(index, str) and index.isdigit():
        out["index"] = int(index)
    return out


def _result(obj: dict[str, Any], severity: str, message: str, path: str = "") -> dict[str, Any]:
    # The message as text a person reads (kpt prints it): a name's control characters escaped.
    out: dict[str, Any] = {"message": visible(message), "severity": severity, "resourceRef": _ref(obj)}
    if path:
        out["field"] = {"path": path}
    where = _file(obj)
    if where:
        out["file"] = where
    return out


def process(text: str, rules: RuleSet, policy: Policy) -> tuple[str, int]:
    """The ResourceList ``text`` with Envelope's mutations written into its items and
    ``results`` appended; and the exit status: 1 when any result has severity ``error``
    (a finding the webhook would refuse, an item that could not be fixed) or the input
    is not a ResourceList. That is kyaml's function framework's convention
    (kubernetes-sigs/kustomize ``kyaml/fn/framework/result.go``: ``Results.ExitCode`` is 1
    when any result's severity is ``error``; "Error ... Will cause the function to exit
    non-0"), so ``kustomize build`` stops rather than emit manifests the webhook denies;
    the ResourceList with its results is still written."""
    try:
        root = compose(text)
        doc = build(root) if root is not None else None
    except (yaml.YAMLError, YamlValueError) as exc:
        return _failure(f"stdin is not a YAML ResourceList: {exc}"), 1
    if not isinstance(doc, dict) or (doc.get("apiVersion"), doc.get("kind")) != RESOURCE_LIST:
        return _failure("stdin is not a config.kubernetes.io/v1 ResourceList (kustomize exec "
                        "functions and kpt send one)"), 1
    items = doc.get("items") or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return _failure("the ResourceList's items are not a list of objects"), 1
    placed_items = [placed(i, DEFAULT_NAMESPACE) for i in items]  # as `envelope fix` places them
    door = FrontDoor(rules, StaticView(placed_items, rules.indexes), policy, objects=placed_items)
    results: list[dict[str, Any]] = []
    patches: dict[int, list[dict[str, Any]]] = {}
    changes: dict[int, list[dict[str, Any]]] = {}
    for i, obj in enumerate(items):
        judged = door.judge(obj)
        result = judged.evaluation
        patch = patch_for(judged)
        for f in result.findings:
            results.append(_result(obj, "error" if f.severity == "error" else "warning",
                                   f"{f.rule}: {f.message}", f.path))
        for e in result.internal_errors:
            results.append(_result(obj, "error", f"internal: {e}"))
        if not patch:
            continue
        patches[i] = patch
        changes[i] = [_result(obj, "info", f"{c.rule}: {c.message}", c.path) for c in result.changes]
    text, failed = patch_items(text, patches)
    new_items = []
    for i, obj in enumerate(items):
        if i in failed:
            results.append(_result(obj, "error", f"cannot write Envelope's change in place: {failed[i]}"))
        elif i in patches:
            results.extend(changes[i])
            obj = apply_patch(obj, patches[i])
        new_items.append(obj)
    status = 1 if failed or any(r["severity"] == "error" for r in results) else 0
    expected = {**doc, "items": new_items}
    composed = compose(text)
    if composed is None or build(composed) != expected:
        return _failure("the rewritten ResourceList does not read back as the items with "
                        "their patches (a bug of envelope krm-fn)"), 1
    if results:
        text = _with_results(text, results)
    return text, status


def _with_results(text: str, results: list[dict[str, Any]]) -> str:
    root = compose(text)
    if not isinstance(root, MappingNode):
        return text
    existing = next((v for k, v in root.value if getattr(k, "value", None) == "results"), None)
    if existing is not None:
        if isinstance(existing, SequenceNode) and not existing.flow_style:
            before = build(existing) or []
            return _replace_results(text, root, [*before, *results])
        return text
    return _add(text, _Located(root, None, None), "results", results, {})


def _replace_results(text: str, root: MappingNode, results: list[dict[str, Any]]) -> str:
    """A ResourceList that already has results (an earlier function's): ours follow them."""
    from app.fix.edit import _block_pair, _content_end, _line_end, _newline

    key, value = next((k, v) for k, v in root.value if getattr(k, "value", None) == "results")
    start = text.rfind("\n", 0, key.start_mark.index) + 1
    end = _line_end(text, _content_end(text, value))
    nl = _newline(text)
    return text[:start] + _block_pair("results", results, key.start_mark.column, 2, nl) + nl + text[end:]


def _failure(message: str) -> str:
    return str(yaml.safe_dump({"apiVersion": RESOURCE_LIST[0], "kind": RESOURCE_LIST[1], "items": [],
                           "results": [{"message": visible(message), "severity": "error"}]},
                          sort_keys=False))


def run_krm_fn(rules: RuleSet, policy: Policy) -> int:
    text = decode(sys.stdin.buffer.read())
    out, status = process(text, rules, policy)
    sys.stdout.write(out)
    if status:
        # kustomize drops stdout when a function fails: say the errors on stderr too, one per
        # line as kyaml's Result.String() writes them ("[error] apiVersion/Kind/ns/name path: msg").
        try:
            results = (yaml.safe_load(out) or {}).get("results") or []
        except yaml.YAMLError:
            results = []
        for r in results:
            if isinstance(r, dict) and r.get("severity") == "error":
                ref = r.get("resourceRef") or {}
                who = "/".join(str(ref[k]) for k in ("apiVersion", "kind", "namespace", "name") if ref.get(k))
                where = (r.get("field") or {}).get("path")
                print(f"[error]{' ' + who if who else ''}{' ' + where if where else ''}: {r.get('message')}",
                      file=sys.stderr)
        print("envelope krm-fn: results of severity error (findings the webhook refuses, or items "
              "that could not be fixed); see the ResourceList's results", file=sys.stderr)
    return status

