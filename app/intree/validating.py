"""Compile the validate rules CEL can say exactly over one object into
ValidatingAdmissionPolicies (``admissionregistration.k8s.io/v1``) and their bindings —
``validationActions: [Deny]`` for a rule in ``enforce`` mode, ``[Warn]`` in ``warn``
mode — with messages equal to the validating webhook's.

Each policy has a *domain*, as the MutatingAdmissionPolicy has (``app.intree.compile``):
the writes where its answer is exactly the webhook's for the rule; outside it the
webhook judges the rule as before. Compiled: ``memory-request-equals-limit`` on CREATE,
in namespaces with the fact label, less the writes docs/in-tree.md lists ("Left to the
webhook"). Why the webhook needs no change for ``enforce``, and how it is partitioned
for ``warn`` (:func:`webhook_partition`, ``/validate/in-tree/<ids>``): docs/in-tree.md,
"Validation".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.config import Mode, Policy
from app.core.ruleset import RuleSet
from app.intree.cel import (
    exception_requirements,
    exemption_clauses,
    has_path,
    in_section,
    lit,
    namespace_selector,
    not_owned_by_deployment,
    resource_rules,
    template_exists,
)
from app.intree.compile import FACT_LABEL, FACT_VALUE
from app.k8s.podspec import WORKLOAD_KINDS
from app.k8s.util import WARNING_LIMIT

__all__ = [
    "COMPILABLE",
    "VALIDATE_PATH",
    "CompiledValidation",
    "Entry",
    "compile_validating",
    "findings_expression",
    "partition",
    "pod_level_clause",
    "policy_name",
    "renamed",
    "warning_prefix",
    "webhook_json_patch",
    "webhook_partition",
]

COMPILABLE = ("memory-request-equals-limit",)
"""Validate rules the compiler can write as a ValidatingAdmissionPolicy."""
VALIDATE_PATH = "/validate/in-tree/"
"""The validating webhook path that skips the rules named after it (comma-separated):
the writes a Warn policy answers (``app.serve.server``)."""
DOMAIN_CONDITION = "envelope-in-tree"
_TAIL = "; memory cannot be borrowed back, so request must equal limit"

#: Why an enabled validate rule on workloads stays in the webhook.
_WHY = {
    "quantities": (
        "the API server refuses a malformed pod spec or quantity before any admission "
        "plugin, so on an API server the rule has nothing to find; it guards envelope check "
        "and direct callers"),
    "env-envelope-consistency": (
        "the kubelet's $(VAR) expansion over earlier env entries, the last duplicate entry "
        "winning, Python's whitespace and case rules in the key=value parser and messages "
        "that quote the parsed values are not CEL's"),
}
_CROSS_OBJECT = "reads other objects (Nodes, LimitRanges, quotas, the namespace's workloads)"


def policy_name(rule_id: str) -> str:
    """The ValidatingAdmissionPolicy's name for one rule (and its binding's)."""
    return f"{rule_id}.envelope.io"


def warning_prefix(rule_id: str) -> str:
    """What the API server puts before a Warn policy's message
    (``k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go``)."""
    name = policy_name(rule_id)
    return f"Validation failed for ValidatingAdmissionPolicy '{name}' with binding '{name}': "


@dataclass(frozen=True)
class CompiledValidation:
    """What ``compile_validating`` makes of a rule set and a policy."""

    rules: dict[str, Mode]
    """Compiled rule id -> its mode (``enforce``: Deny, ``warn``: Warn)."""
    not_compiled: dict[str, str]
    """Enabled validate rule on workloads -> why it stays in the webhook."""
    domains: dict[str, str] = field(default_factory=dict)
    """Compiled rule id -> its policy's matchCondition."""
    manifests: list[dict[str, Any]] = field(default_factory=list)
    """Each policy and its binding."""
    namespace_requirements: list[dict[str, Any]] = field(default_factory=list)
    """matchExpressions every binding's namespaceSelector adds (the fact, exceptions)."""

    @property
    def warned(self) -> tuple[str, ...]:
        """The rules whose policy warns: the webhook must skip them in their domain."""
        return tuple(rid for rid, mode in self.rules.items() if mode is Mode.WARN)

    def skip_domain(self) -> str:
        """Where the webhook must skip :attr:`warned`: the writes every Warn policy
        answers (one path skips them all, so with several the compiler gives each Warn
        policy their intersection)."""
        return f"({self.domains[self.warned[0]]})" if self.warned else "false"


