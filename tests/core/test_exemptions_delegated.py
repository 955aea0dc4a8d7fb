"""Delegated exceptions (issue 35, point 3): an EnvelopeException in a namespace exempts the
workloads it matches from the rules it names — only those the policy's
``delegatedExceptions`` allows, only in the namespaces it delegates to — and the answer
says which exception excused what."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import ConfigError, Policy, parse_policy
from app.core.engine import evaluate
from app.core.exemptions import watched_for
from app.serve.admission import decide
from tests.conftest import RULES, container, run, subject, workload

RULE = "memory-request-equals-limit"
BAD_MEMORY = container(requests={"memory": "1Gi"}, limits={"memory": "2Gi", "cpu": "2"})


def deployment(namespace: str = "team-a", name: str = "grafana",
               labels: dict[str, str] | None = None) -> dict[str, Any]:
    obj = workload("Deployment", [BAD_MEMORY], namespace=namespace, name=name)
    if labels is not None:
        obj["metadata"]["labels"] = labels
    return obj


def exception(namespace: str = "team-a", name: str = "vendor", rules: list[str] | None = None,
              **match: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"rules": rules or [RULE], "match": match or {"names": ["grafana"]},
                            "reason": "vendor chart"}
    return {"apiVersion": "envelope.io/v1alpha1", "kind": "EnvelopeException",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def delegating(**extra: Any) -> Policy:
    return Policy.model_validate({"delegatedExceptions": {"allowedRules": [RULE],
                                                          "namespaces": ["*"], **extra}})


def errors(result: Any) -> set[str]:
    return {f.rule for f in result.errors}


def test_without_delegation_an_exception_exempts_nothing() -> None:
    view = StaticView([exception()])
    assert errors(run(deployment(), Policy(), view=view)) == {RULE}


def test_an_allowed_exception_excuses_the_workload_and_says_which() -> None:
    result = run(deployment(), delegating(), view=StaticView([exception()]))
    assert errors(result) == set()
    assert result.skipped == {RULE: "EnvelopeException team-a/vendor: vendor chart"}
    assert result.results[RULE] == "skip"
    warnings = decide(result, "deny").warnings or []
    assert f"envelope[{RULE}]: not judged: excused by EnvelopeException team-a/vendor: " \
           f"vendor chart" in warnings


@pytest.mark.parametrize(("obj", "stored", "excused"), [
    (deployment(), exception(namespace="team-b"), False),  # another namespace's exception
    (deployment(name="prometheus"), exception(), False),  # another name
    (deployment(name="grafana-7d9f"), exception(names=["grafana-*"]), True),  # wildcard
    (deployment(), exception(names=["grafana"], kinds=["StatefulSet"]), False),  # every condition
    (deployment(), exception(names=["grafana"], kinds=["apps/Deployment"]), True),
    (deployment(labels={"app": "grafana"}), exception(selector={"matchLabels": {"app": "grafana"}}),
     True),
    (deployment(labels={"app": "loki"}), exception(selector={"matchLabels": {"app": "grafana"}}),
     False),
    (deployment(), exception(rules=["cpu-limits"]), False),  # names another rule
    (deployment(), {**exception(), "spec": {"rules": [RULE], "match": {}}}, False),  # malformed
])
def test_what_an_exception_covers(obj: dict[str, Any], stored: dict[str, Any], excused: bool) -> None:
    policy = Policy.model_validate({"delegatedExceptions": {
        "allowedRules": [RULE, "cpu-limits"], "namespaces": ["*"]}})
    assert (errors(run(obj, policy, view=StaticView([stored]))) == set()) is excused


def test_a_pod_made_from_generate_name_is_matched_by_its_prefix_before_it_has_a_name() -> None:
    """At the mutating webhook a controller's Pod has only generateName (grafana-7d9f-):
    ``grafana-*`` covers it there and, once named, at the validating webhook."""
    pod = workload("Pod", [BAD_MEMORY], namespace="team-a", name="")
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "grafana-7d9f-"
    stored = exception(rules=["cpu-limits"], names=["grafana-*"], kinds=["Pod"])
    policy = Policy.model_validate({"delegatedExceptions": {"allowedRules": ["cpu-limits"],
                                                            "namespaces": ["*"]}})
    mutated = evaluate(RULES, subject(pod), StaticView([stored]), policy, "mutate")
    assert mutated.skipped == {"cpu-limits": "EnvelopeException team-a/vendor: vendor chart"}
    assert mutated.patch == [] or all("cpu" not in op["path"] for op in mutated.patch)
    other = exception(rules=["cpu-limits"], names=["loki-*"], kinds=["Pod"])
    assert evaluate(RULES, subject(pod), StaticView([other]), policy, "mutate").skipped == {}


def test_a_rule_the_policy_does_not_allow_is_not_excused_even_if_stored() -> None:
    """An exception that got in before the policy narrowed exempts only what it allows now."""
    stored = exception(rules=[RULE, "cpu-limits"])
    policy = Policy.model_validate({"delegatedExceptions": {"allowedRules": ["cpu-limits"],
                                                            "namespaces": ["*"]}})
    result = run(deployment(), policy, view=StaticView([stored]))
    assert errors(result) == {RULE}
    assert set(result.skipped) == {"cpu-limits"}


def test_namespaces_and_selector_decide_where_it_is_honoured() -> None:
    stored = [exception(), exception(namespace="team-b")]
    by_name = Policy.model_validate({"delegatedExceptions": {"allowedRules": [RULE],
                                                             "namespaces": ["team-b"]}})
    assert errors(run(deployment("team-a"), by_name, view=StaticView(stored))) == {RULE}
    assert errors(run(deployment("team-b"), by_name, view=StaticView(stored))) == set()
    by_label = delegating(namespaceSelector={"matchLabels": {"tenancy": "delegated"}})
    view = StaticView([*stored, namespace("team-a", {"tenancy": "delegated"}),
                       namespace("team-b", {})])
    assert errors(run(deployment("team-a"), by_label, view=view)) == set()
    assert errors(run(deployment("team-b"), by_label, view=view)) == {RULE}
    # an unknown namespace matches no selector
    assert errors(run(deployment("team-a"), by_label, view=StaticView(stored))) == {RULE}


def test_an_expired_exception_exempts_nothing() -> None:
    past = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)).isoformat()
    future = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    for when, excused in ((past, False), (future, True)):
        stored = exception()
        stored["spec"]["expires"] = when
        assert (errors(run(deployment(), delegating(), view=StaticView([stored]))) == set()) \
            is excused


def test_the_policy_key_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"delegatedExceptions.allowedRules: unknown rule id"):
        parse_policy("delegatedExceptions: {allowedRules: [memory-request-equal-limit], "
                     "namespaces: ['*']}", "p.yaml", {}, RULES)
    with pytest.raises(ConfigError, match="needs namespaces"):
        parse_policy("delegatedExceptions: {allowedRules: [cpu-limits]}", "p.yaml", {}, RULES)
    with pytest.raises(ConfigError, match="is not allowed"):
        parse_policy("delegatedExceptions: {allowedRules: ['*'], namespaces: ['*']}", "p.yaml",
                     {}, RULES)


def test_what_the_view_watches_follows_the_policy() -> None:
    assert watched_for(Policy()) == set()
    assert watched_for(delegating()) == {"EnvelopeException"}
    assert watched_for(delegating(namespaceSelector={"matchLabels": {"a": "b"}})) == \
        {"EnvelopeException", "Namespace"}
