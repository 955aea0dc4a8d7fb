"""Compile the workload mutations Envelope makes over one object into a
MutatingAdmissionPolicy (``admissionregistration.k8s.io/v1``, ``patchType: JSONPatch``)
and its binding, and shrink the mutating webhook to the writes the policy does not
answer.

The policy holds on one *domain*: a CEL predicate over the write (its matchConditions;
what depends on the namespace is the binding's namespaceSelector) true only where the
policy's patch is exactly the patch ``/mutate`` would answer. Outside it nothing is
approximated: the write goes to the webhook as before. What is compiled (``cpu-limits``,
``memory-limit``, the mutations annotation; ``enforce`` only), what is left to the
webhook and why, and the CEL used: docs/in-tree.md. The proof is
``e2e/test_intree_equivalence.py``.

Why one module of ~432 lines: the domain (where the policy may answer) and the patch
(what it writes) are built from the same per-rule predicates and must agree with
``/mutate`` to the byte; the equivalence oracle checks them together. The CEL shared
with the validating policies is ``app/intree/cel.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.chart.matchconditions import MEMORY_APART, MUTATING_WEBHOOK, mutate_expression
from app.core.config import Mode, Policy
from app.core.ruleset import RuleSet
from app.intree.cel import (
    annotation_value,
    exception_requirements,
    exemption_clauses,
    in_section,
    lit,
    namespace_selector,
    not_owned_by_deployment,
    resource_rules,
    template_exists,
)
from app.k8s.podspec import WORKLOAD_KINDS

__all__ = ["FACT_LABEL", "FACT_LEASE_CONDITION", "FACT_VALUE", "POLICY_NAME", "Compiled",
           "NotCompilable", "compile_in_tree", "fact_lease_expression"]

POLICY_NAME = "envelope-workloads.envelope.io"
"""The MutatingAdmissionPolicy's name (and its binding's)."""
DOMAIN_CONDITION = "envelope-in-tree"
"""The name of the policy's matchCondition: the domain."""
FACT_LABEL = "in-tree.envelope.io/cpu-limit-guards"
"""A Namespace label Envelope's leader keeps current (app/intree/facts.py)."""
FACT_VALUE = "clear"
"""The label's value when the namespace holds no LimitRange and no ResourceQuota, so
neither namespace guard can report on any of its workloads."""
FACT_LEASE_CONDITION = "envelope-fact-lease"
"""The policy's matchCondition that trusts the fact only while its keeper's Lease (the
policy's param, a coordination.k8s.io/v1 Lease the keeper renews:
``app.intree.facts.FactLease``) has not lapsed at the time of the write."""
DEFAULT_FACT_LEASE = ("envelope", "envelope-leader-facts")
"""(namespace, name) of the keeper's Lease when none is given: ``serve``'s default
``--lease-name`` plus ``-facts``, in the chart's usual release namespace."""


def fact_lease_expression() -> str:
    """CEL: the write happens before the keeper's Lease lapses. The time of the write is
    the newest ``time`` of ``object.metadata.managedFields``: on a CREATE the API
    server's field manager stamps the writer's entry with its own clock before mutating
    admission runs (``k8s.io/apiserver/pkg/endpoints/handlers/create.go`` calls
    ``FieldManager.UpdateNoErrors`` before ``Admit``; ``managedfields/internal/
    managedfieldsupdater.go`` sets ``time.Now()``), and Kubernetes CEL has no clock of
    its own. No time there, or no renewal: not fresh (the webhook answers). The Lease's
    ``renewTime`` is a MicroTime the API server validated, so ``timestamp()`` parses it."""
    lease = "params.spec"
    return (f"has({lease}.renewTime) && has({lease}.leaseDurationSeconds) && "
            "has(object.metadata.managedFields) && "
            "object.metadata.managedFields.exists(m, has(m.time)) && "
            "object.metadata.managedFields.all(m, !has(m.time) || timestamp(m.time) < "
            f"timestamp({lease}.renewTime) + duration(string({lease}.leaseDurationSeconds) + 's'))")

#: Mutate-phase workload rules and what the compiler does with each.
_COMPILABLE = ("cpu-limits", "memory-limit")
_GUARDS = ("quota-needs-cpu-limits", "limitrange-needs-cpu-limits")
_KNOWN = frozenset({*_COMPILABLE, *_GUARDS, "env-envelope-cpu", "downward-cpu-limit",
                    "memory-below-limit", "template-opt-outs"})
