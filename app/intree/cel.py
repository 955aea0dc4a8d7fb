"""The CEL that Envelope's in-tree policies share (``app.intree.compile``'s
MutatingAdmissionPolicy, ``app.intree.validating``'s ValidatingAdmissionPolicy): string
literals, field tests, label selectors and policy exceptions over ``object`` and
``request``, the workload kinds they match, the namespaces they leave out, and the
clauses every domain carries (exemptions, exceptions, ReplicaSets a Deployment owns).

Each function returns CEL source text; nothing here evaluates CEL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from app.core.config import Policy, RuleException
from app.k8s.kinds import KINDS
from app.k8s.podspec import WORKLOAD_KINDS
from app.k8s.selectors import LabelSelector

__all__ = ["annotation_value", "exception_matches", "exception_requirements", "exemption_clauses",
           "has_path", "in_section", "labels_of", "lit", "namespace_only", "namespace_selector",
           "negated", "not_owned_by_deployment", "resource_rules", "selector_matches",
           "template_exists"]

def lit(text: str) -> str:
    """A CEL string literal (JSON's escapes are CEL's)."""
    return json.dumps(text)


def has_path(root: str, *path: str) -> str:
    return " && ".join(f"has({root}.{'.'.join(path[:i + 1])})" for i in range(len(path)))


def in_section(root: str, section: str, name: str) -> str:
    return f"(has({root}.{section}) && {lit(name)} in {root}.{section})"


def labels_of(meta: str) -> str:
    return f"(has({meta}.labels) ? {meta}.labels : {{}})"


def annotation_value(meta: str, key: str) -> tuple[str, str]:
    """(the annotation is there, its value) over a metadata expression such as
    ``t.metadata`` (every field of the path is tested: a pod template may have none)."""
    parts = meta.split(".")
    cut_at = 2 if parts[0] == "variables" else 1
    root, path = ".".join(parts[:cut_at]), parts[cut_at:]
    return f"({has_path(root, *path, 'annotations')} && {lit(key)} in {meta}.annotations)", \
        f"{meta}.annotations[{lit(key)}]"


def selector_matches(selector: LabelSelector, labels: str) -> str:
    """``metav1.LabelSelector`` matching (``app.k8s.selectors``) over a CEL labels map."""
    parts = [f"({lit(k)} in {labels} && {labels}[{lit(k)}] == {lit(v)})"
             for k, v in (selector.match_labels or {}).items()]
    for req in selector.match_expressions or []:
        key, values = lit(req.key), json.dumps(list(req.values or []))
        parts.append({"In": f"({key} in {labels} && {labels}[{key}] in {values})",
                      "NotIn": f"(!({key} in {labels}) || !({labels}[{key}] in {values}))",
                      "Exists": f"({key} in {labels})",
                      "DoesNotExist": f"!({key} in {labels})"}[req.operator])
    return "(" + (" && ".join(parts) or "true") + ")"


def exception_matches(exception: RuleException) -> str:
    """When ``exception`` matches the write (``app.core.exemptions._matches``)."""
    parts = []
    if exception.kinds:
        kinds = json.dumps(list(exception.kinds))
        parts.append(f"(request.kind.kind in {kinds} || "
                     f"(request.kind.group + \"/\" + request.kind.kind) in {kinds})")
    if exception.namespaces:
        parts.append(f"request.namespace in {json.dumps(list(exception.namespaces))}")
    if exception.object_selector is not None:
        parts.append(selector_matches(exception.object_selector, labels_of("object.metadata")))
    # A namespaceSelector is not read here: matchConditions see no namespaceObject. An
    # exception with other conditions too is matched on those alone (a superset: the
    # rest goes to the webhook); one with only a namespaceSelector is the binding's
    # (:func:`_exception_requirements`).
    return "(" + " && ".join(parts or ["true"]) + ")"


def negated(selector: LabelSelector) -> dict[str, Any] | None:
    """One requirement that holds only where ``selector`` does not: the negation of its
    first term (exact for a one-term selector, a subset of the complement otherwise).
    None for an empty selector (it selects every namespace)."""
    flip = {"In": "NotIn", "NotIn": "In", "Exists": "DoesNotExist", "DoesNotExist": "Exists"}
    for key, value in (selector.match_labels or {}).items():
        return {"key": key, "operator": "NotIn", "values": [value]}
    for req in selector.match_expressions or []:
        out: dict[str, Any] = {"key": req.key, "operator": flip[req.operator]}
        if req.operator in ("In", "NotIn"):
            out["values"] = list(req.values or [])
        return out
    return None


def namespace_only(exception: RuleException) -> bool:
    return exception.namespace_selector is not None and not (
        exception.kinds or exception.namespaces or exception.object_selector is not None)


def exception_requirements(policy: Policy, compiled: Sequence[str]) -> list[dict[str, Any]]:
    """What the binding's namespaceSelector adds for exceptions that name only a
    namespaceSelector: namespaces they may exempt are left to the webhook."""
    out = []
    for exception in policy.exceptions:
        if {"*", *compiled} & set(exception.rules) and namespace_only(exception):
            assert exception.namespace_selector is not None
            flipped = negated(exception.namespace_selector)
            out.append(flipped if flipped is not None else
                       {"key": "kubernetes.io/metadata.name", "operator": "DoesNotExist"})
    return out


def resource_rules() -> list[dict[str, Any]]:
    """The workload kinds, one rule per API group (as the chart's webhook rules)."""
    by_group: dict[str, list[str]] = {}
    versions: dict[str, list[str]] = {}
    for entry in KINDS:
        if (entry.group, entry.kind) in WORKLOAD_KINDS:
            by_group.setdefault(entry.group, []).append(entry.resource)
            versions.setdefault(entry.group, [])
            if entry.versions[0] not in versions[entry.group]:
                versions[entry.group].append(entry.versions[0])
    return [{"apiGroups": [group], "apiVersions": versions[group], "resources": resources,
             "operations": ["CREATE", "UPDATE"]} for group, resources in by_group.items()]


def namespace_selector(excluded: Sequence[str],
                        required: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                  "values": list(dict.fromkeys(excluded))}, *required]}


