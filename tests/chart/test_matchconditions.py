"""app/chart/matchconditions.py: which rules add which clause, and `envelope webhook-config`.

That the generated CEL never skips a write /mutate would change is proved on the real
API server in e2e/test_matchconditions.py; here, the generator's bookkeeping."""

from __future__ import annotations

import json

import pytest
import yaml

from app.chart.matchconditions import _CPU_ANY as CPU_ANY
from app.chart.matchconditions import (
    CONDITION_NAME,
    KNOWN_RULES,
    MUTATING_WEBHOOK,
    UnknownRule,
    mutate_expression,
    webhook_config_patch,
)
from app.cli import main
from app.core.config import Policy
from app.core.ruleset import RuleSet, default_ruleset
from app.k8s.podspec import WORKLOAD_KINDS
from app.rules.base import rule, rules_of

RULES = default_ruleset()


def policy(**rules: str) -> Policy:
    return Policy.model_validate({"rules": {k.replace("_", "-"): v for k, v in rules.items()}})


def test_default_policy_names_every_part() -> None:
    expr = mutate_expression(RULES, Policy())
    assert '"cpu" in c.resources.limits' in expr
    assert '"cpu" in s.resources.limits' in expr  # pod-level resources
    assert "s.initContainers" in expr
    assert 'e.name == "RESOURCE_LIMITS"' in expr
    assert '"memory" in c.resources.requests' in expr
    assert '"envelope.io/keep-cpu-limit"' in expr
    assert 'object.kind == "CronJob"' in expr


def test_opt_out_does_not_gate_cpu_limits_while_a_guard_is_on() -> None:
    # The namespace guards report on opted-out workloads too: the CPU clause is bare.
    gated = f"({CPU_ANY} && !("
    expr = mutate_expression(RULES, Policy())
    assert f"exists(s, {CPU_ANY} || " in expr and gated not in expr
    no_guards = mutate_expression(RULES, policy(quota_needs_cpu_limits="off",
                                                limitrange_needs_cpu_limits="off"))
    assert gated in no_guards


def test_rules_that_are_off_add_nothing() -> None:
    off = dict.fromkeys(["cpu-limits", "env-envelope-cpu", "memory-limit", "quota-needs-cpu-limits",
                         "limitrange-needs-cpu-limits", "template-opt-outs"], "off")
    assert mutate_expression(RULES, Policy.model_validate({"rules": off})) == "false"
    only_memory = {k: v for k, v in off.items() if k != "memory-limit"}
    expr = mutate_expression(RULES, Policy.model_validate({"rules": only_memory}))
    assert "memory" in expr and '"cpu"' not in expr and "RESOURCE_LIMITS" not in expr


def test_warn_mode_still_calls_the_webhook() -> None:
    # warn answers a warning: skipping the call would lose it.
    assert mutate_expression(RULES, policy(memory_limit="warn")) == mutate_expression(RULES, Policy())


def test_names_from_the_policy_are_quoted() -> None:
    p = Policy.model_validate({"optOutAnnotation": 'example.com/say-"no"',
                               "envelopeEnv": {"limits": "MY_LIMITS", "requests": "MY_REQUESTS"}})
    expr = mutate_expression(RULES, p)
    assert '"example.com/say-\\"no\\""' in expr
    assert 'e.name == "MY_LIMITS"' in expr


def test_an_unknown_mutate_rule_refuses_generation() -> None:
    @rule("new-mutation", "mutate", WORKLOAD_KINDS, RULES["cpu-limits"].default_mode, "something new")
    def new_mutation(subject, obj, view, policy):  # type: ignore[no-untyped-def]
        return []

    rules = RuleSet([*RULES.values(), *rules_of({"new_mutation": new_mutation})],
                    RULES.copiers, RULES.indexes, RULES.updates)
    with pytest.raises(UnknownRule, match="new-mutation"):
        mutate_expression(rules, Policy())
    # Off, it is not asked about.
    assert mutate_expression(rules, policy(new_mutation="off")) == mutate_expression(RULES, Policy())


