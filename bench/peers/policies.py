"""Envelope's workload mutation written for the peers users would pick instead.

What Envelope's mutate phase does to a workload (``app/rules/workloads/``):

- ``cpu-limits``: remove ``limits.cpu`` from every container, init container and the
  pod-level resources; where no CPU request is written, the removed limit becomes the
  request; not when the opt-out annotation (object or pod template) is ``"true"``;
- ``memory-limit``: a memory request without a memory limit gets a limit equal to it;
- ``env-envelope-cpu``: ``cpu`` pairs removed from the ``RESOURCE_LIMITS`` string.
  Not expressed here (a string rewrite of ``key=value`` pairs is not something a
  JSON patch or a Kyverno foreach can say without re-implementing the parser); the
  benchmark's object leaves such strings out (``bench/peers/objects.py``).

The same three jobs as:

- :func:`mutating_admission_policy`: ``admissionregistration.k8s.io/v1`` (GA in 1.36)
  MutatingAdmissionPolicy + binding, one JSONPatch CEL mutation (in the API server);
- :func:`kyverno_mutating_policy`: Kyverno's CEL ``MutatingPolicy``
  (``policies.kyverno.io/v1``), the same CEL;
- :func:`kyverno_cluster_policy`: a classic Kyverno ``ClusterPolicy`` with ``foreach``
  rules (JMESPath, strategic merge to add, RFC 6902 to remove).

All three match Deployments only (what the benchmark writes).
"""

from __future__ import annotations

from typing import Any

OPT_OUT = "envelope.io/keep-cpu-limit"
NAME = "envelope-peer"
POD = "object.spec.template.spec"
POINTER = "/spec/template/spec"
FIELDS = ("initContainers", "containers")

_DEPLOYMENTS = {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["deployments"]}


def _annotated(meta: str) -> str:
    return (f"(has({meta}.annotations) && \"{OPT_OUT}\" in {meta}.annotations && "
            f"{meta}.annotations[\"{OPT_OUT}\"].matches(r'^\\s*(?i:true)\\s*$'))")


def _cpu_limit(r: str) -> str:
    return f"has({r}.limits) && \"cpu\" in {r}.limits"


def _patch(op: str, path: str, value: str | None = None) -> str:
    """A CEL ``JSONPatch`` literal; ``path`` is a CEL string expression."""
    tail = f", value: {value}}}" if value else "}"
    return f'JSONPatch{{op: "{op}", path: {path}' + tail


def _add_under(r: str, path: str, section: str, key: str, value: str) -> str:
    """Add ``section.key``, or the whole ``section`` map when it is absent."""
    whole = f'{{"{key}": {value}}}'
    one = path + " + " + _q(section + "/" + key)
    return (f"has({r}.{section}) ? {_patch('add', one, value)} : "
            f"{_patch('add', path + ' + ' + _q(section), whole)}")


def _q(text: str) -> str:
    """A CEL string literal ``"/text"``."""
    return f'"/{text}"'


def _list_ops(field: str) -> str:
    """JSON patch ops for one container list: CPU request from the limit, limit removed,
    memory limit from the request. Indices from the k8s CEL lists library (indexOf)."""
    items = f"{POD}.{field}"
    at = f'"{POINTER}/{field}/" + string({items}.indexOf(c)) + "/resources"'
    r = "c.resources"
    cpu_value = r + '.limits["cpu"]'
    with_cpu = f"{items}.filter(c, has({r}) && {_cpu_limit(r)})"
    no_request = f'!(has({r}.requests) && "cpu" in {r}.requests)'
    request = (f"{with_cpu}.filter(c, {no_request})"
               f".map(c, {_add_under(r, at, 'requests', 'cpu', cpu_value)})")
    remove = f"{with_cpu}.map(c, {_patch('remove', at + ' + ' + _q('limits/cpu'))})"
    memory_value = r + '.requests["memory"]'
    memory = (f"{items}.filter(c, has({r}) && {_memory_without_limit(r)})"
              f".map(c, {_add_under(r, at, 'limits', 'memory', memory_value)})")
    return f"(has({items}) ? (optedOut ? [] : {request} + {remove}) + {memory} : [])"