_SPEC_POINTER = {"Pod": "/spec", "CronJob": "/spec/jobTemplate/spec/template/spec"}
_ALL = "((has(s.initContainers) ? s.initContainers : []) + (has(s.containers) ? s.containers : []))"


class NotCompilable(ValueError):
    """A mutate-phase rule the compiler knows nothing about: no policy can be generated
    (the webhook must keep seeing every write)."""


@dataclass(frozen=True)
class Compiled:
    """What ``compile_in_tree`` makes of a rule set and a policy."""

    rules: tuple[str, ...]
    """The rule ids the MutatingAdmissionPolicy applies, in the engine's order."""
    not_compiled: dict[str, str]
    """Enabled mutate-phase rule id -> why it stays in the webhook."""
    domain: str
    """The CEL predicate of the writes the policy answers (its matchCondition)."""
    manifests: list[dict[str, Any]] = field(default_factory=list)
    """The MutatingAdmissionPolicy and its binding (none when nothing is compiled)."""
    webhook_condition: str = "true"
    """The reduced mutating webhook's matchCondition: what is left to ``/mutate``."""
    namespace_requirements: list[dict[str, Any]] = field(default_factory=list)
    """matchExpressions the binding's namespaceSelector adds (the namespace fact, the
    namespaces an exception may exempt)."""

    def webhook_patch(self) -> dict[str, Any]:
        """A strategic-merge patch for the chart's MutatingWebhookConfiguration that sets
        the reduced condition (as ``envelope webhook-config`` prints without --in-tree)."""
        return {"apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "webhooks": [{"name": MUTATING_WEBHOOK, "matchConditions": [
                    {"name": "envelope-may-mutate", "expression": self.webhook_condition}]}]}












def _opted_out(meta: str, key: str) -> str:
    there, value = annotation_value(meta, key)
    return f"({there} && {value}.lowerAscii() == \"true\")"


def _plain_annotation(meta: str, key: str) -> str:
    """The annotation is absent or printable ASCII without spaces: Python's
    ``strip().lower()`` and CEL's ``lowerAscii()`` then agree on it."""
    there, value = annotation_value(meta, key)
    return f"(!{there} || {value}.matches('^[!-~]*$'))"












def _cpu_limit(r: str) -> str:
    return in_section(r, "limits", "cpu")


def _memory_without_limit(r: str) -> str:
    return f"({in_section(r, 'requests', 'memory')} && !{in_section(r, 'limits', 'memory')})"


def _asks_cpu(r: str) -> str:
    return f"({in_section(r, 'requests', 'cpu')} || {in_section(r, 'limits', 'cpu')})"




def _modes(rules: RuleSet, policy: Policy) -> tuple[dict[str, Mode], list[str]]:
    """Each enabled mutate-phase workload rule's mode, and their order in the engine."""
    modes = rules.modes(policy)
    order = [r.id for r, _ in rules.applicable("apps", "Deployment", "mutate", "CREATE", policy)]
    on = {rid: modes[rid] for rid, r in rules.items()
          if r.phase == "mutate" and r.kinds & WORKLOAD_KINDS and modes[rid] is not Mode.OFF}
    unknown = sorted(set(on) - _KNOWN)
    if unknown:
        raise NotCompilable(f"no in-tree translation is known for the mutate rule(s) "
                            f"{', '.join(unknown)}: teach app/intree/compile.py what they do, "
                            f"or run without --in-tree")
    return on, [rid for rid in order if rid in on]


def _not_compiled(on: dict[str, Mode], policy: Policy) -> dict[str, str]:
    why: dict[str, str] = {}
    for rid, mode in on.items():
        if rid in _COMPILABLE and mode is Mode.WARN:
            why[rid] = ("warn mode: its warnings come from the mutating webhook, and a "
                        "MutatingAdmissionPolicy cannot warn")
        elif rid == "env-envelope-cpu":
            why[rid] = ("the kubelet's $(VAR) expansion, the last duplicate entry winning and "
                        "Python's whitespace rules in the key=value parser are not CEL's; "
                        "string envelopes stay in the webhook")
        elif rid == "template-opt-outs":
            why[rid] = ("copies annotations into the pod template: workloads whose own "
                        "metadata carries the opt-out annotation stay in the webhook")
        elif rid == "memory-below-limit" and policy.memory_below_limit is not None:
            why[rid] = ("reads the Namespace and says what it raised as a warning (a "
                        "MutatingAdmissionPolicy cannot warn): writes with a memory request "
                        "apart from its limit stay in the webhook")
        elif rid == "downward-cpu-limit":
            why[rid] = ("a warning (a MutatingAdmissionPolicy cannot warn): writes whose "
                        "containers or volumes read limits.cpu through the downward API stay "
                        "in the webhook")
        elif rid in _GUARDS:
            why[rid] = ("reads the namespace's LimitRanges and ResourceQuotas, which a policy "
                        f"cannot see: the policy runs only in namespaces labelled "
                        f"{FACT_LABEL}={FACT_VALUE}")
    return why