def template_exists(body: str) -> str:
    """``body`` over ``t`` (the pod template, or the Pod) and ``s`` (its spec); false when
    the object has none."""
    def at(path: tuple[str, ...]) -> str:
        return f"({has_path('object', *path)} ? [object.{'.'.join(path)}] : [])"
    roots = (f"(object.kind == \"Pod\" ? [object] : object.kind == \"CronJob\" ? "
             f"{at(('spec', 'jobTemplate', 'spec', 'template'))} : {at(('spec', 'template'))})")
    return f"{roots}.exists(t, has(t.spec) && [t.spec].exists(s, {body}))"


def exemption_clauses(policy: Policy, compiled: Sequence[str]) -> list[str]:
    """The domain's clauses for what may exempt the write from a compiled rule: the
    exemption annotation on the object (any value: the webhook reports it as skipped),
    and every exception naming a compiled rule (or ``*``) but a namespaceSelector-only
    one, which is the binding's (:func:`exception_requirements`)."""
    parts = []
    if policy.allow_object_exemptions:
        there, _ = annotation_value("object.metadata", policy.exempt_annotation)
        parts.append(f"!{there}")
    for exception in policy.exceptions:
        if {"*", *compiled} & set(exception.rules) and not namespace_only(exception):
            parts.append(f"!{exception_matches(exception)}")
    return parts


def not_owned_by_deployment() -> str:
    """Not a ReplicaSet whose controller is an apps/v1 Deployment: the engine judges no
    such ReplicaSet (``app.k8s.podspec.compared_by_controller``: the Deployment was judged)."""
    return ("!(object.kind == \"ReplicaSet\" && has(object.metadata.ownerReferences) && "
            "object.metadata.ownerReferences.exists(o, has(o.controller) && o.controller && "
            "o.kind == \"Deployment\" && o.apiVersion == \"apps/v1\"))")
