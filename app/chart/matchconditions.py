"""CEL ``matchConditions`` for the mutating webhook: which writes the API server need
not send to ``/mutate`` because no mutating rule could patch, warn or deny them.

A compliant write then never leaves the API server for the mutation; only the
validating call remains. The expression is generated from the rule set and the policy
(one condition per mutate-phase rule not ``off``, :data:`KNOWN_RULES`), so it says
exactly what those rules act on. Every condition over-approximates its rule,
never the reverse (``e2e/test_matchconditions.py`` checks it on the real API server); a
mutate-phase workload rule this module does not know refuses generation
(:class:`UnknownRule`), so a new rule is never skipped silently. CEL is limited to what
webhook matchConditions have had since 1.27 (no optional types, no ``ext.Strings``),
every field guarded with ``has()``. A stale view's "not evaluated" warning is not judged
here (it concerns the view, not the object).

What each rule's condition matches, and the Kubernetes versions that evaluate them:
docs/deploy.md, "Compliant writes skip the mutating webhook".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.core.config import Mode, Policy
from app.core.ruleset import RuleSet
from app.k8s.podspec import WORKLOAD_KINDS

__all__ = ["CONDITION_NAME", "KNOWN_RULES", "MUTATING_WEBHOOK", "UnknownRule",
           "mutate_expression", "mutate_match_conditions", "webhook_config_patch"]

CONDITION_NAME = "envelope-may-mutate"
MUTATING_WEBHOOK = "workloads.mutate.envelope.io"
"""The chart's name for the workloads' mutating webhook."""

#: The workload kinds' mutate-phase rules this module has a condition for.
KNOWN_RULES = frozenset({"cpu-limits", "env-envelope-cpu", "memory-limit", "memory-below-limit",
                         "template-opt-outs",
                         "quota-needs-cpu-limits", "limitrange-needs-cpu-limits",
                         # warns only where cpu-limits removes a limit: its writes are a
                         # subset of cpu-limits' clause, added when cpu-limits is on
                         "downward-cpu-limit"})
_GUARDS = ("quota-needs-cpu-limits", "limitrange-needs-cpu-limits")


class UnknownRule(ValueError):
    """A mutate-phase rule with no known condition: the webhook must see every write."""


def _cel_string(text: str) -> str:
    """A CEL double-quoted string literal (JSON's escapes are CEL's)."""
    return json.dumps(text)


def _has_chain(root: str, path: tuple[str, ...]) -> str:
    """``has(root.a) && has(root.a.b) && ...`` for every prefix of ``path``."""
    return " && ".join(f"has({root}.{'.'.join(path[:i + 1])})" for i in range(len(path)))


def _template_roots() -> str:
    """A one-element list holding the pod template (``t.metadata``, ``t.spec``): the
    object itself for a Pod, its pod template otherwise; empty if absent."""
    def at(path: tuple[str, ...]) -> str:
        return f"({_has_chain('object', path)} ? [object.{'.'.join(path)}] : [])"
    return (f"(object.kind == \"Pod\" ? [object] : object.kind == \"CronJob\" ? "
            f"{at(('spec', 'jobTemplate', 'spec', 'template'))} : {at(('spec', 'template'))})")


def _annotated(meta: str, annotation: str) -> str:
    key = _cel_string(annotation)
    root, _, field = meta.partition(".")
    return (f"({_has_chain(root, (field, 'annotations'))} && {key} in {meta}.annotations && "
            f"{meta}.annotations[{key}].matches(r'^\\s*(?i:true)\\s*$'))")


_ALL_CONTAINERS = ("((has(s.initContainers) ? s.initContainers : []) + "
                   "(has(s.containers) ? s.containers : []))")
def _any_resources(test: Callable[[str], str]) -> str:
    """``test`` holds for the resources of some container, init container or the pod."""
    return (f"({_ALL_CONTAINERS}.exists(c, has(c.resources) && {test('c.resources')}) || "
            f"(has(s.resources) && {test('s.resources')}))")


def _memory_without_limit(r: str) -> str:
    return (f"(has({r}.requests) && \"memory\" in {r}.requests && "
            f"!(has({r}.limits) && \"memory\" in {r}.limits))")


def _memory_apart(r: str) -> str:
    """A memory request and limit written differently, or a memory limit without a
    request (over-approximates ``memory-below-limit``: 1Gi and 1024Mi are equal)."""
    return (f"(has({r}.limits) && \"memory\" in {r}.limits && "
            f"!(has({r}.requests) && \"memory\" in {r}.requests && "
            f"{r}.requests[\"memory\"] == {r}.limits[\"memory\"]))")


_CPU_ANY = _any_resources(lambda r: f"has({r}.limits) && \"cpu\" in {r}.limits")
_MEMORY_NO_LIMIT = _any_resources(_memory_without_limit)
MEMORY_APART = _any_resources(_memory_apart)
"""Some resources block whose memory request and limit ``memory-below-limit`` may write
equal (its domain; ``s`` is the pod spec)."""


def _env_cpu(name: str) -> str:
    return (f"{_ALL_CONTAINERS}.exists(c, has(c.env) && c.env.exists(e, "
            f"e.name == {_cel_string(name)} && has(e.value) && e.value.matches('(?i)cpu')))")


def mutate_expression(rules: RuleSet, policy: Policy) -> str:
    """One CEL expression: true when some mutate-phase workload rule could report on
    the write. ``"false"`` when every such rule is off."""
    modes = rules.modes(policy)
    on = {rid for rid, r in rules.items()
          if r.phase == "mutate" and modes[rid] is not Mode.OFF
          and r.kinds & WORKLOAD_KINDS}
    unknown = sorted(on - KNOWN_RULES)
    if unknown:
        raise UnknownRule(f"no match condition is known for the mutate rule(s) {', '.join(unknown)}: "
                          "leave matchConditions off, or teach app/chart/matchconditions.py what they act on")
    not_opted_out = (f"!({_annotated('object.metadata', policy.opt_out_annotation)} || "
                     f"{_annotated('t.metadata', policy.opt_out_annotation)})")
    clauses: list[str] = []
    if any(g in on for g in _GUARDS):
        clauses.append(_CPU_ANY)
    elif "cpu-limits" in on:
        clauses.append(f"({_CPU_ANY} && {not_opted_out})")
    if "env-envelope-cpu" in on:
        clauses.append(f"({_env_cpu(policy.envelope_env.limits)} && {not_opted_out})")
    if "memory-limit" in on:
        clauses.append(_MEMORY_NO_LIMIT)
    if "memory-below-limit" in on and policy.memory_below_limit is not None:
        clauses.append(MEMORY_APART)
    carried = _carried_on_object(policy) if "template-opt-outs" in on else ""
    if not clauses:
        return carried or "false"
    found = (f"{_template_roots()}.exists(t, has(t.spec) && [t.spec].exists(s, "
             f"{' || '.join(clauses)}))")
    return f"({carried}) || {found}" if carried else found


def _carried_on_object(policy: Policy) -> str:
    """``template-opt-outs``: a workload (not a Pod) whose own metadata has the opt-out
    or (where objects may exempt themselves) the exemption annotation, whatever its
    value."""
    keys = [policy.opt_out_annotation,
            *([policy.exempt_annotation] if policy.allow_object_exemptions else [])]
    there = " || ".join(f"{_cel_string(k)} in object.metadata.annotations" for k in keys)
    return (f"object.kind != \"Pod\" && has(object.metadata) && "
            f"has(object.metadata.annotations) && ({there})")


def mutate_match_conditions(rules: RuleSet, policy: Policy) -> list[dict[str, Any]]:
    """The ``matchConditions`` list for the workloads' mutating webhook."""
    return [{"name": CONDITION_NAME, "expression": mutate_expression(rules, policy)}]


def webhook_config_patch(rules: RuleSet, policy: Policy) -> dict[str, Any]:
    """A strategic-merge patch for the chart's MutatingWebhookConfiguration (webhooks
    merge by name) that adds the matchConditions: what ``envelope webhook-config``
    prints."""
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "webhooks": [{"name": MUTATING_WEBHOOK,
                          "matchConditions": mutate_match_conditions(rules, policy)}]}