def _holders(s: str) -> list[tuple[str, str, str]]:
    """(list expression, the holder variable, its label expression) of every resources
    block: init containers, containers, pod level (``app.k8s.podspec.holders``' order)."""
    return [
        (f"(has({s}.initContainers) ? {s}.initContainers : [])", "c",
         "\"initContainer \\\"\" + c.name + \"\\\"\""),
        (f"(has({s}.containers) ? {s}.containers : [])", "c",
         "\"container \\\"\" + c.name + \"\\\"\""),
        (f"[{s}]", "p", "\"pod-level resources\""),
    ]


def _differs(r: str) -> str:
    return (f"has({r}) && {in_section(r, 'requests', 'memory')} && "
            f"{in_section(r, 'limits', 'memory')} && "
            f"quantity({r}.requests.memory).compareTo(quantity({r}.limits.memory)) != 0")


def findings_expression(s: str) -> str:
    """The list of the rule's finding heads (``<label>: memory request X differs from
    limit Y``) over pod spec ``s``, in the rule's order."""
    parts = []
    for items, var, label in _holders(s):
        r = f"{var}.resources"
        parts.append(f"{items}.filter({var}, {_differs(r)}).map({var}, {label} + "
                     f"\": memory request \" + {r}.requests.memory + \" differs from limit \" + "
                     f"{r}.limits.memory)")
    return "(" + " + ".join(parts) + ")"


def pod_level_clause() -> str:
    """Over pod spec ``s``: the pod-level resources leave the judged memory as written —
    a Pod (defaulted already) without a pod-level memory limit lacking its request, a
    template without pod-level requests and limits or with both memory values written."""
    pod_level = "has(s.resources)"
    nonempty = ("((has(s.resources.requests) && size(s.resources.requests) > 0) || "
                "(has(s.resources.limits) && size(s.resources.limits) > 0))")
    request = in_section("s.resources", "requests", "memory")
    limit = in_section("s.resources", "limits", "memory")
    return (f"(object.kind == \"Pod\" ? !({pod_level} && {limit} && !{request}) : "
            f"!({pod_level} && {nonempty}) || ({pod_level} && {request} && {limit}))")


def _domain(rule_id: str, mode: Mode, policy: Policy) -> str:
    """The writes the policy answers exactly (see the module's docstring)."""
    body = [pod_level_clause()]
    if mode is Mode.WARN:
        body.append(f"size({findings_expression('s')}) <= 1")
    limit_ranger = lit("kubernetes.io/limit-ranger")
    kinds = sorted(f"{group}/{kind}" for group, kind in WORKLOAD_KINDS)
    parts = [
        "request.operation == \"CREATE\"",
        f"(request.kind.group + \"/\" + request.kind.kind) in {json.dumps(kinds)}",
        *exemption_clauses(policy, [rule_id]),
        not_owned_by_deployment(),
        f"!(object.kind == \"Pod\" && {has_path('object', 'metadata', 'annotations')} && "
        f"{limit_ranger} in object.metadata.annotations)",
        template_exists(" && ".join(body)),
    ]
    return " && ".join(parts)


def _message(rule_id: str, mode: Mode) -> str:
    """The webhook's text: a refusal joins ``<message> [<rule>]`` with ``"; "``
    (``app.serve.admission.decide``); a warning is ``envelope[<rule>]: `` and the message cut
    as ``app.k8s.util.brief`` cuts it (the message holds one ``"; "``, after the head, and no
    ``". "``: labels are DNS names, quantities have no spaces)."""
    found = "variables.found"
    if mode is Mode.ENFORCE:
        return f"{found}.map(h, h + {lit(_TAIL)} + {lit(f' [{rule_id}]')}).join(\"; \")"
    limit = WARNING_LIMIT
    cut = (f"[{found}[0]].map(h, size(h + {lit(_TAIL)}) < {limit} ? h + {lit(_TAIL)} : "
           f"size(h) <= {limit - 1} ? h : (h + {lit(_TAIL)}).substring(0, {limit - 4}) + \"...\")[0]")
    return f"{lit(f'envelope[{rule_id}]: ')} + {cut}"


