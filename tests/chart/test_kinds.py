"""The chart sends the webhooks exactly what the rules judge, and grants exactly what
they read.

``helm template`` (the real helm, found as ``tests/chart/test_chart.py`` finds it) with the
defaults and the common overrides; from the rendered objects:

- every (webhook, group, version, resource, operation, scope) the webhook
  configurations match must be one some rule of that webhook's family and phase judges
  (``Rule.kinds`` x ``Rule.operations``, resources and scope from ``app/k8s/kinds.py``),
  and every one the rules judge must be matched — for each family that is switched on;
- the webhook's ClusterRole reads exactly the kinds the rules read (and Namespaces, for
  exceptions that select namespaces by label); the audit's reads those and every kind
  the rules judge.

The expectations are computed here from the rule declarations, not from
``charts/envelope/files/kinds.yaml`` (which the chart reads): a generator bug fails too.
A second test keeps that file what ``python -m app.chart.kinds --write`` writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.chart import kinds as chartkinds
from app.core.config import Mode
from app.core.ruleset import RuleSet, default_ruleset
from app.k8s.kinds import by_ref, read_kinds
from app.ruledocs import family
from app.rules.base import Rule
from tests.helpers.chart import CASES, deep_merge, render

RULES = default_ruleset()
READ = {"get", "list", "watch"}
HOOKS = {"workloads": ("mutate", "validate"), "quotas": ("validate",), "actors": ("validate",)}
#: Families switched on by a top-level value instead of ``webhooks.<family>.enabled``
#: (default off).
TOP_LEVEL = {"exceptions": ("validate",)}

Match = tuple[str, str, str, str, str, str]
"""(webhook, group, version, resource, operation, scope)."""


def judged(rules: RuleSet, families: set[str]) -> set[Match]:
    out: set[Match] = set()
    for r in rules.values():
        fam = family(r)
        if fam not in families:
            continue
        for group, kind_name in r.kinds:
            kind = by_ref(group, kind_name)
            assert kind is not None, f"{r.id} judges {group}/{kind_name}, which app/k8s/kinds.py lacks"
            resources = (kind.resource, *(f"{kind.resource}/{s}" for s in kind.subresources))
            out |= {(f"{fam}.{r.phase}.envelope.io", group, kind.version, res, op, kind.scope)
                    for op in r.operations for res in resources}
    return out


def matched(rendered: Any) -> set[Match]:
    out: set[Match] = set()
    for name, hook in rendered.webhooks().items():
        for rule in hook["rules"]:
            out |= {(name, g, v, res, op, rule["scope"]) for g in rule["apiGroups"]
                    for v in rule["apiVersions"] for res in rule["resources"]
                    for op in rule["operations"]}
    return out


def read_resources(names: set[str]) -> set[tuple[str, str]]:
    return {(k.group, k.resource) for k in read_kinds(names)}


def _aggregated(role: dict[str, Any]) -> list[str]:
    """The built-in roles a ClusterRole is aggregated into (the exceptions' write and view
    roles: what namespace users get, not the webhook's or the audit's own)."""
    prefix = "rbac.authorization.k8s.io/aggregate-to-"
    return sorted(k.removeprefix(prefix) for k in role["metadata"].get("labels", {})
                  if k.startswith(prefix))


def cluster_reads(rendered: Any, audit: bool) -> set[tuple[str, str]]:
    roles = [d for d in rendered.of("ClusterRole") if d["metadata"]["name"].endswith("-audit") == audit
             and not _aggregated(d)]
    assert len(roles) == 1, [d["metadata"]["name"] for d in rendered.of("ClusterRole")]
    out: set[tuple[str, str]] = set()
    for rule in roles[0]["rules"]:
        if rule.get("resourceNames"):  # the webhook's own configurations (raised, watched by name)
            assert rule["apiGroups"] == ["admissionregistration.k8s.io"], rule
        elif "watch" in rule["verbs"]:
            assert set(rule["verbs"]) == READ, rule
            out |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
        else:  # the audit's reports: not a kind's reads
            assert rule.get("nonResourceURLs") or rule["apiGroups"] == ["wgpolicyk8s.io"], rule
    return out


OVERRIDES: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{case: CASES[case] for case in ("workloads-off", "quotas-off", "actors-off",
                                      "all-families-off", "self", "certManager", "customised")},
    "audit": {"audit": {"enabled": True}},
    "audit-quotas-off": {"audit": {"enabled": True}, "webhooks": {"quotas": {"enabled": False}}},
    "exceptions": {"exceptions": {"enabled": True}, "audit": {"enabled": True}},
}


def _families_on(values: dict[str, Any]) -> set[str]:
    hooks = deep_merge({f: {"enabled": True} for f in HOOKS}, values.get("webhooks") or {})
    return {f for f in HOOKS if hooks[f].get("enabled", True)} | \
        {f for f in TOP_LEVEL if (values.get(f) or {}).get("enabled", False)}


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_webhook_rules_are_what_the_rules_judge(case: str) -> None:
    values = OVERRIDES[case]
    rendered = render(values)
    families = _families_on(values)
    want, got = judged(RULES, families), matched(rendered)
    assert got - want == set(), f"sent to the webhook, judged by no rule: {sorted(got - want)}"
    assert want - got == set(), f"judged by a rule, never sent: {sorted(want - got)}"


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_rbac_reads_are_what_the_rules_read(case: str) -> None:
    rendered = render(OVERRIDES[case])
    reads = RULES.reads | {"Namespace"}
    # EnvelopeExceptions: the webhook reads them only when they are installed
    delegated = {"EnvelopeException"} if "exceptions" in _families_on(OVERRIDES[case]) else set()
    assert cluster_reads(rendered, audit=False) == read_resources(set(reads) | delegated)
    if rendered.of("ServiceAccount") and any(d["metadata"]["name"].endswith("-audit")
                                             for d in rendered.of("ClusterRole")):
        judged_kinds = {(k.group, k.resource) for k in (by_ref(*ref) for ref in RULES.kinds) if k}
        assert cluster_reads(rendered, audit=True) == \
            read_resources(set(reads) | {"EnvelopeException"}) | judged_kinds


def test_the_chart_file_is_what_the_generator_writes() -> None:
    written = chartkinds.FILE.read_text()
    assert written == chartkinds.render(RULES), (
        f"{chartkinds.FILE} is not what the rules say: run `python -m app.chart.kinds --write`")


def _reader(reads: set[str]) -> Rule:
    def fn(subject: Any, obj: Any, view: Any, policy: Any) -> list[Any]:
        return []

    fn.__module__ = "app.rules.namespace"  # its family: workloads

    return Rule("reads-runtimeclass", "validate", frozenset({("", "Pod")}), Mode.WARN, fn,
                "test rule", reads=frozenset(reads))


def test_a_rule_reading_runtimeclass_gets_its_rbac_and_watch_from_the_registry_alone() -> None:
    from app.cluster.live import resources_for

    # pod-fits-node reads RuntimeClasses now: the rule set without the rules that do.
    others = [r for r in RULES.values() if "RuntimeClass" not in r.reads]
    rules = RuleSet([*others, _reader({"RuntimeClass"})])
    doc = chartkinds.document(rules)
    assert {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"]} in doc["rbac"]["webhook"]
    assert {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"]} in doc["rbac"]["audit"]
    assert "runtimeclasses" not in str(chartkinds.document(RuleSet(others))["rbac"])  # least privilege
    (watch,) = resources_for({"RuntimeClass"})
    assert watch.path == "/apis/node.k8s.io/v1/runtimeclasses" and not watch.optional


def test_exceptions_are_written_by_namespace_admins_and_read_by_viewers() -> None:
    """exceptions.enabled: the CRD, and two ClusterRoles aggregated into the built-in
    namespace roles (admin writes by default, view reads); off: none of it."""
    assert not render({}).of("CustomResourceDefinition")
    rendered = render(OVERRIDES["exceptions"])
    [crd] = [d for d in rendered.of("CustomResourceDefinition")
             if d["metadata"]["name"] == "envelopeexceptions.envelope.io"]
    kind = by_ref("envelope.io", "EnvelopeException")
    assert kind is not None and crd["spec"]["group"] == kind.group
    assert [v["name"] for v in crd["spec"]["versions"]] == [kind.version]
    assert crd["spec"]["scope"] == kind.scope and crd["spec"]["names"]["plural"] == kind.resource
    by_role = {tuple(_aggregated(d)): d["rules"] for d in rendered.of("ClusterRole") if _aggregated(d)}
    assert set(by_role) == {("admin",), ("view",)}
    assert by_role[("view",)] == [{"apiGroups": ["envelope.io"], "resources": ["envelopeexceptions"],
                                   "verbs": ["get", "list", "watch"]}]
    assert "create" in by_role[("admin",)][0]["verbs"]
    edit = render(deep_merge(OVERRIDES["exceptions"], {"exceptions": {"aggregateTo": ["admin", "edit"]}}))
    assert {tuple(_aggregated(d)) for d in edit.of("ClusterRole") if _aggregated(d)} == \
        {("admin", "edit"), ("view",)}