def _memory_without_limit(r: str) -> str:
    return (f'has({r}.requests) && "memory" in {r}.requests && '
            f'!(has({r}.limits) && "memory" in {r}.limits)')


def _pod_level_ops() -> str:
    r = f"{POD}.resources"
    at = f'"{POINTER}/resources"'
    cpu_value, memory_value = r + '.limits["cpu"]', r + '.requests["memory"]'
    request = (f'has({r}.requests) && "cpu" in {r}.requests ? [] : '
               f"[{_add_under(r, at, 'requests', 'cpu', cpu_value)}]")
    cpu = (f"(has({r}) && {_cpu_limit(r)} && !optedOut ? "
           f"({request}) + [{_patch('remove', at + ' + ' + _q('limits/cpu'))}] : [])")
    memory = (f"(has({r}) && {_memory_without_limit(r)} ? "
              f"[{_add_under(r, at, 'limits', 'memory', memory_value)}] : [])")
    return f"{cpu} + {memory}"


def json_patch_expression() -> str:
    """The CEL JSONPatch mutation (MutatingAdmissionPolicy and Kyverno MutatingPolicy):
    one list of ops, built from the object as admitted. ``optedOut`` is written out in
    place (both engines' ``variables`` would do, but one expression keeps them equal)."""
    body = " + ".join([*(_list_ops(f) for f in FIELDS), _pod_level_ops()])
    template = POD.removesuffix(".spec")
    opted = (f"({_annotated('object.metadata')} || "
             f"(has({template}.metadata) && {_annotated(template + '.metadata')}))")
    return body.replace("optedOut", opted)


def mutating_admission_policy() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": NAME},
         "spec": {"matchConstraints": {"resourceRules": [_DEPLOYMENTS]},
                  "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "mutations": [{"patchType": "JSONPatch",
                                 "jsonPatch": {"expression": json_patch_expression()}}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": NAME},
         "spec": {"policyName": NAME}},
    ]


def kyverno_mutating_policy() -> dict[str, Any]:
    return {"apiVersion": "policies.kyverno.io/v1", "kind": "MutatingPolicy",
            "metadata": {"name": NAME},
            "spec": {"failurePolicy": "Fail",
                     "autogen": {"podControllers": {"controllers": []}},
                     "matchConstraints": {"resourceRules": [_DEPLOYMENTS]},
                     "mutations": [{"patchType": "JSONPatch",
                                    "jsonPatch": {"expression": json_patch_expression()}}]}}


def _not_true(meta: str) -> dict[str, str]:
    return {"key": f"{{{{ {meta}.annotations.\"{OPT_OUT}\" || '' | to_lower(@) | trim(@, ' ') }}}}",
            "operator": "NotEquals", "value": "true"}


def _set(expr: str) -> dict[str, str]:
    return {"key": f"{{{{ {expr} || '' }}}}", "operator": "NotEquals", "value": ""}


def _unset(expr: str) -> dict[str, str]:
    return {"key": f"{{{{ {expr} || '' }}}}", "operator": "Equals", "value": ""}


_NOT_OPTED_OUT = {"all": [_not_true("request.object.metadata"),
                          _not_true("request.object.spec.template.metadata")]}


def _match() -> dict[str, Any]:
    return {"any": [{"resources": {"kinds": ["apps/v1/Deployment"], "operations": ["CREATE"]}}]}


def _foreach_rule(name: str, field: str, entries: list[tuple[list[dict[str, Any]], str]],
                  opt_out: bool) -> dict[str, Any]:
    """One rule, one foreach entry per (preconditions, RFC 6902 patch) over ``field``."""
    each = [{"list": f"request.object.spec.template.spec.{field} || `[]`",
             "preconditions": {"all": preconditions}, "patchesJson6902": patch}
            for preconditions, patch in entries]
    rule: dict[str, Any] = {"name": name, "match": _match(), "mutate": {"foreach": each}}
    if opt_out:
        rule["preconditions"] = _NOT_OPTED_OUT
    return rule


