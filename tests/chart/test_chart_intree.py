"""The chart's in-tree policy (templates/intree.yaml, files/intree.yaml): rendered only with
inTree.enabled on an API server that serves MutatingAdmissionPolicy v1, the same policy
`envelope webhook-config --in-tree` prints for the chart's default policy, the webhook's
matchConditions shrunk to match, and a refusal for any other policy."""

from __future__ import annotations

from typing import Any

from app.core.config import Policy
from app.core.ruleset import default_ruleset
from app.intree import compile_in_tree
from app.intree.chartfile import stale
from tests.helpers.chart import NAMESPACE, chart_values, render_on

RULES = default_ruleset()
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


_render = render_on


def _mutate_condition(docs: list[dict[str, Any]]) -> str:
    config = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")
    expression: str = config["webhooks"][0]["matchConditions"][0]["expression"]
    return expression


def test_the_chart_file_is_current() -> None:
    assert not stale(RULES), "run python -m app.intree.chartfile --write"


def test_off_by_default_and_without_the_api() -> None:
    code, docs, _ = _render({}, MAP_API)
    assert code == 0 and not [d for d in docs if d["kind"].startswith("MutatingAdmissionPolicy")]
    code, docs, _ = _render({"inTree": {"enabled": True}})
    assert code == 0 and not [d for d in docs if d["kind"].startswith("MutatingAdmissionPolicy")]
    assert "variables.optedOut" not in _mutate_condition(docs)  # the full condition


def test_enabled_renders_what_the_cli_prints() -> None:
    code, docs, err = _render({"inTree": {"enabled": True}}, MAP_API)
    assert code == 0, err
    policy = Policy.model_validate(chart_values()["policy"])
    compiled = compile_in_tree(RULES, policy, excluded_namespaces=["kube-system", NAMESPACE],
                               fact_lease=(NAMESPACE, "envelope-leader-facts"))
    rendered = [d for d in docs if d["kind"].startswith("MutatingAdmissionPolicy")]
    assert [d["kind"] for d in rendered] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    for got, want in zip(rendered, compiled.manifests, strict=True):
        assert got["spec"] | {"policyName": None} == want["spec"] | {"policyName": None} | (
            {"failurePolicy": "Fail"} if want["kind"] == "MutatingAdmissionPolicy" else {})
    assert rendered[1]["spec"]["policyName"] == rendered[0]["metadata"]["name"]
    assert _mutate_condition(docs) == compiled.webhook_condition


def test_another_policy_is_refused_with_the_way_out() -> None:
    code, _, err = _render({"inTree": {"enabled": True}, "policy": {"rules": {"cpu-limits": "warn"}}},
                           MAP_API)
    assert code != 0 and "envelope webhook-config --in-tree" in err
