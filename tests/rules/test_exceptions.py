"""``exception-allowed``: an EnvelopeException may name only the rules, in only the
namespaces, the policy's ``delegatedExceptions`` allows; the message names the refused rule
and the allowed ones."""

from __future__ import annotations

from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from tests.conftest import run

RULE = "memory-request-equals-limit"


def exception(namespace: str = "team-a", rules: list[str] | None = None,
              annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "vendor", "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "envelope.io/v1alpha1", "kind": "EnvelopeException", "metadata": meta,
            "spec": {"rules": rules or [RULE], "match": {"names": ["grafana"]}, **spec}}


def delegating(**where: Any) -> Policy:
    return Policy.model_validate({"delegatedExceptions": {
        "allowedRules": [RULE, "cpu-limits"], **(where or {"namespaces": ["*"]})}})


def messages(result: Any) -> list[str]:
    return [f"{f.path}: {f.message}" for f in result.errors if f.rule == "exception-allowed"]


def test_an_allowed_exception_is_admitted() -> None:
    result = run(exception(), delegating())
    assert messages(result) == []
    assert result.results["exception-allowed"] == "skip"  # within what the policy delegates


def test_without_delegation_every_exception_is_refused() -> None:
    [message] = messages(run(exception(), Policy()))
    assert "delegates no exceptions" in message and "delegatedExceptions" in message


def test_a_rule_outside_what_the_platform_allows_is_refused_by_name() -> None:
    [message] = messages(run(exception(rules=["cpu-limits", "pod-fits-node"]), delegating()))
    assert message.startswith("spec.rules[1]: pod-fits-node is not a rule the platform lets")
    assert f"allowedRules allows 2 ({RULE}, cpu-limits)" in message


@pytest.mark.parametrize(("where", "labels", "refused"), [
    ({"namespaces": ["team-b"]}, {}, True),
    ({"namespaces": ["team-a"]}, {}, False),
    ({"namespaceSelector": {"matchLabels": {"tenancy": "delegated"}}}, {"tenancy": "delegated"}, False),
    ({"namespaceSelector": {"matchLabels": {"tenancy": "delegated"}}}, {"tenancy": "platform"}, True),
])
def test_the_namespace_must_be_delegated(where: dict[str, Any], labels: dict[str, str],
                                         refused: bool) -> None:
    view = StaticView([{"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": "team-a", "labels": labels}}])
    found = messages(run(exception(), delegating(**where), view=view))
    assert bool(found) is refused, found
    if refused:
        assert found[0].startswith("metadata.namespace: the cluster policy does not delegate "
                                   "exceptions to namespace team-a")


@pytest.mark.parametrize(("spec", "field"), [
    ({"match": {}}, "spec.match"),
    ({"match": {"names": ["a"] * 33}}, "spec.match.names"),
    ({"expires": "next week"}, "spec.expires"),
    ({"match": {"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
     "spec.match.selector"),
    ({"match": {"selector": {"matchLabels": {f"k{i}": "v" * 250 for i in range(100)}}}}, "spec"),
])
def test_a_malformed_exception_is_refused_saying_what(spec: dict[str, Any], field: str) -> None:
    found = messages(run(exception(**spec), delegating()))
    assert any(m.startswith(f"{field}: ") for m in found), found


def test_no_annotation_or_policy_exception_exempts_an_exception() -> None:
    """An EnvelopeException is how exemptions are granted: its own exempt annotation, or a
    policy exception by kind, does not let it past the check."""
    policy = Policy.model_validate({
        "delegatedExceptions": {"allowedRules": ["cpu-limits"], "namespaces": ["*"]},
        "exceptions": [{"rules": ["*"], "kinds": ["EnvelopeException"]}]})
    obj = exception(annotations={"envelope.io/exempt": "exception-allowed"})
    assert messages(run(obj, policy))


def test_an_update_keeps_what_the_old_exception_had_as_a_warning() -> None:
    """The policy narrowed after the exception was stored: a label change is not refused."""
    old = exception(rules=[RULE])
    new = exception(rules=[RULE])
    new["metadata"]["labels"] = {"team": "a"}
    narrowed = Policy.model_validate({"delegatedExceptions": {"allowedRules": ["cpu-limits"],
                                                              "namespaces": ["*"]}})
    assert messages(run(new, narrowed, operation="UPDATE", old=old)) == []
    changed = exception(rules=[RULE, "pod-fits-node"])
    assert messages(run(changed, narrowed, operation="UPDATE", old=old))