def _manifests(rule_id: str, mode: Mode, domain: str, excluded: Sequence[str],
               required: Sequence[dict[str, Any]], failure_policy: str) -> list[dict[str, Any]]:
    name = policy_name(rule_id)
    labels = {"app.kubernetes.io/name": "envelope"}
    rules = [{**r, "operations": ["CREATE"]} for r in resource_rules()]
    spec_of = ("object.kind == \"Pod\" ? object.spec : object.kind == \"CronJob\" ? "
               "object.spec.jobTemplate.spec.template.spec : object.spec.template.spec")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": failure_policy,
            "matchConstraints": {"resourceRules": rules,
                                 "namespaceSelector": namespace_selector(excluded)},
            "matchConditions": [{"name": DOMAIN_CONDITION, "expression": domain}],
            "variables": [{"name": "s", "expression": spec_of},
                          {"name": "found", "expression": findings_expression("variables.s")}],
            "validations": [{"expression": "size(variables.found) == 0",
                             "messageExpression": _message(rule_id, mode),
                             "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name,
                 "validationActions": ["Deny"] if mode is Mode.ENFORCE else ["Warn"],
                 "matchResources": {"namespaceSelector": namespace_selector(excluded, required)}},
    }
    return [policy, binding]


def compile_validating(rules: RuleSet, policy: Policy, *,
                       excluded_namespaces: Sequence[str] = ("kube-system",),
                       failure_policy: str = "Fail") -> CompiledValidation:
    """The ValidatingAdmissionPolicies and bindings for ``policy``'s compilable validate
    rules. ``excluded_namespaces`` must be the validating webhook's."""
    modes = rules.modes(policy)
    on = {rid: modes[rid] for rid, r in rules.items()
          if r.phase == "validate" and r.kinds & WORKLOAD_KINDS and modes[rid] is not Mode.OFF}
    compiled = {rid: on[rid] for rid in COMPILABLE if rid in on}
    why = {rid: _WHY.get(rid, _CROSS_OBJECT) for rid in on if rid not in compiled}
    if not compiled:
        return CompiledValidation({}, why)
    required = [{"key": FACT_LABEL, "operator": "In", "values": [FACT_VALUE]},
                *exception_requirements(policy, list(compiled))]
    domains = {rid: _domain(rid, mode, policy) for rid, mode in compiled.items()}
    warned = [rid for rid, mode in compiled.items() if mode is Mode.WARN]
    if len(warned) > 1:
        # One path skips every warned rule, so each Warn policy answers only where all do:
        # elsewhere the webhook warns for all of them, and no policy may warn again.
        both = " && ".join(f"({domains[rid]})" for rid in warned)
        domains.update(dict.fromkeys(warned, both))
    manifests = []
    for rid, mode in compiled.items():
        manifests += _manifests(rid, mode, domains[rid], excluded_namespaces, required,
                                failure_policy)
    return CompiledValidation(compiled, why, domains, manifests, required)


@dataclass(frozen=True)
class Entry:
    """One entry of the partitioned validating webhook, relative to the one it replaces."""

    suffix: str
    """Added to the first label of the webhook's name ("" keeps the name)."""
    requirements: list[dict[str, Any]]
    """matchExpressions added to the webhook's namespaceSelector."""
    conditions: list[dict[str, str]]
    """matchConditions added to the webhook's."""
    path: str
    """The webhook's path: ``/validate``, or the in-tree path that skips the Warn rules."""