def _domain(on: dict[str, Mode], compiled: Sequence[str], policy: Policy) -> str:
    """The writes the policy answers exactly (see the module's docstring)."""
    opt_out = policy.opt_out_annotation
    body = [
        _plain_annotation("t.metadata", opt_out) if "cpu-limits" in compiled else "true",
        # the pod-level request the webhook would write is a sum
        f"!(has(s.resources) && {_cpu_limit('s.resources')} && "
        f"!{in_section('s.resources', 'requests', 'cpu')} && "
        f"{_ALL}.exists(c, has(c.resources) && {_asks_cpu('c.resources')}))",
        # the webhook may warn that the pods lose exclusive cores
        f"!(size({_ALL}) > 0 && {_ALL}.all(c, has(c.resources) && "
        f"{_cpu_limit('c.resources')} && \"memory\" in c.resources.limits))",
        # with pod-level cpu or memory, the pod-level values as the API server defaults them
        # decide the QoS class (_guaranteed_with_whole_cores); Guaranteed needs a pod-level
        # CPU limit, written or defaulted from containers that all limit CPU
        f"!(has(s.resources) && [s.resources].exists(r, "
        f"{in_section('r', 'requests', 'cpu')} || {in_section('r', 'requests', 'memory')} || "
        f"{_cpu_limit('r')} || {in_section('r', 'limits', 'memory')}) && "
        f"({_cpu_limit('s.resources')} || (size({_ALL}) > 0 && {_ALL}.all(c, "
        f"has(c.resources) && {_cpu_limit('c.resources')}))))",
    ]
    if on.get("downward-cpu-limit") and "cpu-limits" in compiled:
        ref = "has(r.resourceFieldRef) && r.resourceFieldRef.resource == 'limits.cpu'"
        items = f"has(d.items) && d.items.exists(r, {ref})"
        body.append(
            f"!({_ALL}.exists(c, has(c.env) && c.env.exists(e, has(e.valueFrom) && "
            f"[e.valueFrom].exists(r, {ref}))) || (has(s.volumes) && s.volumes.exists(v, "
            f"(has(v.downwardAPI) && [v.downwardAPI].exists(d, {items})) || "
            f"(has(v.projected) && has(v.projected.sources) && v.projected.sources.exists(p, "
            f"has(p.downwardAPI) && [p.downwardAPI].exists(d, {items}))))))")
    if on.get("memory-below-limit") and policy.memory_below_limit is not None:
        body.append(f"!{MEMORY_APART}")
    if on.get("env-envelope-cpu"):
        name = lit(policy.envelope_env.limits)
        body.append(f"!{_ALL}.exists(c, has(c.env) && c.env.exists(e, e.name == {name} && "
                    f"has(e.value) && e.value.matches('(?i)cpu|[$]')))")
    if on.get("cpu-limits") is Mode.WARN:
        body.append(f"!({_ALL}.exists(c, has(c.resources) && {_cpu_limit('c.resources')}) || "
                    f"(has(s.resources) && {_cpu_limit('s.resources')}))")
    if on.get("memory-limit") is Mode.WARN:
        body.append(f"!({_ALL}.exists(c, has(c.resources) && "
                    f"{_memory_without_limit('c.resources')}) || "
                    f"(has(s.resources) && {_memory_without_limit('s.resources')}))")
    parts = [
        # UPDATEs stay in the webhook: it patches no template an UPDATE left as stored
        # and no part of a Job's template the API server holds (app/core/engine.py), which
        # this policy does not express (the equivalence oracle found the difference).
        "request.operation == \"CREATE\"",
        _plain_annotation("object.metadata", opt_out) if "cpu-limits" in compiled else "true",
    ]
    if on.get("template-opt-outs"):
        there, _ = annotation_value("object.metadata", opt_out)
        parts.append(f"(object.kind == \"Pod\" || !{there})")
    parts += exemption_clauses(policy, compiled)
    parts.append(not_owned_by_deployment())
    parts.append(template_exists(" && ".join(body)))
    return " && ".join(p for p in parts if p != "true")