def test_cli_prints_a_strategic_merge_patch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook-config"]) == 0
    patch = yaml.safe_load(capsys.readouterr().out)
    assert patch == webhook_config_patch(RULES, Policy())
    hook = patch["webhooks"][0]
    assert hook["name"] == MUTATING_WEBHOOK
    assert hook["matchConditions"][0]["name"] == CONDITION_NAME
    assert main(["webhook-config", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == patch


def test_cli_reads_the_policy_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "policy.yaml"
    config.write_text("optOutAnnotation: example.com/keep\n")
    assert main(["webhook-config", "--config", str(config), "-o", "json"]) == 0
    assert "example.com/keep" in capsys.readouterr().out


# ------------------------------------------------------------------------ the chart

def test_the_mutate_rules_are_the_known_ones() -> None:
    # The chart's template lists the same five rules with their default modes;
    # downward-cpu-limit warns only where cpu-limits strips, so it adds no clause.
    mutate = {rid: r.default_mode.value for rid, r in RULES.items()
              if r.phase == "mutate" and r.kinds & WORKLOAD_KINDS}
    assert mutate == {"cpu-limits": "enforce", "env-envelope-cpu": "enforce", "memory-limit": "enforce",
                      "quota-needs-cpu-limits": "warn", "limitrange-needs-cpu-limits": "warn",
                      "downward-cpu-limit": "warn", "template-opt-outs": "enforce",
                      "memory-below-limit": "enforce"}
    assert set(mutate) == KNOWN_RULES


CHART_POLICIES = [
    {},
    {"rules": {"quota-needs-cpu-limits": "off", "limitrange-needs-cpu-limits": "off"},
     "optOutAnnotation": "example.com/keep-cpu", "envelopeEnv": {"limits": "APP_LIMITS"}},
    {"rules": {"cpu-limits": "warn", "env-envelope-cpu": "off", "limitrange-needs-cpu-limits": "off"}},
    {"rules": dict.fromkeys(KNOWN_RULES, "off")},
    {"defaultMode": "warn"},
    {"defaultMode": "off"},
    {"defaultMode": "off", "rules": {"memory-limit": "warn"}},
    {"defaultMode": "off", "rules": {"quota-needs-cpu-limits": "enforce"}},
    {"memoryBelowLimit": {"namespaces": ["*"]}, "allowObjectExemptions": False},
    {"memoryBelowLimit": {"namespaces": ["x"]}, "rules": {"memory-below-limit": "off"}},
    {"memoryBelowLimit": {"namespaces": ["*"]}, "defaultMode": "off",
     "rules": {"memory-below-limit": "enforce"}},
]


@pytest.mark.parametrize("changes", CHART_POLICIES, ids=range(len(CHART_POLICIES)))
def test_the_chart_renders_the_same_expression(changes: dict) -> None:  # type: ignore[type-arg]
    from tests.helpers.chart import chart_values, deep_merge, render

    policy_values = deep_merge(chart_values()["policy"], changes)
    hook = render({"policy": policy_values}).webhooks()[MUTATING_WEBHOOK]
    expected = mutate_expression(RULES, Policy.model_validate(policy_values))
    assert hook["matchConditions"] == [{"name": CONDITION_NAME, "expression": expected}]


def test_the_chart_leaves_them_out_when_asked_or_too_old() -> None:
    from tests.helpers.chart import CHART, helm, render

    off = render({"webhooks": {"workloads": {"mutate": {"skipCompliant": False}}}})
    assert "matchConditions" not in off.webhooks()[MUTATING_WEBHOOK]
    old = helm("template", "envelope", str(CHART), "--set", "image.local=true", "--kube-version", "1.27.9",
               "--show-only", "templates/webhooks.yaml").stdout
    assert "matchConditions" not in old
    assert "matchConditions" in helm("template", "envelope", str(CHART), "--set", "image.local=true",
                                     "--kube-version",
                                     "1.28.0", "--show-only", "templates/webhooks.yaml").stdout