def partition(compiled: CompiledValidation) -> list[Entry]:
    """How the validating webhook is split so that every write reaches exactly one entry:
    (a) namespaces without the fact — as before; (a') with the fact, in a namespace an
    exception's namespaceSelector may exempt (not in the binding) — as before, one entry
    per requirement, each the complement of one; (b) the rest, outside the Warn
    policies' domain — as before; (c) the rest, inside it — ``/validate/in-tree/<ids>``,
    which skips the rules the policies warn for. One entry, as before, when no policy
    warns (Deny needs no change: the policy refuses first)."""
    warned = compiled.warned
    if not warned:
        return [Entry("", [], [], "/validate")]
    fact, *extra = compiled.namespace_requirements
    out = [Entry("", [{"key": fact["key"], "operator": "NotIn", "values": fact["values"]}], [],
                 "/validate")]
    for i, requirement in enumerate(extra):
        flipped = {"key": requirement["key"], "operator": _FLIP[requirement["operator"]]}
        if "values" in requirement:
            flipped["values"] = requirement["values"]
        out.append(Entry(f"-exempt{i}", [fact, *extra[:i], flipped], [], "/validate"))
    domain = compiled.skip_domain()
    inside = [fact, *extra]
    out.append(Entry("-outside", inside, [{"name": "envelope-not-in-tree",
                                           "expression": f"!({domain})"}], "/validate"))
    out.append(Entry("-in-tree", inside, [{"name": "envelope-in-tree", "expression": domain}],
                     VALIDATE_PATH + ",".join(warned)))
    return out


def webhook_partition(hook: dict[str, Any], compiled: CompiledValidation) -> list[dict[str, Any]]:
    """The validating webhook entry ``hook`` split as :func:`partition` says (its
    namespaceSelector gets the requirements, its matchConditions the conditions, its
    ``/validate`` path the entry's path)."""
    out = []
    for entry in partition(compiled):
        selector = dict(hook.get("namespaceSelector") or {})
        selector["matchExpressions"] = [*(selector.get("matchExpressions") or []),
                                        *entry.requirements]
        client = dict(hook["clientConfig"])
        if "service" in client:
            client["service"] = {**client["service"], "path": entry.path}
        else:
            client["url"] = client["url"].rsplit("/validate", 1)[0] + entry.path
        made = {**hook, "name": renamed(hook["name"], entry.suffix),
                "namespaceSelector": selector, "clientConfig": client}
        conditions = [*(hook.get("matchConditions") or []), *entry.conditions]
        if conditions:
            made["matchConditions"] = conditions
        out.append(made)
    return out


def webhook_json_patch(compiled: CompiledValidation, hook_name: str,
                       index: int = 0) -> list[dict[str, Any]]:
    """An RFC 6902 patch (``kubectl patch validatingwebhookconfiguration <name>
    --type=json``) that splits the configuration's webhook ``hook_name`` at ``index`` as
    :func:`partition` says, copying it (so its clientConfig, rules and failure policy stay
    the chart's); its first operation tests the name, so a patch for another layout
    fails rather than splitting the wrong webhook. Empty when nothing needs a split."""
    entries = partition(compiled)
    if len(entries) == 1:
        return []
    ops: list[dict[str, Any]] = [{"op": "test", "path": f"/webhooks/{index}/name", "value": hook_name}]
    for _ in entries[1:]:
        ops.append({"op": "copy", "from": f"/webhooks/{index}", "path": f"/webhooks/{index + 1}"})
    for at, entry in enumerate(entries, start=index):
        base = f"/webhooks/{at}"
        if entry.suffix:
            ops.append({"op": "replace", "path": f"{base}/name",
                        "value": renamed(hook_name, entry.suffix)})
        ops += [{"op": "add", "path": f"{base}/namespaceSelector/matchExpressions/-", "value": r}
                for r in entry.requirements]
        if entry.conditions:
            ops.append({"op": "add", "path": f"{base}/matchConditions", "value": entry.conditions})
        if entry.path != "/validate":
            ops.append({"op": "replace", "path": f"{base}/clientConfig/service/path",
                        "value": entry.path})
    return ops


_FLIP = {"In": "NotIn", "NotIn": "In", "Exists": "DoesNotExist", "DoesNotExist": "Exists"}


def renamed(name: str, suffix: str) -> str:
    """``workloads.validate.envelope.io`` + ``-in-tree`` ->
    ``workloads-in-tree.validate.envelope.io``: webhook names stay unique within a
    configuration and fully qualified."""
    head, dot, rest = name.partition(".")
    return f"{head}{suffix}{dot}{rest}"