def _patch(op: str, pointer: str, value: str | None = None) -> str:
    """One CEL ``JSONPatch`` literal; ``pointer`` and ``value`` are CEL expressions."""
    return (f"JSONPatch{{op: {lit(op)}, path: {pointer}"
            + (f", value: {value}" if value is not None else "") + "}")


def _at(pointer: str, suffix: str) -> str:
    return f"{pointer} + {lit(suffix)}"


def _ops(r: str, has_r: str, pointer: str, rule_id: str,
         opted_out: str) -> list[tuple[str, str]]:
    """The JSONPatch operations of one rule on one resources block ``r`` at ``pointer``
    (a CEL string expression): (when, the ``JSONPatch``), each over the block's holder.
    Each is written as a filter and a transform rather than a ternary over lists, so the
    whole expression types as ``list(JSONPatch)``."""
    if rule_id == "cpu-limits":
        limit = f"{r}.limits.cpu"
        moved = f"!{opted_out} && {has_r} && {_cpu_limit(r)}"
        return [
            (moved, _patch("remove", _at(pointer, "/limits/cpu"))),
            (f"{moved} && has({r}.requests) && !(\"cpu\" in {r}.requests)",
             _patch("add", _at(pointer, "/requests/cpu"), limit)),
            (f"{moved} && !has({r}.requests)",
             _patch("add", _at(pointer, "/requests"), '{"cpu": ' + limit + "}")),
        ]
    request = f"{r}.requests.memory"
    filled = f"{has_r} && {_memory_without_limit(r)}"
    return [
        (f"{filled} && has({r}.limits)", _patch("add", _at(pointer, "/limits/memory"), request)),
        (f"{filled} && !has({r}.limits)",
         _patch("add", _at(pointer, "/limits"), '{"memory": ' + request + "}")),
    ]


def _places(r: str, has_r: str, rule_id: str) -> str:
    """When ``rule_id`` changes resources block ``r`` (before the opt-out)."""
    return f"{has_r} && " + (_cpu_limit(r) if rule_id == "cpu-limits" else _memory_without_limit(r))


def _patch_expression(compiled: Sequence[str], policy: Policy) -> tuple[list[dict[str, str]], str]:
    """The policy's variables and its JSONPatch expression."""
    opted_out = "variables.optedOut"
    variables = [
        {"name": "t", "expression": ("object.kind == \"Pod\" ? object : object.kind == \"CronJob\" ? "
                                     "object.spec.jobTemplate.spec.template : object.spec.template")},
        {"name": "s", "expression": "variables.t.spec"},
        {"name": "base", "expression": (f"object.kind == \"Pod\" ? {lit(_SPEC_POINTER['Pod'])} : "
                                        f"object.kind == \"CronJob\" ? {lit(_SPEC_POINTER['CronJob'])} : "
                                        f"\"/spec/template/spec\"")},
        {"name": "optedOut", "expression": (
            f"{_opted_out('object.metadata', policy.opt_out_annotation)} || "
            f"{_opted_out('variables.t.metadata', policy.opt_out_annotation)}")},
    ]
    s = "variables.s"
    ops: list[str] = []
    place_lists: list[tuple[str, str]] = []
    for rule_id in compiled:
        names = []
        for field_name in ("initContainers", "containers"):
            items = f"(has({s}.{field_name}) ? {s}.{field_name} : [])"
            pointer = f"variables.base + \"/{field_name}/\" + string(i) + \"/resources\""
            for when, patch in _ops("c.resources", "has(c.resources)", pointer, rule_id, opted_out):
                ops.append(f"{items}.transformList(i, c, {when}, {patch})")
            changed = _places("c.resources", "has(c.resources)", rule_id)
            names.append(f"{items}.transformList(i, c, {changed}, "
                         f"has(c.name) ? c.name : \"{field_name}[\" + string(i) + \"]\")")
        for when, patch in _ops("p.resources", "has(p.resources)", "variables.base + \"/resources\"",
                                rule_id, opted_out):
            ops.append(f"[{s}].filter(p, {when}).map(p, {patch})")
        names.append(f"({_places(f'{s}.resources', f'has({s}.resources)', rule_id)} ? [\"pod\"] : [])")
        found = f"({' + '.join(names)}).distinct()"
        variables.append({"name": _var(rule_id), "expression":
                          f"{opted_out} ? [] : {found}" if rule_id == "cpu-limits" else found})
        place_lists.append((rule_id, f"variables.{_var(rule_id)}"))
    expression = " + ".join(ops)
    key = policy.mutations_annotation
    if key:
        pieces = " + ".join(f"(size({v}) > 0 ? [{lit(rid + ':')} + {v}.join(\",\")] : [])"
                            for rid, v in place_lists)
        variables.append({"name": "mutations", "expression": f"({pieces}).join(\";\")"})
        pods = "true" if policy.annotate_pods else "object.kind != \"Pod\""
        when = f"variables.mutations != \"\" && {pods}"
        one = _patch("add", f"\"/metadata/annotations/\" + jsonpatch.escapeKey({lit(key)})",
                     "variables.mutations")
        whole = _patch("add", "\"/metadata/annotations\"", f"{{{lit(key)}: variables.mutations}}")
        annotation = (f"[object].filter(o, {when} && has(o.metadata.annotations)).map(o, {one}) + "
                      f"[object].filter(o, {when} && !has(o.metadata.annotations)).map(o, {whole})")
        expression = f"{expression} + {annotation}"
    return variables, expression