def _present(expr: str, present: bool) -> dict[str, Any]:
    return {"key": f"{{{{ {expr} == null }}}}", "operator": "Equals", "value": not present}


def _pod_resources_merge(section: str, key: str, value: str) -> dict[str, Any]:
    return {"patchStrategicMerge": {"spec": {"template": {"spec": {"resources": {
        section: {key: f"{{{{ {value} }}}}"}}}}}}}


def kyverno_cluster_policy() -> dict[str, Any]:
    """Per container list, RFC 6902 by ``elementIndex``: request from limit, limit
    removed (a strategic-merge ``limits: {}`` cannot remove a key), memory limit from
    request; then the pod-level resources (strategic merge, not a list). Not strategic
    merge for container lists: a foreach strategic-merge patch stores the patched
    container first, so the containers come back reordered (and a later index-based
    patch hits the wrong one) — seen in the same-answer check."""
    e = "element.resources"
    rules = []
    for field in FIELDS:
        short = "init" if field == "initContainers" else "containers"
        at = f"/spec/template/spec/{field}/{{{{ elementIndex }}}}/resources"

        def add(section: str, key: str, value: str, whole: bool, at: str = at) -> str:
            if whole:
                return f'- op: add\n  path: {at}/{section}\n  value: {{"{key}": "{{{{ {value} }}}}"}}\n'
            return f'- op: add\n  path: {at}/{section}/{key}\n  value: "{{{{ {value} }}}}"\n'

        cpu = [_set(f"{e}.limits.cpu"), _unset(f"{e}.requests.cpu")]
        memory = [_set(f"{e}.requests.memory"), _unset(f"{e}.limits.memory")]
        rules += [
            _foreach_rule(f"{short}-cpu-request", field, [
                ([*cpu, _present(f"{e}.requests", True)], add("requests", "cpu", f"{e}.limits.cpu", False)),
                ([*cpu, _present(f"{e}.requests", False)], add("requests", "cpu", f"{e}.limits.cpu", True)),
            ], True),
            _foreach_rule(f"{short}-cpu-limit", field, [
                ([_set(f"{e}.limits.cpu")], f"- op: remove\n  path: {at}/limits/cpu\n")], True),
            _foreach_rule(f"{short}-memory-limit", field, [
                ([*memory, _present(f"{e}.limits", True)],
                 add("limits", "memory", f"{e}.requests.memory", False)),
                ([*memory, _present(f"{e}.limits", False)],
                 add("limits", "memory", f"{e}.requests.memory", True)),
            ], False),
        ]
    pod = "request.object.spec.template.spec.resources"
    opted = _NOT_OPTED_OUT["all"]
    rules += [
        {"name": "pod-cpu-request", "match": _match(),
         "preconditions": {"all": [*opted, _set(f"{pod}.limits.cpu"), _unset(f"{pod}.requests.cpu")]},
         "mutate": _pod_resources_merge("requests", "cpu", f"{pod}.limits.cpu")},
        {"name": "pod-cpu-limit", "match": _match(),
         "preconditions": {"all": [*opted, _set(f"{pod}.limits.cpu")]},
         "mutate": {"patchesJson6902": "- op: remove\n  path: /spec/template/spec/resources/limits/cpu\n"}},
        {"name": "pod-memory-limit", "match": _match(),
         "preconditions": {"all": [_set(f"{pod}.requests.memory"), _unset(f"{pod}.limits.memory")]},
         "mutate": _pod_resources_merge("limits", "memory", f"{pod}.requests.memory")},
    ]
    return {"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy", "metadata": {"name": NAME},
            "spec": {"background": False, "admission": True, "emitWarning": False, "rules": rules}}