def _var(rule_id: str) -> str:
    return "places" + "".join(part.title() for part in rule_id.split("-"))






def _fact_requirements(on: dict[str, Mode]) -> list[dict[str, Any]]:
    """With a namespace guard on, the binding selects only namespaces with the fact. (It
    cannot be a matchCondition: the API server gives a policy's matchConditions no
    ``namespaceObject`` — ``webhook/matchconditions/matcher.go`` passes none.)"""
    if not any(g in on for g in _GUARDS):
        return []
    return [{"key": FACT_LABEL, "operator": "In", "values": [FACT_VALUE]}]


def compile_in_tree(rules: RuleSet, policy: Policy, *,
                    excluded_namespaces: Sequence[str] = ("kube-system",),
                    failure_policy: str = "Fail",
                    fact_lease: tuple[str, str] = DEFAULT_FACT_LEASE) -> Compiled:
    """The MutatingAdmissionPolicy and binding for ``policy``'s enforced workload
    mutations, and the reduced webhook condition. ``excluded_namespaces`` must be the
    mutating webhook's (``webhooks.excludeNamespaces`` plus kube-system and the release
    namespace in the chart). ``fact_lease``: (namespace, name) of the Lease the fact's
    keeper renews (``serve --in-tree-facts``: ``--lease-name`` plus ``-facts`` in
    ``--namespace``); with a namespace guard on, the binding reads it as its param and
    the policy answers only while it has not lapsed (:func:`fact_lease_expression`)."""
    on, order = _modes(rules, policy)
    compiled = tuple(rid for rid in order if rid in _COMPILABLE and on[rid] is Mode.ENFORCE)
    why = _not_compiled(on, policy)
    old = mutate_expression(rules, policy)
    if not compiled:
        return Compiled((), why, "false", [], old)
    domain = _domain(on, compiled, policy)
    required = _fact_requirements(on) + exception_requirements(policy, compiled)
    variables, expression = _patch_expression(compiled, policy)
    policy_manifest: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/name": "envelope"}},
        "spec": {
            "failurePolicy": failure_policy,
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {"resourceRules": resource_rules(),
                                 "namespaceSelector": namespace_selector(excluded_namespaces)},
            "matchConditions": [{"name": DOMAIN_CONDITION, "expression": domain}],
            "variables": variables,
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
        },
    }
    binding: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {"app.kubernetes.io/name": "envelope"}},
        "spec": {"policyName": POLICY_NAME, "matchResources": {
            "namespaceSelector": namespace_selector(excluded_namespaces, required)}},
    }
    if _fact_requirements(on):
        # The fact expires: trusted only while its keeper renews its Lease (issue 38).
        # A missing Lease: the binding does nothing (parameterNotFoundAction Allow), and
        # the webhook answers.
        spec = policy_manifest["spec"]
        spec["paramKind"] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
        spec["matchConditions"].append({"name": FACT_LEASE_CONDITION,
                                        "expression": fact_lease_expression()})
        binding["spec"]["paramRef"] = {"namespace": fact_lease[0], "name": fact_lease[1],
                                       "parameterNotFoundAction": "Allow"}
    # A webhook's matchConditions cannot read the namespace either: when the binding
    # selects fewer namespaces than the webhook (the fact, an exception's namespace
    # selector), the webhook keeps its own condition (which, evaluated on the object the
    # policy already mutated, is false for almost all of the policy's writes anyway).
    condition = old if required or old == "false" else f"({old}) && !({domain})"
    return Compiled(compiled, why, domain, [policy_manifest, binding], condition, required)
